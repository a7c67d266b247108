"""The JSON report's version and the descriptions of its documented fields: shared by the
plain report (report.py, which builds a report without pydantic where it can) and its
pydantic models (report_models.py, whose JSON Schema is docs/report.schema.json)."""
from __future__ import annotations

from .headroom import DEPTHWISE_SHARE

REPORT_SCHEMA_VERSION = "3.0"   # 3.0: figures from the what-if model (docs/verdict.md, "Predicted speed-ups"): findings[].speedup_expected is the expected speed-up of the finding's best remedy (the step without the finding's time is now speedup_if_removed, a bound), findings[].remedies[] carry whatif, speedup_expected, speedup_range, step_ms_expected and figure_note, remedies the trace shows already on are left out, verdict.whatif, first_remedy; 2.11: verdict.findings_lead (the class whose findings are ranked first); 2.10: verdict.loader_wait.traced_binds (the trace's own wait gives io where the timing runs' does not: a close call); 2.9: verdict.loader_wait.runs_ms and edge (several timing runs; a close call when their waits give different classes); 2.8: findings[].speedup_expected of a finding whose time at stake is one of its class's buckets (io, memory, launch) at most its class's estimated_gain speedup_expected (the step without the tracer's cost); 2.7: verdict.loader_wait (and per_trace[]): the DataLoader wait timed without a tracer; 2.6: verdict.tracer_cost.unprofiled_step_ms (a measured tracer cost per CUDA call; class_by_tracer_cost keyed by the cost in use; tracer_cost for Kineto traces where measured), compute_headroom.depthwise_ms (nothing expected at 18% or more); 2.5: verdict.compute_headroom, verdict.close_call_gains (and per_trace[]), estimated_gain.compute.speedup_expected from the compute headroom; 2.4: verdict.close_to, per_trace[].close_to; 2.3: verdict.class_by_tracer_cost, estimated_gain[].speedup_expected/step_ms_at_least, speedup_up_to a bound from the GPU's own work, findings[].speedup_expected; 2.2: job (multi-rank jobs, optional); 2.1: verdict.tracer_cost, per_trace[].tracer_cost; 1.1: verdict.per_trace[].stall_steps; 1.2: step_source, per_trace[].step_inference; 2.0: buckets comm and host (launch no longer holds host work), memory includes communication, the verdict policy of docs/verdict.md, estimated_gain, findings[].speedup_up_to


COMPUTE_HEADROOM_DOC = (
    "what the standard compute remedies (bf16 autocast, channels_last) are expected to remove "
    "from a step, from the kernels' names (docs/verdict.md, 'Compute headroom'): per step, "
    "kernel_ms, layout_ms (cuDNN layout conversions), fp32_tensor_core_ms (TF32 math), "
    "fp32_cuda_core_ms (fp32 math without tensor cores), half_ms, depthwise_ms (depthwise "
    f"convolutions: at {DEPTHWISE_SHARE:.0%} of kernel_ms or more nothing is expected), saved_ms, and "
    "speedup_expected, the step's speed-up if saved_ms went away; absent without kernels")
CLOSE_CALL_GAINS_DOC = (
    "a close call named by expected gain: class -> the speed-up its remedies are expected to "
    "give (a cause's: the step without its share; compute's: compute_headroom's); the verdict "
    "is the largest (docs/verdict.md, 'Close calls')")
CLASS_BY_TRACER_COST_DOC = ("traces whose class depends on the tracer's cost per CUDA call: ns per "
                            "call -> class (at none, the cost in use - assumed for Nsight Systems, or "
                            "measured where tracer_cost has unprofiled_step_ms, then also 5% either "
                            "way of the unprofiled step - and twice it); absent where all agree "
                            "(docs/verdict.md, 'Tracer cost')")
CLOSE_TO_DOC = ("a close call: the other classes the evidence nearly gives (at another tracer "
                "cost per CUDA call, or with the largest cause of GPU idle time within 7 points of "
                "the 20% line); the confidence is lower and `navdoctor verify` of both classes' "
                "remedies settles it; absent when the verdict is not a close call "
                "(docs/verdict.md, 'Close calls')")
LOADER_WAIT_DOC = ("where the GPU's wait for DataLoader batches was timed without a tracer "
                   "(diagnose's timing pass, analyze --unprofiled-loader-wait-ms; docs/verdict.md, "
                   "'Loader wait') and the trace shows DataLoader fetches: unprofiled_ms (a step), "
                   "traced_ms (the trace's data wait), tracer_ms (the traced wait beyond the "
                   "measured one, at most the traced step's excess over the unprofiled one: "
                   "left out of the class), share (the shorter wait, of the unprofiled step), "
                   "binds (share >= 4.76%, the wait without which the step is 1.05x faster: "
                   "io binds the run), origin ('timing pass' or 'given'), "
                   "runs_ms (where timed in several runs: their least and most wait; else null), "
                   "edge (those two runs' waits give different classes: a close call), "
                   "traced_binds (the trace's own wait, without the measurement, gives io where "
                   "the measured wait does not: a close call naming io); "
                   "absent where not measured")
TRACER_COST_DOC = ("Nsight Systems traces, and torch.profiler traces where it is measured: the "
                   "tracer's own launch time, left out of the class "
                   "(docs/verdict.md, 'Tracer cost'): ns_per_call, cuda_calls_per_step, ms_per_step, "
                   "share (of the traced step), step_ms (the step without it), launch_share_traced, "
                   "launch_share (of the step without it); unprofiled_step_ms where the same run "
                   "was timed without a tracer (diagnose's timing pass, analyze "
                   "--unprofiled-step-ms): ns_per_call is then measured from it, not assumed, and "
                   "torch.profiler traces of GPU runs get the same correction")
