"""Property-based tests of both loaders on generated traces (hypothesis).

Generated Kineto documents (random mixes of kernels, copies, memsets, runtime calls, CPU ops,
annotations, DataLoader waits, ProfilerStep markers, instant and flow events, with random but
valid ts/dur written as JSON integers, decimals or strings, and random junk fields) and nsys
exports (tests/nsys_factory.py, with random tables left out) are analysed, and then:
  - nothing but TraceError is raised, and these valid traces never raise at all;
  - every time column of the store is BIGINT (integer ns) and Kineto's µs decimals arrive
    exact to the ns; every dur_ns >= 0 and end_ns = start_ns + dur_ns;
  - the step_breakdown buckets sum exactly to step_ns, none negative;
  - the verdict's shares sum to 1 (±0.01);
  - the loaded kernels (and copies, steps...) are exactly the generated ones;
  - the built-in rules never fail on them (checked on a drawn sample of the examples, for time).
The number of examples run is printed and asserted; docs/reliability.md records it.
NAVDOCTOR_HYPOTHESIS_EXAMPLES=N runs N random examples per test instead of the fixed set.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from decimal import Decimal

import duckdb
from hypothesis import HealthCheck, given, settings, strategies as st

from navdoctor.analysis import analyze
from navdoctor.errors import TraceError
from navdoctor.rules import load_rules

from nsys_factory import NsysExport

_DEEP = int(os.environ.get("NAVDOCTOR_HYPOTHESIS_EXAMPLES", "0"))
EXAMPLES = _DEEP or 25
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not _DEEP, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RULES = load_rules()

# --------------------------------------------------------------------------- Kineto --

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6)
JUNK = st.dictionaries(TEXT.map(lambda k: "junk_" + k), JSON_VALUE, max_size=2)

KINDS = ["kernel", "memcpy", "memset", "launch", "sync", "cpu_op", "python_function",
         "annotation", "dataloader", "memory", "flow", "metadata", "non_object"]


class Raw:
    """Numbers written into the JSON text exactly as given."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text: str) -> str:
        self.texts.append(text)
        return f"@@RAW{len(self.texts) - 1}@@"

    def dumps(self, obj) -> str:
        s = json.dumps(obj)
        for i, t in enumerate(self.texts):
            s = s.replace(f'"@@RAW{i}@@"', t, 1)
        return s


def us_text(ns: int, style: str) -> str:
    """A ns value as Kineto's µs: '123', '123.456' or the string '"123.456"'."""
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(ns), 1000)
    if style == "int" and frac == 0:
        return f"{sign}{whole}"
    text = f"{sign}{whole}.{frac:03d}"
    return json.dumps(text) if style == "string" else text


