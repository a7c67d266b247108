"""An isolated stall step (a one-off wait many times the usual step) is left out of the verdict's
shares; stalls that recur, or a capture too short to tell, stay in (navdoctor/views.py)."""
from navdoctor.analysis import analyze
from navdoctor.rules import load_rules
from kineto_factory import KinetoTrace


def trace(tmp_path, steps: int, stalled: set[int], usual_wait_us: float = 0.0):
    """Compute-bound 10 ms steps; a stalled step first waits 50 ms for the DataLoader, the
    others usual_wait_us."""
    t, ts = KinetoTrace(), 0.0
    for n in range(steps):
        wait = 50_000.0 if n in stalled else usual_wait_us
        t.step(n, ts, wait + 10_000)
        if wait:
            t.dataloader(ts + 10, wait - 20)
        t.launch_kernel("ampere_sgemm_128x64_tn", ts + wait + 10, ts + wait + 20, 9_900)
        ts += wait + 10_000
    return t.write(tmp_path / f"stalls{steps}-{len(stalled)}.json")


def verdict(path):
    return analyze([path], load_rules()).verdict


def test_one_stall_in_five_steps_is_left_out(tmp_path):
    v = verdict(trace(tmp_path, 5, {0}))
    assert v.bound == "compute"
    assert v.per_trace[0].stall_steps == 1 and v.steps == 4
    assert abs(v.step_ms - 10.0) < 0.5
    assert any("isolated stall" in n for n in v.notes)


def test_recurring_stalls_are_the_steady_state(tmp_path):
    v = verdict(trace(tmp_path, 5, {0, 3}))
    assert v.bound == "io" and v.per_trace[0].stall_steps == 0 and v.steps == 5
    assert not any("isolated stall" in n for n in v.notes)


def test_stalls_once_per_round_of_workers_stay_in(tmp_path):
    # 12 DataLoader workers that cannot keep up: the 13th batch waits, and every 12th after
    # it. Rare, but the steady state: leaving them out would hide the data bottleneck.
    v = verdict(trace(tmp_path, 48, {0, 12, 24, 36}))
    assert v.per_trace[0].stall_steps == 0 and v.steps == 48
    assert v.shares["data"] > 0.2


def test_too_few_steps_to_call_a_stall_isolated(tmp_path):
    v = verdict(trace(tmp_path, 3, {0}))
    assert v.bound == "io" and v.per_trace[0].stall_steps == 0 and v.steps == 3


def test_no_stall_no_note(tmp_path):
    v = verdict(trace(tmp_path, 5, set()))
    assert v.bound == "compute" and v.per_trace[0].stall_steps == 0 and v.steps == 5


def test_rules_quote_the_steps_the_verdict_kept(tmp_path):
    # Every step waits 2 ms for its batch, one waits 50 ms: the DataLoader finding describes
    # the usual step (one fetch, the longest 2 ms), not the stall it left out ...
    path = trace(tmp_path, 6, {0}, usual_wait_us=2_000)
    found = {f.rule.id: f for f in analyze([path], load_rules()).findings}
    wait = found["io-dataloader-wait"].metrics
    assert abs(wait["longest_wait_ms"] - 2.0) < 0.1 and wait["waits_per_step"] == 1.0
    # ... and quotes the 50 ms wait when such waits recur, since then they are the steady state.
    path = trace(tmp_path, 6, {0, 3}, usual_wait_us=2_000)
    wait = {f.rule.id: f for f in analyze([path], load_rules()).findings}["io-dataloader-wait"].metrics
    assert wait["longest_wait_ms"] > 40


def test_a_gap_into_a_stall_counts_only_up_to_the_stall(tmp_path):
    # 8 steps that each wait 3 ms for their batch (a 3 ms GPU gap), the fifth waits 50 ms: the
    # gap before its kernel starts in the kept step before it, and only that step's part counts.
    path = trace(tmp_path, 8, {4}, usual_wait_us=3_000)
    a = analyze([path], load_rules())
    assert a.verdict.per_trace[0].stall_steps == 1
    gaps = {f.rule.id: f for f in a.findings}["gpu-idle-gaps"].metrics
    assert gaps["longest_gap_ms"] < 3.5 and gaps["gap_share"] < 0.3
