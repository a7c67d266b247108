"""The derived views rules query, by topic (in the manner of Perfetto's SQL standard library):

- steps.py   steady_steps and the *_in_steps views (activity inside the kept steps)
- summary.py trace_summary, unprofiled_step, loader_wait, tracer_cost (one row per trace)
- launch.py  launch_calls (graph replays against eager launches)
- job.py     the multi-rank job views (empty in a one-trace analysis)
- headroom   compute_headroom (navdoctor/headroom.py: what bf16 + channels_last can remove)

Created after the loaders and the breakdown ran; documented in docs/schema.md.
"""
from __future__ import annotations

import duckdb

from ..headroom import create_compute_headroom
from .job import create_or_empty_job_views
from .launch import create_launch_views
from .steps import create_step_views
from .summary import create_summary_views


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """Every view, in the order they read each other."""
    create_or_empty_job_views(con)   # over the rank tables: empty unless this is a job analysis
    create_step_views(con)
    create_summary_views(con)
    create_launch_views(con)
    create_compute_headroom(con)     # what bf16 + channels_last can remove (headroom.py)
