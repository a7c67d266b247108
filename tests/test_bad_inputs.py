"""A corpus of bad inputs, each run through the real command line.

Every input must end in either a one-line error (exit 2, `navdoctor: error: <path>: ...`) or
a partial result with a warning, never a traceback or a hang. docs/reliability.md lists the
corpus with what the user sees.

Startup dominates a tiny analysis, so most of the corpus goes through `navdoctor.cli.run()`
(the console entry point) case after case inside two worker processes, with a timeout; a
representative subset also runs as one process per case, exactly as a user's shell would.
"""
from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT
from kineto_factory import KinetoTrace
from nsys_factory import SCHEMA, NsysExport

BASE_US = 1_700_000_000_000.0


def ev(**kw):
    e = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": BASE_US + 10, "dur": 5}
    e.update(kw)
    return e


def step(n=1, ts=0.0, dur=100):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
            "ts": BASE_US + ts, "dur": dur}


def doc(events, **kw) -> str:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **kw})


def nsys_export() -> NsysExport:
    x = NsysExport()
    x.gpu()
    x.step(0, 0, 10_000_000)
    x.step(1, 10_000_000, 20_000_000)
    x.kernel(1_000_000, 3_000_000, "ampere_sgemm_128x64_tn")
    x.memcpy(4_000_000, 5_000_000, 1 << 20)
    x.sync(6_000_000, 7_000_000)
    x.osrt(8_000_000, 9_000_000, "read")
    x.thread_name(4242, "main")
    return x


def _kernel_row(start, end, name_id=1):
    return dict(start=start, end=end, deviceId=0, contextId=1, streamId=7, demangledName=name_id,
                shortName=name_id, registersPerThread=0, gridX=1, gridY=1, gridZ=1, blockX=1,
                blockY=1, blockZ=1, staticSharedMemory=0, dynamicSharedMemory=0,
                localMemoryPerThread=0, localMemoryTotal=0, gridId=0)


