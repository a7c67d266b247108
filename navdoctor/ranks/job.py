"""The job analysis: every rank analysed as one trace is (its own steps, breakdown, verdict and
findings), then the ranks' steps and collectives merged in one DuckDB store, matched across
ranks, and judged together (docs/distributed.md).

Per-rank work is independent: it runs in a process pool on the local cores (executor.py), and
each rank hands back its verdict, findings and two small Parquet files (its steps and its
collectives); the job store reads those.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import duckdb

from .. import breakdown, engine, store, views
from ..analysis import Analysis, analyze, order_findings
from ..errors import interrupted
from ..loaders.base import LoadResult
from ..rules import Rule
from ..verdict import CLASSES, TraceVerdict, Verdict, class_shares, decide
from .detect import RankInfo

# What a bucket of a straggler's extra time says about it, as a verdict class
# (verdict.class_shares: host work and data loading are io; copies and syncs memory).
BUCKET_CLASS = {"compute": "compute", "data": "io", "host": "io", "copy": "memory",
                "sync": "memory", "launch": "launch", "idle": "none"}
BUCKET_WORDS = {"compute": "its compute", "data": "its data loading", "host": "its host (CPU) work",
                "copy": "its host<->device copies", "sync": "its synchronisation with the GPU",
                "launch": "its kernel launches", "idle": "time it recorded nothing for"}


@dataclass
class RankOutcome:
    """What one rank's analysis hands back (picklable: it crosses process boundaries)."""
    trace_id: int
    rank: int
    info: RankInfo
    load: LoadResult
    verdict: TraceVerdict | None
    findings: list[engine.Finding]
    failures: list[engine.RuleFailure]
    warnings: list[str]
    parquet: dict[str, bytes] = field(default_factory=dict)


# ---- per rank (in a worker) ---------------------------------------------------------------

def _collective_intervals(con: duckdb.DuckDBPyConnection) -> str:
    """The rank's collectives: NCCL/RCCL kernels, and host collectives (gloo, MPI, UCC) that
    Kineto records as CPU ops or as annotations (the same interval twice counts once)."""
    return """
        SELECT DISTINCT start_ns, end_ns, collective_kind(name) AS name, 'kernel' AS kind
            FROM kernels WHERE is_communication
        UNION SELECT start_ns, end_ns, collective_kind(name), 'host' FROM cpu_ops
            WHERE host_collective(name)
        UNION SELECT start_ns, end_ns, collective_kind(name), 'host' FROM nvtx_ranges
            WHERE host_collective(name)"""


def export_rank_tables(con: duckdb.DuckDBPyConnection, out_dir: str, trace_id: int,
                       rank: int) -> None:
    """rank_steps and rank_collectives of this rank as Parquet files in out_dir."""
    coll = _collective_intervals(con)
    con.execute(f"""
        COPY (
            WITH c AS ({coll}),
            o AS (SELECT start_ns AS s, end_ns AS e,
                         max(end_ns) OVER (ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED
                                           PRECEDING AND 1 PRECEDING) AS prev_e FROM c),
            g AS (SELECT s, e, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
                               OVER (ORDER BY s, e) AS grp FROM o),
            merged AS (SELECT min(s) AS s, max(e) AS e FROM g GROUP BY grp)
            SELECT {trace_id}::INTEGER AS trace_id, {rank}::INTEGER AS rank, b.step_num,
                   NULL::INTEGER AS job_step, b.start_ns, b.end_ns, b.step_ns, b.compute_ns,
                   b.comm_ns, b.copy_ns, b.data_ns, b.sync_ns, b.launch_ns, b.host_ns,
                   b.idle_ns,
                   COALESCE((SELECT sum(least(m.e, b.end_ns) - greatest(m.s, b.start_ns))
                             FROM merged m WHERE m.s < b.end_ns AND m.e > b.start_ns),
                            0)::BIGINT AS comm_total_ns,
                   b.step_num IN (SELECT step_num FROM steady_steps) AS steady
            FROM step_breakdown b ORDER BY b.step_num
        ) TO '{os.path.join(out_dir, "rank_steps.parquet")}' (FORMAT parquet)""")
    con.execute(f"""
        COPY (
            WITH c AS ({coll})
            SELECT {trace_id}::INTEGER AS trace_id, {rank}::INTEGER AS rank,
                   (row_number() OVER (ORDER BY start_ns, end_ns, name) - 1)::INTEGER AS seq,
                   name, kind,
                   (SELECT max(st.step_num) FROM steps st
                    WHERE c.start_ns >= st.start_ns AND c.start_ns < st.end_ns) AS step_num,
                   start_ns, end_ns, end_ns - start_ns AS dur_ns
            FROM c ORDER BY seq
        ) TO '{os.path.join(out_dir, "rank_collectives.parquet")}' (FORMAT parquet)""")


