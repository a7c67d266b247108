"""No data is lost: run directories are never reused, reports are written atomically, and a
failed analysis keeps what `diagnose` captured (and says where it is)."""
from __future__ import annotations

import datetime
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, sigint_as_in_a_terminal
from navdoctor import report as report_mod
from navdoctor.collect import diagnose as diagnose_mod
from navdoctor.errors import NavdoctorError

# An earlier report at the --json path: navdoctor may replace it, but an interrupted write
# must leave it whole. (A file that is not a report is never replaced at all.)
OLD_REPORT = '{"schema_version": "1.0", "tool": "navdoctor 0.1.0", "old": true}\n'

SCRIPT = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
""")


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2030, 1, 2, 3, 4, 5)


def test_new_run_dir_never_reuses_a_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(diagnose_mod.datetime, "datetime", FixedClock)
    taken = tmp_path / "20300102-030405-loop"
    taken.mkdir()
    (taken / "report.json").write_text("EARLIER RUN")
    first = diagnose_mod.new_run_dir(str(tmp_path), "loop")
    second = diagnose_mod.new_run_dir(str(tmp_path), "loop")
    assert (first.name, second.name) == ("20300102-030405-loop-1", "20300102-030405-loop-2")
    assert (taken / "report.json").read_text() == "EARLIER RUN"
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []
    # A file where the next name would be is not replaced either.
    (tmp_path / "20300102-030405-loop-3").write_text("A FILE")
    assert diagnose_mod.new_run_dir(str(tmp_path), "loop").name == "20300102-030405-loop-4"
    assert (tmp_path / "20300102-030405-loop-3").read_text() == "A FILE"


def test_new_run_dir_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(diagnose_mod.datetime, "datetime", FixedClock)
    for n in range(1000):
        (tmp_path / ("20300102-030405-x" + (f"-{n}" if n else ""))).mkdir()
    with pytest.raises(NavdoctorError, match="cannot create a new run directory"):
        diagnose_mod.new_run_dir(str(tmp_path), "x")
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("keep me")
    with pytest.raises(NavdoctorError, match="cannot create a run directory here"):
        diagnose_mod.new_run_dir(str(a_file), "x")
    assert a_file.read_text() == "keep me"


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".navdoctor-"))


@pytest.mark.parametrize("fail_in", ["fsync", "replace"])
def test_write_atomic_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch, fail_in):
    target = tmp_path / "report.json"
    target.write_text(OLD_REPORT)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod.os, fail_in, boom)
    with pytest.raises(KeyboardInterrupt):
        report_mod.write_atomic(str(target), '{"new": "report"}' * 1000)
    monkeypatch.undo()
    assert target.read_text() == OLD_REPORT
    assert _leftovers(tmp_path) == []


def test_write_atomic_disk_full_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "new.json"

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_mod.os, "fsync", full)
    with pytest.raises(NavdoctorError, match=f"{target}: cannot write: No space left on device"):
        report_mod.write_atomic(str(target), "x" * 100_000)
    monkeypatch.undo()
    assert not target.exists() and _leftovers(tmp_path) == []


def test_write_atomic_gives_normal_permissions(tmp_path):
    target = tmp_path / "r.json"
    report_mod.write_atomic(str(target), "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    assert target.read_text() == "{}"


def test_analyze_json_interrupted_in_process_keeps_the_old_file(tmp_path, monkeypatch, capsys):
    """`analyze --json PATH` goes through write_atomic: Ctrl-C at the rename leaves PATH as it
    was (exit 130), with no temp file beside it."""
    from navdoctor import cli
    out = tmp_path / "r.json"
    out.write_text(OLD_REPORT)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod.os, "replace", interrupted)
    monkeypatch.setattr(sys, "argv", ["navdoctor", "analyze", str(FIXTURES / "cpu" / "train_steps.json.gz"),
                                      "--json", str(out), "-q"])
    with pytest.raises(SystemExit) as e:
        cli.run()
    err = capsys.readouterr().err
    assert e.value.code == 130 and ("navdoctor: aborted" in err or "navdoctor: interrupted" in err)
    assert out.read_text() == OLD_REPORT and _leftovers(tmp_path) == []


def test_analyze_json_sigint_never_leaves_a_partial_report(tmp_path):
    """The real command, stopped by SIGINT while it loads or evaluates: exit 130 (DuckDB
    reports a Ctrl-C inside a query as RuntimeError('Query interrupted'), which used to end
    as 'navdoctor: error: RuntimeError ...', exit 2), PATH holds the old content or a
    complete report, nothing in between, and no temp file is left."""
    out = tmp_path / "r.json"
    out.write_text(OLD_REPORT)
    trace = FIXTURES / "gpu" / "io_jpeg_decode" / "kineto.json.gz"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for delay in (0.6, 1.8):
        p = subprocess.Popen([sys.executable, "-m", "navdoctor.cli", "analyze", str(trace), "--json",
                              str(out), "-q"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=sigint_as_in_a_terminal)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert "Traceback" not in err
        text = out.read_text()
        assert p.returncode in (130, 0, -signal.SIGINT), err  # 0: it had finished already
        if p.returncode == 130:
            assert err.strip().splitlines()[-1] in ("navdoctor: aborted", "navdoctor: interrupted")
        assert text == OLD_REPORT or json.loads(text)["schema_version"] == report_mod.REPORT_SCHEMA_VERSION
        assert _leftovers(tmp_path) == []


def test_failed_analysis_keeps_the_capture_and_names_the_run_dir(tmp_path, monkeypatch, capfd):
    """If the analysis fails after `diagnose` captured the script, the run directory and its
    trace stay, no report is written, and the one-line error says where the capture is.
    A run directory with the same name already there is left alone."""
    from navdoctor import analysis, cli
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    runs = tmp_path / "runs"
    runs.mkdir()
    # Whatever second the run starts in, its first-choice name is taken by an earlier run.
    now = datetime.datetime.now()
    earlier = []
    for s in range(0, 240):
        d = runs / f"{(now + datetime.timedelta(seconds=s)).strftime('%Y%m%d-%H%M%S')}-loop"
        d.mkdir(exist_ok=True)
        (d / "report.json").write_text("EARLIER RUN")
        earlier.append(d)

    def broken(*a, **k):
        raise RuntimeError("boom in the analysis")

    monkeypatch.setattr(analysis, "analyze", broken)
    monkeypatch.setattr(sys, "argv", ["navdoctor", "diagnose", "--out", str(runs), "--no-nsys",
                                      "--wait", "0", "--warmup", "0", "--steps", "2", str(script)])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.run()
    err = capfd.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    new = [d for d in runs.iterdir() if d not in earlier]
    assert len(new) == 1 and new[0].name.endswith("-loop-1")
    run_dir = new[0]
    last = err.strip().splitlines()[-1]
    assert last == (f"navdoctor: error: analysis failed; the captured traces are kept in {run_dir} "
                    "(RuntimeError: boom in the analysis)")
    assert (run_dir / "kineto.json.gz").stat().st_size > 0 and (run_dir / "torch-pass.log").exists()
    assert not (run_dir / "report.json").exists()
    assert all((d / "report.json").read_text() == "EARLIER RUN" for d in earlier)
    # What was kept is a usable trace.
    monkeypatch.undo()
    a = analysis.analyze([str(run_dir / "kineto.json.gz")], [])
    assert a.verdict.steps == 2


def test_ctrl_c_during_the_commands_imports_is_one_line(tmp_path):
    """A Ctrl-C that lands while the command still imports its modules (~0.15 s, longer on a
    loaded machine; before run() handles it) ends as every later one does: one line, exit 130,
    no traceback. The SIGINT is sent from inside the import of click, so it lands there."""
    code = textwrap.dedent("""
        import builtins, os, signal
        real_import = builtins.__import__
        def hooked(name, *args, **kwargs):
            if name == "click":
                os.kill(os.getpid(), signal.SIGINT)
            return real_import(name, *args, **kwargs)
        builtins.__import__ = hooked
        import navdoctor.cli
        print("imported, not interrupted")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=sigint_as_in_a_terminal)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 130 and p.stderr.strip() == "navdoctor: interrupted", (p.returncode, p.stderr)
    assert "imported" not in p.stdout


def test_the_import_guard_is_gone_once_imported():
    """After the import, Ctrl-C is Python's KeyboardInterrupt again (run() turns it into the
    line), in this process too: the guard never outlives the import."""
    import navdoctor.cli  # noqa: F401
    assert signal.getsignal(signal.SIGINT) is not navdoctor.cli._interrupted_while_starting