@st.composite
def kineto_traces(draw):
    raw = Raw()
    base = draw(st.integers(0, 2_000_000_000_000_000_000))   # ns since the epoch (to 2033)
    style = st.sampled_from(["int", "decimal", "string"])
    cat_case = st.sampled_from([str.lower, str.capitalize, str.upper])
    events, expect = [], Counter()

    def put(ev):
        ev.update(draw(JUNK))
        events.append(ev)

    def x(cat, name, start, dur, pid=1, tid=1, args=None):
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
              "ts": raw(us_text(base + start, draw(style))), "dur": raw(us_text(dur, draw(style)))}
        if args is not None:
            ev["args"] = {**args, **draw(JUNK)}
        put(ev)

    t = 0
    step_nums = draw(st.lists(st.integers(0, 10**6), max_size=4, unique=True))
    annotation_cat = draw(st.sampled_from(["user_annotation", "cpu_op"]))
    for n in sorted(step_nums):
        dur = draw(st.integers(0, 50_000_000))
        x(annotation_cat, f"ProfilerStep#{n}", t, dur)
        t += dur + draw(st.integers(0, 1_000_000))
    expect["steps"] = len(step_nums)
    if annotation_cat == "user_annotation":
        expect["nvtx_ranges"] += len(step_nums)   # record_function ranges, steps included
    span = max(t, 1_000_000)
    corr = 0
    items = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, span),
                                    st.integers(0, 5_000_000), TEXT), min_size=1, max_size=25))
    if not any(k in ("kernel", "cpu_op", "launch") for k, *_ in items):
        items.append(("kernel", 0, 1000, "k"))
    for kind, start, dur, name in items:
        corr += 1
        if kind == "kernel":
            x(draw(cat_case)("kernel"), name or "k", start, dur, pid=0,
              tid=draw(st.sampled_from([7, "stream 7"])),
              args={"device": 0, "stream": 7, "correlation": corr,
                    "grid": [1, 2, 3], "block": [128, 1, 1]})
            expect["kernels"] += 1
            expect.setdefault("kernel_times", [])
            expect["kernel_times"].append((base + start, dur))
        elif kind == "memcpy":
            x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", start, dur, pid=0, tid="stream 7",
              args={"device": 0, "stream": 7, "correlation": corr, "bytes": draw(st.integers(0, 2**40))})
            expect["memcpy"] += 1
        elif kind == "memset":
            x("gpu_memset", "Memset (Device)", start, dur, pid=0, tid="stream 7",
              args={"device": 0, "stream": 7, "correlation": corr, "bytes": 64})
            expect["memset"] += 1
        elif kind == "launch":
            x("cuda_runtime", draw(st.sampled_from(["cudaLaunchKernel", "cuLaunchKernel", "cudaGetDevice"])),
              start, dur, args={"correlation": corr})
            expect["runtime_calls"] += 1
        elif kind == "sync":
            x(draw(st.sampled_from(["cuda_runtime", "cuda_driver"])),
              draw(st.sampled_from(["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy"])),
              start, dur, args={"correlation": corr})
            expect["runtime_calls"] += 1
        elif kind in ("cpu_op", "python_function"):
            x(kind, "aten::" + name, start, dur, args={"Input Dims": [[1, 2]]})
            expect["cpu_ops"] += 1
        elif kind == "annotation":
            x("user_annotation", "my_region_" + name, start, dur)
            expect["nvtx_ranges"] += 1
        elif kind == "dataloader":
            x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, dur)
            expect["dataloader_waits"] += 1
            expect["nvtx_ranges"] += 1
        elif kind == "memory":
            put({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
                 "tid": 1, "ts": raw(us_text(base + start, draw(style))),
                 "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1024, "Total Allocated": 2048,
                          "Total Reserved": 4096}})
        elif kind == "flow":
            put({"ph": draw(st.sampled_from(["s", "f"])), "cat": "ac2g", "id": corr, "pid": 1,
                 "tid": 1, "ts": raw(us_text(base + start, draw(style))), "name": "ac2g"})
        elif kind == "metadata":
            put({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": name}})
        else:
            events.append(draw(st.sampled_from([1, "x", None, [1], True])))
    order = draw(st.permutations(range(len(events))))
    doc = {"schemaVersion": 1, "traceEvents": [events[i] for i in order], **draw(JUNK)}
    if draw(st.booleans()):
        doc["deviceProperties"] = [{"id": 0, "name": "GPU", "numSms": 132, "computeMajor": 9}]
    return raw.dumps(doc), expect, draw(st.sampled_from([False, False, False, True]))


# ---------------------------------------------------------------------------- nsys --

OPTIONAL_TABLES = ["NVTX_EVENTS", "OSRT_API", "ThreadNames", "TARGET_INFO_GPU",
                   "TARGET_INFO_CUDA_DEVICE", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                   "CUPTI_ACTIVITY_KIND_RUNTIME", "CUDA_GPU_MEMORY_USAGE_EVENTS", "META_DATA_EXPORT",
                   "StringIds"]


@st.composite
def nsys_exports(draw):
    x = NsysExport(pid=draw(st.integers(1, 2**22)), tid=draw(st.integers(1, 2**22)))
    omit = draw(st.lists(st.sampled_from(OPTIONAL_TABLES), unique=True, max_size=3))
    expect = Counter()
    t = draw(st.integers(0, 10**12))
    marker = draw(st.sampled_from(["navdoctor.step", "ProfilerStep"]))
    n_steps = draw(st.integers(0, 4))
    first = t
    for n in range(n_steps):
        dur = draw(st.integers(0, 50_000_000))
        x.step(n, t, t + dur, name=marker)
        t += dur + draw(st.integers(0, 1_000_000))
    if "NVTX_EVENTS" not in omit:
        expect["steps"] = n_steps
    span = max(t - first, 1_000_000)
    items = draw(st.lists(st.tuples(
        st.sampled_from(["kernel", "memcpy", "memset", "sync", "osrt", "dataloader", "memory",
                         "nvtx", "thread", "gpu"]),
        st.integers(10_000, span + 10_000), st.integers(0, 5_000_000), TEXT), min_size=1, max_size=25))
    for kind, start, dur, name in items:
        start += first
        if kind == "kernel":
            x.kernel(start, start + dur, "kernel_" + name,
                     launch=draw(st.sampled_from(["cudaLaunchKernel_v7000", "cuLaunchKernel", None])))
            expect["kernels"] += 1
        elif kind == "memcpy":
            x.memcpy(start, start + dur, draw(st.integers(0, 2**40)),
                     draw(st.sampled_from(["HtoD", "DtoH", "DtoD", "HtoH"])),
                     src=draw(st.sampled_from(["pageable", "pinned", "device"])))
            expect["memcpy"] += 1
        elif kind == "memset":
            x.memset(start, start + dur, 64)
            expect["memset"] += 1
        elif kind == "sync":
            x.sync(start, start + dur, draw(st.sampled_from(["event", "stream", "context", "stream_wait"])),
                   record=draw(st.booleans()))
        elif kind == "osrt":
            x.osrt(start, start + dur, draw(st.sampled_from(["read", "futex", "poll", "open"])))
            if "OSRT_API" not in omit:
                expect["os_calls"] += 1
        elif kind == "dataloader":
            x.dataloader_wait(start, start + dur)
        elif kind == "memory":
            x.memory(start, draw(st.integers(1, 2**34)), alloc=draw(st.booleans()))
        elif kind == "nvtx":
            x.nvtx(start, start + dur, "range_" + name, domain=draw(st.sampled_from([None, "mydomain"])),
                   registered=draw(st.booleans()), start_end=draw(st.booleans()))
        elif kind == "thread":
            x.thread_name(draw(st.integers(1, 100)), name or "worker")
        else:
            x.gpu(draw(st.integers(0, 3)), cuda_id=draw(st.sampled_from([0, 1, None])))
    enums = draw(st.sampled_from([("name", "label"), ("name",), ("label",), None]))
    return x, omit, enums, expect, draw(st.sampled_from([False, False, False, True]))


# ------------------------------------------------------------------------ invariants --

TIME_TABLES = ["steps", "kernels", "memcpy", "memset", "runtime_calls", "cpu_ops", "nvtx_ranges",
               "dataloader_waits", "os_calls", "sync_events"]


def check_store(db: str, expect: Counter, a) -> None:
    con = duckdb.connect(db, read_only=True)
    try:
        q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
        # every time is an integer number of ns
        for table, column, dtype in q("SELECT c.table_name, c.column_name, c.data_type "
                                      "FROM information_schema.columns c JOIN information_schema.tables t "
                                      "USING (table_name) WHERE t.table_type = 'BASE TABLE' "
                                      "AND c.column_name LIKE '%\\_ns' ESCAPE '\\'"):
            assert dtype == "BIGINT", (table, column, dtype)
        for table in TIME_TABLES:
            bad = q(f"SELECT count(*) FROM {table} WHERE start_ns IS NULL OR end_ns IS NULL "
                    f"OR dur_ns IS NULL OR dur_ns < 0 OR end_ns - start_ns <> dur_ns")[0][0]
            assert bad == 0, table
            assert all(isinstance(v, int) for row in q(f"SELECT start_ns, end_ns, dur_ns FROM {table}")
                       for v in row)
        # the breakdown partitions every step exactly
        rows = q("SELECT step_ns, compute_ns, copy_ns, data_ns, sync_ns, launch_ns, idle_ns FROM step_breakdown")
        # A trace without step markers gets one step over its GPU work (stepfinder, where it has
        # kernels), else one whole-trace step spanning these tables' rows (breakdown.ensure_steps);
        # with none of them there is no step to break down.
        timed = sum(q(f"SELECT count(*) FROM {t}")[0][0]
                    for t in ("kernels", "memcpy", "runtime_calls", "cpu_ops", "dataloader_waits"))
        assert rows or not timed
        for step_ns, *buckets in rows:
            assert step_ns >= 0 and min(buckets) >= 0, (step_ns, buckets)
            assert sum(buckets) == step_ns, (step_ns, buckets)
        # what was generated is what was loaded
        for table in ("kernels", "memcpy", "memset", "runtime_calls", "cpu_ops", "nvtx_ranges",
                      "dataloader_waits", "os_calls"):
            if table in expect:
                assert q(f"SELECT count(*) FROM {table}")[0][0] == expect[table], table
        if "kernel_times" in expect:
            loaded = sorted(q("SELECT start_ns, dur_ns FROM kernels"))
            for (start, dur), (want_start, want_dur) in zip(loaded, sorted(expect["kernel_times"])):
                assert dur == want_dur
                assert abs(start - want_start) <= ns_tolerance(want_start), (start, want_start)
        if "steps" in expect:
            n = q("SELECT count(*) FROM steps WHERE origin NOT IN ('whole-trace', 'gpu-window') "
                  "AND origin NOT LIKE 'inferred:%'")[0][0]
            assert n == expect["steps"]
        assert q("SELECT count(*) FROM steps")[0][0] >= 1 or not timed
    finally:
        con.close()
    v = a.verdict
    if v.shares:
        assert abs(sum(v.shares.values()) - 1) <= 0.01, v.shares
    for t in v.per_trace:
        if t.steps:
            assert abs(sum(t.shares.values()) - 1) <= 0.01, t.shares


def ns_tolerance(ns: int) -> float:
    """0 below 2**43 µs (101 days of µs timestamps); above, a double's ulp. DuckDB's JSON
    type holds numbers as doubles (yyjson), so µs decimals with more than ~16 significant
    digits lose their last ns digits (docs/reliability.md, "known limits")."""
    us = abs(ns) / 1000
    return 0 if us < 2**43 else math.ulp(us) * 1000 + 1


def run_case(path: str, tmp: str, with_rules: bool):
    db = os.path.join(tmp, "store.duckdb")
    a = analyze([path], RULES if with_rules else [], db)
    assert not a.rule_failures, [f.error for f in a.rule_failures]
    return a, db


def test_kineto_loader_properties():
    seen = Counter()

    @SETTINGS
    @given(kineto_traces())
    def check(case):
        text, expect, with_rules = case
        seen["examples"] += 1
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            try:
                a, db = run_case(path, tmp, with_rules)
            except TraceError as e:  # the only exception allowed, and valid traces never get it
                raise AssertionError(f"valid trace refused: {e}") from None
            check_store(db, expect, a)
        seen["kernels"] += expect["kernels"]
        seen["with_rules"] += with_rules
        seen["generic_path"] += "not event objects" in " ".join(a.warnings)

    check()
    print(f"\nkineto: {dict(seen)}")
    assert seen["examples"] >= EXAMPLES


def test_nsys_loader_properties():
    seen = Counter()

    @SETTINGS
    @given(nsys_exports())
    def check(case):
        x, omit, enums, expect, with_rules = case
        seen["examples"] += 1
        with tempfile.TemporaryDirectory() as tmp:
            path = x.write(os.path.join(tmp, "trace.sqlite"), omit=omit, with_enums=enums is not None,
                           enum_columns=enums or ("name", "label"))
            try:
                a, db = run_case(str(path), tmp, with_rules)
            except TraceError as e:
                raise AssertionError(f"valid export refused: {e}") from None
            check_store(db, expect, a)
        seen["kernels"] += expect["kernels"]
        seen["with_rules"] += with_rules
        seen["tables_left_out"] += len(omit)

    check()
    print(f"\nnsys: {dict(seen)}")
    assert seen["examples"] >= EXAMPLES


def test_us_text_is_exact():
    assert us_text(1_700_000_000_000_123_456, "decimal") == "1700000000000123.456"
    assert us_text(5_000, "int") == "5" and us_text(-1, "string") == '"-0.001"'
    assert Decimal("1700000000000123.456") * 1000 == 1_700_000_000_000_123_456