def analyse_rank(path: str, info: RankInfo, trace_id: int, rules: list[Rule]) -> RankOutcome:
    """One rank, analysed exactly as one trace is, plus its steps and collectives."""
    with tempfile.TemporaryDirectory(prefix="navdoctor-rank-") as tmp:
        a: Analysis = analyze([info.trace or path], rules,
                              export=lambda con: export_rank_tables(con, tmp, trace_id, info.rank))
        parquet = {name: Path(tmp, f"{name}.parquet").read_bytes()
                   for name in ("rank_steps", "rank_collectives")}
    v = a.verdict.per_trace[0] if a.verdict.per_trace else None
    if v is not None:
        v.trace_id = trace_id
    for f in a.findings:
        f.trace_ids = [trace_id]
    load = a.inputs[0]
    return RankOutcome(trace_id, info.rank, info, load, v, a.findings, a.rule_failures,
                       a.warnings, parquet)


def analyse_rank_task(args: tuple) -> RankOutcome:
    """A pool's task: (path, info, trace_id, rules)."""
    return analyse_rank(*args)


# ---- the job ------------------------------------------------------------------------------

@dataclass
class JobAnalysis:
    analysis: Analysis            # what the one-trace reporters print: the job's verdict,
                                  # job findings then the ranks' own, the ranks as inputs
    job: dict                     # the report's `job` section


def _param(rules: list[Rule], rule_id: str, name: str, default: float) -> float:
    """The job verdict uses the job rules' thresholds (so --set moves both together)."""
    for r in rules:
        if r.id == rule_id and name in r.params:
            return float(r.params[name])
    return default


def _match_steps(con: duckdb.DuckDBPyConnection) -> str:
    """Steps of the ranks that are the same iteration: by step number when every rank has
    it (ProfilerStep#N counts the same loop on every rank), else by the first collective a
    step runs (the sequence of collectives is the job's common clock)."""
    con.execute("""
        UPDATE rank_steps SET job_step = step_num WHERE step_num IN (
            SELECT step_num FROM rank_steps GROUP BY step_num
            HAVING count(DISTINCT rank) = (SELECT count(*) FROM ranks))""")
    if con.execute("SELECT count(*) FROM rank_steps WHERE job_step IS NOT NULL").fetchone()[0]:
        return "step number"
    con.execute("""
        UPDATE rank_steps s SET job_step = f.first_seq
        FROM (SELECT trace_id, step_num, min(seq) AS first_seq FROM rank_collectives
              WHERE step_num IS NOT NULL GROUP BY trace_id, step_num) f
        WHERE s.trace_id = f.trace_id AND s.step_num = f.step_num""")
    con.execute("""
        UPDATE rank_steps SET job_step = NULL WHERE job_step NOT IN (
            SELECT job_step FROM rank_steps WHERE job_step IS NOT NULL GROUP BY job_step
            HAVING count(DISTINCT rank) = (SELECT count(*) FROM ranks))""")
    if con.execute("SELECT count(*) FROM rank_steps WHERE job_step IS NOT NULL").fetchone()[0]:
        return "collective sequence"
    return "none"


def _rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _r(x, nd=4):
    return None if x is None else round(float(x), nd)


def merge_rank_findings(outcomes: list[RankOutcome], primary: int | None) -> list[engine.Finding]:
    """One finding per rule over the ranks: the primary rank's (the straggler's) where it
    fired, else the lowest rank's, naming every rank where it fired. Not ranked."""
    by_rule: dict[str, list[engine.Finding]] = {}
    for o in outcomes:
        for f in o.findings:
            by_rule.setdefault(f.rule.id, []).append(f)
    merged = []
    for fired in by_rule.values():
        chosen = next((f for f in fired if primary in f.trace_ids), fired[0])
        chosen.trace_ids = sorted({t for f in fired for t in f.trace_ids})
        merged.append(chosen)
    return merged