def build_corpus(d: Path) -> dict[str, Path]:
    """name -> path of each bad input (small files, written here)."""
    out: dict[str, Path] = {}

    def w(name, data):
        p = d / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        out[name] = p

    # Not JSON, not a trace, not what the name says
    w("truncated.json", doc([step(), ev()])[:-20])
    w("truncated.json.gz", gzip.compress(doc([step(), ev()]).encode())[:-30])
    big = gzip.compress(doc([step(), ev()] * 2000).encode())
    w("corrupt_middle.json.gz", big[:200] + bytes(b ^ 0x55 for b in big[200:400]) + big[400:])
    w("not_a_trace_object.json", json.dumps({"hello": "world"}))
    w("not_a_trace_array.json", json.dumps([1, 2, 3]))
    w("not_a_trace_string.json", json.dumps("a string"))
    w("traceEvents_object.json", json.dumps({"traceEvents": {"a": 1}}))
    w("traceEvents_null.json", json.dumps({"traceEvents": None}))
    w("duplicate_traceEvents.json", '{"traceEvents": [], "traceEvents": [' + json.dumps(step()) + "]}")
    w("not_gzip.json.gz", b"\x1f\x8b\x08\x00garbage, not deflate data")
    w("gzip_of_text.json.gz", gzip.compress(b"this is not json"))
    w("empty_traceEvents.json", doc([]))
    w("only_nulls.json", doc([None, None]))
    w("empty.json", b"")
    w("whitespace.json", b"   \n  ")
    w("bad_utf8.json", doc([step(), ev(name="PLACEHOLDER")]).encode().replace(b"PLACEHOLDER", b"k\xff\xfe\xc3("))
    # Events with missing or odd fields: loaded, the unusable ones skipped with a warning
    w("no_dur.json", doc([step(), ev(dur=None), {k: v for k, v in ev().items() if k != "dur"}, ev()]))
    w("negative_dur.json", doc([step(), ev(dur=-5), ev()]))
    w("string_ts.json", doc([step(), ev(ts=str(BASE_US + 10)), ev(ts="yesterday"), ev()]))
    w("huge_ints.json", doc([step(), ev(ts=10**30), ev(dur=10**30), ev(pid=10**30, tid=-10**30),
                             ev(args={"correlation": 10**40, "bytes": 10**50}), ev()]))
    w("ts_near_int64_max.json", doc([step(), ev(ts=9.2e15, dur=9.2e15), ev()]))
    w("nan_infinity.json", '{"traceEvents": [' + json.dumps(step()) + ', ' + json.dumps(ev())
      + ', {"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":NaN,"dur":Infinity}]}')
    w("non_object_events.json", doc([step(), 1, "x", None, [1, 2], True, ev()]))
    w("name_is_object.json", doc([step(), ev(name={"a": 1}), ev(name=[1]), ev(name=5), ev()]))
    w("args_not_object.json", doc([step(), ev(args=[1, 2]), ev(args="x"), ev(args=5), ev()]))
    w("pid_float.json", doc([step(), ev(pid=1.5, tid=2.7), ev(pid="stream x"), ev()]))
    w("cat_and_ph_odd.json", doc([step(), ev(cat=None), ev(cat=5), ev(ph=3), ev()]))
    w("deep_nesting.json", '{"traceEvents": [' + json.dumps(step()) + ', ' + json.dumps(ev())
      + ', {"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"args":' + "[" * 5000 + "]" * 5000 + "}]}")
    w("deviceProperties_odd.json", doc([step(), ev()], deviceProperties=[1, "x", {"id": "zero", "numSms": "many"}]))
    w("bom.json", b"\xef\xbb\xbf" + doc([step(), ev()]).encode())
    w("only_metadata.json", doc([{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                                  "args": {"name": "main"}}]))
    # Valid but thin traces
    t = KinetoTrace()
    t.step(1, 0, 100)
    t.op("aten::mm", 10, 50)
    t.step(2, 100, 100)
    t.op("aten::mm", 110, 50)
    out["cpu_only.json"] = Path(t.write(d / "cpu_only.json"))
    t = KinetoTrace()
    t.launch_kernel("ampere_sgemm_128x64_tn", 10, 20, 30)
    t.launch_kernel("vectorized_elementwise_kernel", 60, 70, 30)
    out["no_steps.json"] = Path(t.write(d / "no_steps.json"))
    # SQLite that is not an nsys export, or not SQLite at all
    p = d / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    out["other.sqlite"] = p
    w("corrupt.sqlite", b"SQLite format 3\x00" + b"\x00garbage" * 100)
    # nsys exports with tables missing (nsys creates tables lazily) or odd values
    for name, omit in [("nsys_no_StringIds", ["StringIds"]),
                       ("nsys_no_kernels", ["CUPTI_ACTIVITY_KIND_KERNEL"]),
                       ("nsys_no_runtime", ["CUPTI_ACTIVITY_KIND_RUNTIME"]),
                       ("nsys_no_NVTX", ["NVTX_EVENTS"]),
                       ("nsys_no_ENUM_tables", [t for t in ("ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND",
                                                            "ENUM_NSYS_EVENT_TYPE", "ENUM_CUPTI_SYNC_TYPE",
                                                            "ENUM_NSYS_EVENT_CLASS")]),
                       ("nsys_only_metadata", [t for t in SCHEMA if t != "META_DATA_EXPORT"])]:
        out[name + ".sqlite"] = nsys_export().write(d / (name + ".sqlite"), omit=omit)
    x = nsys_export()
    x.add("CUPTI_ACTIVITY_KIND_KERNEL", **_kernel_row("abc", "def", 999))   # text, unknown name id
    x.add("CUPTI_ACTIVITY_KIND_KERNEL", **_kernel_row(5_000_000, 1_000_000))  # ends before it starts
    out["nsys_odd_values.sqlite"] = x.write(d / "nsys_odd_values.sqlite")
    data = gzip.compress(nsys_export().write(d / "tmp.sqlite").read_bytes())
    (d / "tmp.sqlite").unlink()
    w("nsys_truncated.sqlite.gz", data[: len(data) // 2])
    w("fake.nsys-rep", b"\x00\x01 binary junk")
    # Not files
    (d / "a_directory").mkdir()
    out["a_directory"] = d / "a_directory"
    out["missing.json"] = d / "missing.json"
    os.mkfifo(d / "fifo.json")
    out["fifo.json"] = d / "fifo.json"
    return out


# name -> ("error", text in the one-line error) or ("ok", texts that the warnings must hold)
EXPECT: dict[str, tuple[str, list[str] | str]] = {
    "truncated.json": ("error", "truncated or malformed JSON"),
    "truncated.json.gz": ("error", "truncated or malformed JSON"),
    "corrupt_middle.json.gz": ("error", "malformed JSON"),
    "not_a_trace_object.json": ("error", "JSON has no 'traceEvents' list"),
    "not_a_trace_array.json": ("error", "JSON has no 'traceEvents' list (top level is an array)"),
    "not_a_trace_string.json": ("error", "unrecognised content"),
    "traceEvents_object.json": ("error", "'traceEvents' is not a list"),
    "traceEvents_null.json": ("error", "JSON has no 'traceEvents' list"),
    "duplicate_traceEvents.json": ("error", "duplicate key \"traceEvents\""),
    "not_gzip.json.gz": ("error", "gzip data is corrupt"),
    "gzip_of_text.json.gz": ("error", "unrecognised content"),
    "empty_traceEvents.json": ("error", "trace is empty"),
    "only_nulls.json": ("error", "trace is empty"),
    "empty.json": ("error", "file is empty"),
    "whitespace.json": ("error", "unrecognised content"),
    "bad_utf8.json": ("error", "invalid UTF-8"),
    "no_dur.json": ("ok", ["2 complete events with a missing or negative 'dur' were skipped"]),
    "negative_dur.json": ("ok", ["1 complete events with a missing or negative 'dur' were skipped"]),
    "string_ts.json": ("ok", ["1 events without a usable 'ts' were skipped"]),
    "huge_ints.json": ("ok", ["1 events without a usable 'ts' were skipped",
                              "1 complete events with a missing or negative 'dur' were skipped"]),
    "ts_near_int64_max.json": ("ok", ["1 events without a usable 'ts' were skipped"]),
    "nan_infinity.json": ("ok", ["1 events without a usable 'ts' were skipped"]),
    "non_object_events.json": ("ok", ["5 entries of 'traceEvents' that are not event objects were skipped"]),
    "name_is_object.json": ("ok", []),
    "args_not_object.json": ("ok", []),
    "pid_float.json": ("ok", []),
    "cat_and_ph_odd.json": ("ok", []),
    "deep_nesting.json": ("ok", []),
    "deviceProperties_odd.json": ("ok", []),
    "bom.json": ("ok", []),
    "only_metadata.json": ("ok", ["no GPU activity", "nothing to time"]),
    "cpu_only.json": ("ok", ["no GPU activity in this trace (CPU-only profile)"]),
    "no_steps.json": ("ok", ["no step markers and too little GPU work for a repeating structure: the GPU-active span (2 GPU operations) was analysed as one step"]),
    "other.sqlite": ("error", "SQLite file is not an Nsight Systems export"),
    "corrupt.sqlite": ("error", "corrupt or unreadable SQLite file"),
    "nsys_no_StringIds.sqlite": ("ok", ["no StringIds table"]),
    "nsys_no_kernels.sqlite": ("ok", ["no CUDA kernels in this export"]),
    "nsys_no_runtime.sqlite": ("ok", ["no CUDA API calls in this export"]),
    "nsys_no_NVTX.sqlite": ("ok", ["no NVTX_EVENTS table", "no step markers"]),
    "nsys_no_ENUM_tables.sqlite": ("ok", []),
    "nsys_only_metadata.sqlite": ("ok", ["no StringIds table", "no CUDA kernels", "no CUDA API calls",
                                         "no NVTX_EVENTS table", "nothing to time"]),
    "nsys_odd_values.sqlite": ("ok", ["2 kernels without usable start/end times were skipped"]),
    "nsys_truncated.sqlite.gz": ("error", "gzip data is corrupt"),
    "fake.nsys-rep": ("error", "needs the Nsight Systems CLI"),
    "a_directory": ("error", "is a directory, not a trace file"),
    "missing.json": ("error", "no such file"),
    "fifo.json": ("error", "not a regular file"),
}

# Run one process per case, as a user's shell would (the rest run in the batch workers).
SUBPROCESS_CASES = ["truncated.json", "not_gzip.json.gz", "huge_ints.json", "other.sqlite",
                    "nsys_no_kernels.sqlite", "a_directory", "cpu_only.json"]

# Runs navdoctor.cli.run() for each argv read from stdin, in this one process.
_BATCH = r"""
import contextlib, io, json, sys
from navdoctor import cli
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["navdoctor"] + argv
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.run()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:
            import traceback
            traceback.print_exc()
            code = -1
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
sys.__stdout__.write(json.dumps(results))
"""


def _run_batch(argvs: list[list[str]], timeout: float) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _BATCH], input=json.dumps(argvs), capture_output=True,
                       text=True, timeout=timeout, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-inputs")
    return build_corpus(d), d


@pytest.fixture(scope="module")
def results(corpus):
    """Every case through cli.run() (two worker processes), and the subset as processes."""
    paths, d = corpus
    names = sorted(paths)
    assert set(names) == set(EXPECT)

    def argv(name):
        return ["analyze", str(paths[name]), "--json", str(d / f"{name}.report.json")]

    halves = [names[0::2], names[1::2]]
    with ThreadPoolExecutor(4) as ex:
        batches = [ex.submit(_run_batch, [argv(n) for n in half], 240) for half in halves]
        procs = {n: ex.submit(subprocess.run, [sys.executable, "-m", "navdoctor.cli", *argv(n)],
                              capture_output=True, text=True, timeout=120, cwd=d,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
                 for n in SUBPROCESS_CASES}
        out = {}
        for half, fut in zip(halves, batches):
            out.update({n: r for n, r in zip(half, fut.result())})
        proc_out = {n: f.result() for n, f in procs.items()}
    return out, proc_out


def _check(name, code, stdout, stderr, paths, d):
    kind, expect = EXPECT[name]
    path = str(paths[name])
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    messages = [l for l in lines if l.startswith("navdoctor: error")]
    if kind == "error":
        assert code == 2, (name, code, stderr)
        assert len(messages) == 1 and lines[-1] == messages[0], stderr
        assert messages[0].startswith(f"navdoctor: error: {path}: "), messages[0]
        assert expect in messages[0], messages[0]
        assert not (d / f"{name}.report.json").exists()   # no report from a failed run
        return messages[0]
    assert code == 0, (name, code, stderr)
    assert messages == [], messages
    report = json.loads((d / f"{name}.report.json").read_text())
    for text in expect:
        assert any(text in w for w in report["warnings"]), (name, report["warnings"])
        assert any(text in line for line in stdout.splitlines() if line.startswith("warning: "))
    v = report["verdict"]
    if v["steps"]:
        assert abs(sum(v["shares"].values()) - 1) <= 0.01
    return report["warnings"]


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_bad_input(name, corpus, results):
    paths, d = corpus
    r = results[0][name]
    _check(name, r["code"], r["stdout"], r["stderr"], paths, d)


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_as_a_process(name, corpus, results):
    paths, d = corpus
    r = results[1][name]
    _check(name, r.returncode, r.stdout, r.stderr, paths, d)


def test_one_bad_trace_among_good_ones_is_named(cli, corpus):
    paths, _ = corpus
    r = cli("analyze", paths["cpu_only.json"], paths["truncated.json"], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"navdoctor: error: {paths['truncated.json']}: truncated or malformed JSON" in r.stderr


def test_unreadable_file(cli, tmp_path, monkeypatch, capsys):
    """chmod 000. Root reads such a file anyway (these tests may run as root), so there the
    refusal is simulated in-process: os.access says no (the check before reading), or the
    check passes and opening fails (the file changed in between)."""
    p = tmp_path / "locked.json"
    p.write_text(doc([step(), ev()]))
    p.chmod(0)
    if os.geteuid() != 0:
        r = cli("analyze", p, timeout=60)
        assert r.returncode == 2 and r.stderr.strip() == f"navdoctor: error: {p}: permission denied"
        return
    from navdoctor import analysis, cli as cli_mod

    def run():
        monkeypatch.setattr(sys, "argv", ["navdoctor", "analyze", str(p)])
        with pytest.raises(SystemExit) as e:
            cli_mod.run()
        return e.value.code, capsys.readouterr().err

    real_access, real_open = os.access, open
    monkeypatch.setattr(os, "access", lambda f, m, *a, **k: False if str(f) == str(p) else real_access(f, m, *a, **k))
    code, err = run()
    assert code == 2 and err.strip() == f"navdoctor: error: {p}: permission denied"
    monkeypatch.setattr(os, "access", real_access)

    def no_open(f, *a, **k):
        if str(f) == str(p):
            raise PermissionError(13, "Permission denied", str(p))
        return real_open(f, *a, **k)
    monkeypatch.setattr("builtins.open", no_open)
    code, err = run()
    assert code == 2 and err.strip().splitlines()[-1] == f"navdoctor: error: {p}: cannot read: Permission denied"
    assert "Traceback" not in err
    assert analysis  # (imported for the patch targets above)
