"""`navdoctor verify`: prove that a remedy helps by running the script with and without it.

    remedies.py  the remedies navdoctor can apply without editing the script, and the patches
                 that apply them inside the child process
    runner.py    the child: patches, runs the script as `python SCRIPT ARGS` would, times steps
    stats.py     hierarchical bootstrap of the speedup and the noise-aware verdict
    command.py   the parent: interleaved runs, results, terminal table and JSON
"""
from __future__ import annotations

VERIFY_SCHEMA_VERSION = "1.4"  # 1.4: results[].estimate.step_ms, step_ms_measured, baseline_moved; 1.3: the class details' close_to and loader_waits_ms (--classify); 1.2: results[].estimate (diagnose --verify); 1.1: priming_runs (settings and top level); additive