def prepare_job_store(con: duckdb.DuckDBPyConnection, outcomes: list[RankOutcome]) -> str:
    """The job's store as its rules see it (analyze, `rules test`): every rank's steps and
    collectives merged, steps matched across ranks, the views made, the connection locked down.
    Returns how the steps were matched."""
    store.create_schema(con)
    con.execute(breakdown.BREAKDOWN_DDL)
    with tempfile.TemporaryDirectory(prefix="navdoctor-job-") as tmp:
        for o in outcomes:
            con.execute("INSERT INTO ranks VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [o.trace_id, o.rank, o.info.world_size, o.info.backend, o.load.path,
                         o.verdict.bound if o.verdict else "unknown",
                         o.verdict.confidence if o.verdict else 0.0])
            for table, data in o.parquet.items():
                f = os.path.join(tmp, f"{table}-{o.trace_id}.parquet")
                Path(f).write_bytes(data)
                con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet('{f}')")
        matched_by = _match_steps(con)
        views.create_views(con)
        engine.lock_down(con)
    return matched_by


def build_job(outcomes: list[RankOutcome], rules: list[Rule], db_path: str | None,
              progress: Callable[[str], None]) -> JobAnalysis:
    con = store.connect_new(db_path)
    try:
        matched_by = prepare_job_store(con, outcomes)
        progress(f"evaluating {len(rules)} rules over the job")
        evaluation = engine.evaluate_rules(con, rules)
        job_findings = engine.merge_by_rule(evaluation, None)
        summary = (_rows(con, "SELECT * FROM job_summary") or [None])[0]
        ranks = _rows(con, "SELECT * FROM rank_summary ORDER BY rank")
        excess = _rows(con, "SELECT bucket, ns, others_ns, excess_ns FROM rank_excess "
                            "ORDER BY excess_ns DESC")
    except (RuntimeError, duckdb.InterruptException) as e:
        if interrupted(e):
            raise KeyboardInterrupt from None
        raise
    finally:
        con.close()
    return _judge(outcomes, rules, summary, ranks, excess, matched_by, job_findings,
                  evaluation.failures, db_path)


