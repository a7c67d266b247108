"""One row per trace: trace_summary (the step and its buckets' shares), the step timed without
a tracer (unprofiled_step), the DataLoader wait against it (loader_wait) and the tracer's own
cost (tracer_cost)."""
from __future__ import annotations

import duckdb

# What Nsight Systems' CUDA API tracing costs the host per recorded CUDA call, at least: the
# traced step minus the unprofiled step (the script's own meters, same machine and day),
# divided by the CUDA calls per step, was 7.0 us (torchvision train.py, ResNet-50, 12 workers:
# 48.3 vs 38.2 ms, 1443 calls) and 12.4 us (ultralytics YOLO stream: 16.4 vs 8.2 ms, 657
# calls) on the H200 host with nsys 2025.3.1; 5 us stays under both, so that the correction
# removes less than the tracer cost there (docs/verdict.md, "Tracer cost"; the mixed corpus
# of docs/accuracy.md, "Tracer cost", shows how much it varies).
NSYS_NS_PER_CUDA_CALL = 5_000


def create_summary_views(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        CREATE OR REPLACE VIEW trace_summary AS
        SELECT b.trace_id, any_value(b.source) AS source, count(*) AS steps,
               avg(b.step_ns) AS step_ns, avg(b.step_ns) / 1e6 AS step_ms,
               bool_or(b.has_gpu) AS has_gpu,
               any_value(st.origin) AS step_origin,
               avg(compute_ns) AS compute_ns, avg(comm_ns) AS comm_ns, avg(copy_ns) AS copy_ns,
               avg(data_ns) AS data_ns, avg(sync_ns) AS sync_ns, avg(launch_ns) AS launch_ns,
               avg(host_ns) AS host_ns, avg(idle_ns) AS idle_ns,
               sum(compute_ns) / sum(b.step_ns) AS compute_share,
               sum(comm_ns) / sum(b.step_ns) AS comm_share,
               sum(copy_ns) / sum(b.step_ns) AS copy_share,
               sum(data_ns) / sum(b.step_ns) AS data_share,
               sum(sync_ns) / sum(b.step_ns) AS sync_share,
               sum(launch_ns) / sum(b.step_ns) AS launch_share,
               sum(host_ns) / sum(b.step_ns) AS host_share,
               sum(idle_ns) / sum(b.step_ns) AS idle_share,
               any_value(st.steps_seen) - count(*) AS stall_steps
        FROM step_breakdown b JOIN steady_steps st USING (trace_id, step_num)
        GROUP BY b.trace_id""")
    # The step (and DataLoader wait) timed without a tracer, one row per trace where given
    # (unprofiled_steps has one row per input; were there several, one whole row is taken, one
    # with a wait first).
    con.execute("""
        CREATE OR REPLACE VIEW unprofiled_step AS
        SELECT DISTINCT ON (trace_id) trace_id, step_ns, loader_wait_ns, origin,
               loader_wait_low_ns, loader_wait_high_ns
        FROM unprofiled_steps ORDER BY trace_id, loader_wait_ns IS NULL""")
    # The DataLoader wait timed without a tracer, against the trace's (docs/verdict.md, "Loader
    # wait"), where it was measured and the trace shows DataLoader fetches in its steps: the
    # traced wait beyond the measured one is the tracer's (tracer_ns), at most all of the
    # traced step's excess over the unprofiled one; share is the shorter of the two waits
    # over the unprofiled step (store macros loader_tracer_ns, loader_wait_share; low_/high_:
    # the same for the least and the most of several timing runs, NULL for one run). The
    # verdict, tracer_cost and the rules (io-dataloader-wait, compute-gpu-bound,
    # gpu-idle-gaps) read this one formula.
    con.execute("""
        CREATE OR REPLACE VIEW loader_wait AS
        SELECT s.trace_id, u.loader_wait_ns AS unprofiled_wait_ns,
               u.step_ns AS unprofiled_step_ns, u.origin, s.data_ns AS traced_wait_ns,
               loader_tracer_ns(u.loader_wait_ns, s.data_ns, s.step_ns, u.step_ns) AS tracer_ns,
               loader_wait_share(u.loader_wait_ns, s.data_ns, u.step_ns) AS share,
               u.loader_wait_low_ns AS unprofiled_low_ns, u.loader_wait_high_ns AS unprofiled_high_ns,
               loader_tracer_ns(u.loader_wait_low_ns, s.data_ns, s.step_ns, u.step_ns) AS low_tracer_ns,
               loader_wait_share(u.loader_wait_low_ns, s.data_ns, u.step_ns) AS low_share,
               loader_tracer_ns(u.loader_wait_high_ns, s.data_ns, s.step_ns, u.step_ns) AS high_tracer_ns,
               loader_wait_share(u.loader_wait_high_ns, s.data_ns, u.step_ns) AS high_share
        FROM trace_summary s JOIN unprofiled_step u USING (trace_id)
        WHERE s.has_gpu AND s.steps > 0 AND u.loader_wait_ns IS NOT NULL
          AND s.trace_id IN (SELECT DISTINCT trace_id FROM dataloader_waits_in_steps)""")
    # The Nsight Systems tracer's own cost per steady step (docs/verdict.md, "Tracer cost"):
    # the verdict and the compute-gpu-bound rule take the same time out of the same step.
    # tracer_ns is the calls' cost, at most the launch time (the only time that can hold it:
    # where the GPU is busy the tracer's cost is hidden).
    # The cost per call is NSYS_NS_PER_CUDA_CALL unless the step was also timed without a
    # tracer (unprofiled_steps): then it is measured, (traced step - unprofiled step) / calls
    # per step, at least 0, and Kineto traces get a row too (torch.profiler's cost, measured;
    # never assumed: it varies with what the profiler records). The tracer's part of the
    # loader's wait (loader_wait.tracer_ns, loader_tracer_ns here) is left out of that
    # difference: it is the loader's, not the calls'.
    con.execute(f"""
        CREATE OR REPLACE VIEW tracer_cost AS
        WITH calls AS (SELECT trace_id, count(*) AS n FROM runtime_calls_in_steps
                       GROUP BY trace_id),
        costs AS (
            SELECT s.trace_id, s.launch_ns, c.n / s.steps AS cuda_calls_per_step,
                   u.step_ns AS unprofiled_step_ns, coalesce(l.tracer_ns, 0) AS loader_tracer_ns,
                   CAST(CASE WHEN u.step_ns IS NULL THEN {NSYS_NS_PER_CUDA_CALL}
                             ELSE greatest(0, (s.step_ns - u.step_ns - coalesce(l.tracer_ns, 0))
                                              / (c.n / s.steps)) END
                        AS BIGINT) AS ns_per_call
            FROM trace_summary s JOIN calls c USING (trace_id)
            LEFT JOIN unprofiled_step u USING (trace_id)
            LEFT JOIN loader_wait l USING (trace_id)
            WHERE (s.source = 'nsys' OR u.step_ns IS NOT NULL) AND s.steps > 0)
        SELECT trace_id, cuda_calls_per_step, ns_per_call,
               least(launch_ns, cuda_calls_per_step * ns_per_call) AS tracer_ns,
               unprofiled_step_ns, loader_tracer_ns
        FROM costs""")
