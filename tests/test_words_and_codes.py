"""Exit codes exactly as docs/report.md documents them (one test per code), and one wording:
the terminal and Markdown reports say the same things in the same words, one step count and one
statistic, no profiler noise or repeated lines from diagnose."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import CPU_TRAINING_LOOP, ROOT, sigint_as_in_a_terminal

FIX = ROOT / "fixtures"
CPU_TRACE = FIX / "cpu" / "train_steps.json.gz"
MEMORY = FIX / "gpu" / "memory_item_sync"
# navdoctor's command line with plotly made unimportable (the HTML page's one dependency)
CLI_WITHOUT_PLOTLY = ("import importlib.abc, sys\n"
                      "class NoPlotly(importlib.abc.MetaPathFinder):\n"
                      "    def find_spec(self, name, path=None, target=None):\n"
                      "        if name.split('.')[0] == 'plotly': raise ImportError(name)\n"
                      "sys.meta_path.insert(0, NoPlotly())\n"
                      "sys.argv = ['navdoctor', *sys.argv[1:]]\n"
                      "from navdoctor.cli import run\nrun()\n")

def _script(tmp_path, before=""):
    p = tmp_path / "train.py"
    p.write_text(CPU_TRAINING_LOOP.replace("{before}", before))
    return p


def _documented_codes() -> set[str]:
    text = (ROOT / "docs" / "report.md").read_text()
    table = text[text.index("## Exit codes"):]
    return {m.group(1) for m in re.finditer(r"^\| (\w+) \|", table, re.M)} - {"code"}


TESTED = {"0", "1", "N", "2", "130"}


def test_every_documented_code_has_its_test():
    assert _documented_codes() == TESTED


def test_code_0_the_analysis_ran(cli):
    assert cli("analyze", CPU_TRACE, "-q").returncode == 0


def test_code_1_a_fail_on_category_fired(cli):
    r = cli("analyze", MEMORY / "nsys.sqlite.gz", "--fail-on", "memory", "-q")
    assert r.returncode == 1 and "--fail-on" in r.stderr


def test_code_n_the_script_failed_before_anything_was_captured(cli, tmp_path):
    """A script that exits 3 before its first step: its own code, one line, no traceback."""
    r = cli("diagnose", "--out", tmp_path / "runs", "--no-nsys",
            _script(tmp_path, "sys.exit(3)"), cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    ours = [line for line in r.stderr.splitlines() if line.startswith("navdoctor: error")]
    assert len(ours) == 1 and "exit code 3" in ours[0] and "before anything was captured" in ours[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("case", ["bad input", "an output not written"])
def test_code_2_bad_input_or_an_output_not_written(cli, tmp_path, case):
    if case == "bad input":
        r = cli("analyze", tmp_path / "missing.json")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
        return
    # the HTML page needs plotly; without it the JSON and Markdown are still written
    p = subprocess.run([sys.executable, "-c", CLI_WITHOUT_PLOTLY, "analyze", str(CPU_TRACE), "--json", "r.json",
                        "--markdown", "r.md", "--html", "r.html", "-q"], capture_output=True,
                       text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "navdoctor: error: could not write r.html: the HTML report needs the plotly package "
        "(pip install plotly) (the other outputs are written)"]
    assert json.loads((tmp_path / "r.json").read_text())["verdict"]["bound"] == "compute"
    assert (tmp_path / "r.md").exists() and not (tmp_path / "r.html").exists()


def test_code_130_interrupted(tmp_path):
    script = _script(tmp_path, "print('ready', flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "navdoctor.cli", "diagnose", "--out",
                             str(tmp_path / "runs"), "--no-nsys", str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=sigint_as_in_a_terminal, start_new_session=True)
    deadline = time.monotonic() + 120
    line = b""
    while b"ready" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-2000:]


# ---- one wording ---------------------------------------------------------------------------

def _reports(cli, tmp_path, *traces):
    r = cli("analyze", *traces, "--markdown", tmp_path / "r.md", "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    return r.stdout, (tmp_path / "r.md").read_text(), json.loads((tmp_path / "r.json").read_text())


def test_a_cpu_only_trace_reads_the_same_in_the_terminal_and_markdown(cli, tmp_path):
    terminal, markdown, _ = _reports(cli, tmp_path, CPU_TRACE)
    assert "CPU ops fill the step (no GPU activity in the trace)" in terminal
    assert "CPU ops fill the step (no GPU activity in the trace)." in markdown
    assert "GPU kernels fill the step" not in markdown


def test_the_answer_and_the_step_read_the_same_everywhere(cli, tmp_path):
    terminal, markdown, j = _reports(cli, tmp_path, MEMORY / "kineto.json.gz", MEMORY / "nsys.sqlite.gz")
    v, first = j["verdict"], j["findings"][0]
    step = f"mean {v['step_ms']:.2f} ms/step over {v['steps']} steps"
    assert step in terminal and step in markdown
    # the answer is the remedy the what-if model expects to give most (first_remedy)
    fr = j["first_remedy"]
    first = next(f for f in j["findings"] if f["rule"] == fr["rule"])
    remedy = next(r for r in first["remedies"] if r["title"] == fr["title"])
    lo, hi = remedy["speedup_range"]
    expected = (f"expected {remedy['speedup_expected']:.2f}x ({lo:.2f}-{hi:.2f}x); "
                f"bound {first['speedup_up_to']:.2f}x")
    head = terminal.splitlines()
    assert head[0].startswith("VERDICT") and head[1].startswith("  DO THIS FIRST: " + remedy["title"])
    assert expected in head[1] and expected in markdown
    assert remedy["code"].splitlines()[0].strip() in head[2]
    assert f"**Do this first:** {remedy['title']}" in markdown
    # the answer comes before the findings in both
    assert terminal.index("DO THIS FIRST") < terminal.index("1. [")
    assert markdown.index("Do this first") < markdown.index("**Findings**")


def test_diagnose_says_each_thing_once_and_keeps_profiler_noise_in_its_log(cli, tmp_path):
    r = cli("diagnose", "--out", tmp_path / "runs", "--wait", "1", "--warmup", "1", "--steps", "3",
            "--json", tmp_path / "d.json", _script(tmp_path), cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "NAVDOCTOR_NSYS": ""})
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert out.count("nsys not found") == 1, out
    assert not re.search(r"^(USDT|ERROR|WARNING|INFO):\d{4}-", out, re.M), out
    assert "Memory block of unknown size" not in out
    j = json.loads((tmp_path / "d.json").read_text())
    v = j["verdict"]
    # the steps the script ran, and the steps the report measures, each said as what it is
    assert re.search(r"the script ran \d+ steps", r.stderr)
    assert f"mean {v['step_ms']:.2f} ms/step over {v['steps']} step" in r.stdout
    assert not re.search(r"pass 1/2 done: \d+ steps", r.stderr)
    from navdoctor.collect.diagnose import PROFILER_NOISE
    log = (Path(j["run"]["dir"]) / "torch-pass.log").read_text()
    noise = [line for line in log.splitlines() if PROFILER_NOISE.match(line.encode())]
    assert all(line not in out for line in noise)     # in the pass's log, not on the screen


def test_the_noise_filter_passes_the_script_s_own_output():
    """Kineto's log lines and the allocator's warning go; the script's lines, a progress bar
    redrawn with '\\r' and a last line without a newline stay, whatever the chunks."""
    import io
    from navdoctor.collect.diagnose import NoiseFilter
    sink = io.BytesIO()
    f = NoiseFilter(sink)
    for chunk in (b"epoch 1\nERR", b"OR:2026-12-07 13:02:26 4814:4814 DeviceProperties.cpp:56] "
                  b"gpuGetDeviceCount failed with code 35\n", b"50%|##\r", b"100%|####\n",
                  b"[W1207 13:02:26.8 CPUAllocator.cpp:245] Memory block of unknown size was "
                  b"allocated before the profiling started\nERROR: my own error\ndone"):
        f.write(chunk)
    f.close()
    assert sink.getvalue() == b"epoch 1\n50%|##\r100%|####\nERROR: my own error\ndone"


def test_rules_check_resolves_every_name_of_a_condition(cli, tmp_path):
    (tmp_path / "r.yaml").write_text(textwrap.dedent("""
        rules:
          - id: my-wait
            title: Waiting a lot
            category: io
            severity: medium
            description: the loop waits for data
            query: |
              SELECT trace_id, avg(data_ns) / avg(step_ns) AS share FROM step_breakdown GROUP BY trace_id
            condition: share >= min_sharee
            params: {min_share: 0.2}
            message: "waits {share:.0%}"
    """))
    r = cli("rules", "check", tmp_path)
    assert r.returncode == 2
    assert "names 'min_sharee', which is neither a column of the query (trace_id, share) nor a param" in r.stderr
    assert "did you mean 'min_share'" in r.stderr
    # analyze stops on it before any trace is read, as on invalid SQL
    a = cli("analyze", CPU_TRACE, "--rules", tmp_path, "-q")
    assert a.returncode == 2 and len(a.stderr.strip().splitlines()) == 1 and "min_sharee" in a.stderr
    (tmp_path / "r.yaml").write_text((tmp_path / "r.yaml").read_text().replace("min_sharee", "min_share"))
    assert cli("rules", "check", tmp_path).returncode == 0


def test_diagnose_without_plotly_writes_every_other_output(tmp_path):
    """The run directory's report.json and report.md and the --json copy are written; the page
    that needs plotly is one line; exit 2."""
    p = subprocess.run([sys.executable, "-c", CLI_WITHOUT_PLOTLY, "diagnose", "--out", str(tmp_path / "runs"),
                        "--no-nsys", "--json", "copy.json", str(_script(tmp_path))],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("navdoctor: error")]
    assert len(errors) == 1 and "report.html: the HTML report needs the plotly package" in errors[0]
    run = Path(json.loads((tmp_path / "copy.json").read_text())["run"]["dir"])
    assert (run / "report.json").exists() and (run / "report.md").exists()
    assert not (run / "report.html").exists()