def _judge(outcomes, rules, summary, ranks, excess, matched_by, job_findings, failures,
           db_path) -> JobAnalysis:
    by_tid = {o.trace_id: o for o in outcomes}
    min_last = _param(rules, "job-straggler", "min_last_share", 0.5)
    min_cost = _param(rules, "job-straggler", "min_cost_share", 0.05)
    min_spread = _param(rules, "job-load-imbalance", "min_spread", 0.10)
    notes: list[str] = []
    straggler = None
    if summary and summary["step_ns"]:
        cost_share = (summary["straggler_cost_ns"] or 0) / summary["step_ns"]
        if (summary["straggler_last_share"] or 0) >= min_last and cost_share >= min_cost:
            srank = summary["straggler_rank"]
            so = next(o for o in outcomes if o.rank == srank)
            cause = summary["straggler_cause"]
            own = [f for f in so.findings
                   if f.rule.category == BUCKET_CLASS.get(cause)] or so.findings
            straggler = {
                "rank": srank, "trace_id": so.trace_id,
                "last_share": _r(summary["straggler_last_share"]),
                "cost_ms_per_step": _r(summary["straggler_cost_ms"]),
                "cost_share": _r(cost_share),
                "cause": cause, "cause_class": BUCKET_CLASS.get(cause),
                "cause_ms": _r(summary["straggler_cause_ms"]),
                "others_cause_ms": _r(summary["others_cause_ms"]),
                "cause_excess_ms": _r(summary["straggler_cause_excess_ms"]),
                "bound": so.verdict.bound if so.verdict else "unknown",
                "findings": [f.rule.id for f in own],
                "remedies": [r.model_dump(mode="json") for f in own for r in f.rule.remedies][:8],
                "excess_ms": {e["bucket"]: _r((e["excess_ns"] or 0) / 1e6) for e in excess},
            }
    per_rank = [o.verdict for o in outcomes if o.verdict]
    # The job's shares: the ranks' mean (every rank's step is the job's step, waits included).
    shares = {}
    if per_rank:
        keys = per_rank[0].shares.keys()
        shares = {k: round(sum(v.shares.get(k, 0.0) for v in per_rank) / len(per_rank), 4)
                  for k in keys}
    cls = {k: round(v, 4) for k, v in class_shares(shares).items()} if shares else {}
    has_gpu = any(v.has_gpu for v in per_rank)
    if straggler:
        # The other ranks wait for the straggler: what holds the job back is what makes the
        # straggler late, not the communication the others are charged with.
        bound = straggler["cause_class"] if straggler["cause_class"] in CLASSES \
            else straggler["bound"]
        confidence = round(min(1.0, straggler["last_share"]), 3)
        notes.append(
            f"rank {straggler['rank']} is a straggler: last to arrive at "
            f"{straggler['last_share']:.0%} of the collectives, costing the job "
            f"{straggler['cost_ms_per_step']:.2f} ms per step ({straggler['cost_share']:.0%}); "
            f"cause: {BUCKET_WORDS.get(straggler['cause'], straggler['cause'])} "
            f"({straggler['cause_ms']:.2f} ms per step against {straggler['others_cause_ms']:.2f} "
            f"ms on the other ranks)")
    else:
        bound, confidence = decide(cls, has_gpu, min((v.steps for v in per_rank), default=0)) \
            if cls else ("unknown", 0.0)
    balanced = bool(summary) and straggler is None and \
        (summary["work_spread"] or 0.0) < min_spread
    if summary and balanced:
        notes.append(f"the ranks are balanced: no straggler, and their work per step differs by "
                     f"{summary['work_spread'] or 0:.1%} of the step (under {min_spread:.0%})")
    elif summary and straggler is None:
        notes.append(f"no single straggler, but the ranks' work per step differs by "
                     f"{summary['work_spread']:.0%} of the step (rank {summary['busiest_rank']} "
                     f"{summary['busiest_work_ms']:.2f} ms, rank {summary['idlest_rank']} "
                     f"{summary['idlest_work_ms']:.2f} ms)")
    if not summary:
        notes.append("no steps or collectives matched across the ranks: each rank is "
                     "diagnosed on its own (per_trace), the job cannot be judged")
    world = outcomes[0].info.world_size
    if len(outcomes) < world:
        notes.append(f"{len(outcomes)} of {world} ranks given: stragglers and waits are judged "
                     "among these ranks only")
    primary = straggler["trace_id"] if straggler else (outcomes[0].trace_id if outcomes else None)
    lead = next((v for v in per_rank if v.trace_id == primary), None)
    verdict = Verdict(bound, confidence, shares, cls,
                      _r(summary["step_ms"], 3) if summary else None,
                      summary["steps"] if summary else 0, per_rank, primary, notes=notes,
                      # the primary rank's (the straggler's, else the first's): its kernels
                      compute_headroom=lead.compute_headroom if lead else None)
    # the job's findings first, then the ranks', led by the job verdict's class
    findings = job_findings + order_findings(verdict, merge_rank_findings(outcomes, primary),
                                             compute_may_lead=False)
    warnings = [w for o in outcomes for w in o.warnings]
    rank_failures = [f for o in outcomes for f in o.failures]
    seen = set()
    all_failures = []
    for f in list(failures) + rank_failures:
        if (f.rule_id, f.error) not in seen:
            seen.add((f.rule_id, f.error))
            all_failures.append(f)
    analysis = Analysis([o.load for o in outcomes], verdict, findings, all_failures, len(rules),
                        db_path, warnings)
    job = {
        "ranks": len(outcomes), "world_size": world, "backend": outcomes[0].info.backend,
        "steps_matched_by": matched_by,
        "steps": summary["steps"] if summary else 0,
        "step_ms": _r(summary["step_ms"], 3) if summary else None,
        "step_spread": _r(summary["step_spread"]) if summary else None,
        "work_spread": _r(summary["work_spread"]) if summary else None,
        "collectives_per_step": _r(summary["collectives_per_step"], 2) if summary else None,
        "communication": None if not summary else {
            "total_ms": _r(summary["comm_total_ms"]), "exposed_ms": _r(summary["comm_exposed_ms"]),
            "exposed_share": _r(summary["exposed_share"]),
            "overlapped_share": _r(summary["overlapped_share"]),
            "waiting_ms": _r(summary["exposed_wait_ms"]), "transfer_ms": _r(summary["transfer_ms"])},
        "bound": bound, "balanced": balanced, "straggler": straggler,
        "per_rank": [{
            "rank": r["rank"], "trace_id": r["trace_id"], "path": r["path"], "bound": r["bound"],
            "steps": r["steps"], "step_ms": _r(r["step_ns"] / 1e6, 3),
            "work_ms": _r(r["work_ns"] / 1e6, 3),
            "comm_total_ms": _r(r["comm_total_ns"] / 1e6), "comm_exposed_ms": _r(r["comm_ns"] / 1e6),
            "comm_overlapped_ms": _r(r["comm_overlapped_ns"] / 1e6),
            "wait_ms": _r(r["exposed_wait_ns"] / 1e6), "last_share": _r(r["last_share"]),
            "findings": [f.rule.id for f in by_tid[r["trace_id"]].findings]} for r in ranks],
    }
    return JobAnalysis(analysis, job)
