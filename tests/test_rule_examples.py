"""`navdoctor rules test` (rules carry their own examples) and `navdoctor rules explain`."""
import textwrap
from pathlib import Path

from conftest import ROOT
from test_synthetic_rules import kineto_zero_grad

RULE = """\
id: many-fills
title: Many zero fills
category: launch
severity: low
query: |
  SELECT s.trace_id, s.step_ns,
         (SELECT count(*) FROM cpu_ops_in_steps o WHERE o.trace_id = s.trace_id
            AND o.name = 'aten::zero_') / s.steps AS fills_per_step
  FROM trace_summary s
condition: fills_per_step >= min_fills
params: {{min_fills: 10}}
message: "{{fills_per_step}} fills per step"
examples:
{examples}
"""


def write_rule(tmp_path: Path, examples: str) -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / "fills.yaml").write_text(RULE.format(examples=textwrap.indent(examples, "  ")))
    return d


def traces(tmp_path: Path) -> None:
    kineto_zero_grad(tmp_path, 60)   # zero60.json: 60 fills per step
    kineto_zero_grad(tmp_path, 0)    # zero0.json: none


def test_builtin_rules_pass_their_own_examples(cli):
    # The same command CI runs: every built-in rule fires on its examples and stays quiet on
    # the others (real H200 captures in fixtures/gpu, built traces in fixtures/synthetic).
    r = cli("rules", "test", ROOT / "rules", "--require-examples", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
    passed, total = r.stdout.strip().splitlines()[-1].split(" case(s)")[0].split(" of ")
    assert passed == total and int(total) >= 2 * 23


def test_passing_and_failing_cases_one_line_each(cli, tmp_path):
    traces(tmp_path)
    d = write_rule(tmp_path, """\
- {expect: fire, traces: ../zero60.json, metrics: {fills_per_step: {min: 50, max: 70}}}
- {expect: quiet, traces: ../zero0.json}
- {expect: quiet, traces: ../zero60.json}
- {expect: fire, traces: ../zero0.json}
- {expect: fire, traces: ../zero60.json, metrics: {fills_per_step: {max: 30}}}
- {expect: fire, traces: ../zero60.json, params: {min_fills: 100}}
- {expect: quiet, traces: ../zero60.json, params: {min_fills: 100}}
- {expect: fire, traces: ../missing.json}
- {expect: fire, traces: ../zero60.json, params: {no_such: 1}}
- {expect: fire, traces: ../zero60.json, metrics: {nope: {min: 1}}}
""")
    r = cli("rules", "test", d)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    cases = [line for line in lines if line.startswith(("ok", "FAIL"))]
    assert len(cases) == 10
    status = [line.split()[0] for line in cases]
    assert status == ["ok", "ok", "FAIL", "FAIL", "FAIL", "FAIL", "ok", "FAIL", "FAIL", "FAIL"]
    assert "fills_per_step=60" in cases[0]
    assert "fired: 60" in cases[2]
    assert "did not fire (fills_per_step=0" in cases[3]
    assert "above the expected maximum 30" in cases[4]
    assert "did not fire (fills_per_step=60" in cases[5]
    assert "no such file" in cases[7]
    assert "not a parameter" in cases[8]
    assert "'nope' is not a column" in cases[9]
    assert lines[-1].startswith("3 of 10 case(s) passed")
    assert "Traceback" not in r.stderr


def test_all_passing_exits_0_and_quiet_prints_only_failures(cli, tmp_path):
    traces(tmp_path)
    d = write_rule(tmp_path, """\
- {expect: fire, traces: [../zero60.json]}
- {expect: quiet, traces: ../zero0.json, note: set_to_none=True records no fill}
""")
    r = cli("rules", "test", d, "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines() == [f"2 of 2 case(s) passed in {d}"]


def test_rules_without_examples(cli, tmp_path):
    traces(tmp_path)
    d = write_rule(tmp_path, "- {expect: fire, traces: ../zero60.json}\n")
    r = cli("rules", "test", d)
    assert r.returncode == 0
    r = cli("rules", "test", d, "--require-examples")
    assert r.returncode == 1
    assert "FAIL many-fills: no example where it must stay quiet" in r.stdout


def test_bad_examples_are_a_usage_error(cli, tmp_path):
    d = write_rule(tmp_path, "- {expect: maybe, traces: x.json}\n")
    r = cli("rules", "test", d)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "rule 'many-fills'" in r.stderr and "examples" in r.stderr
    r = cli("rules", "test", tmp_path / "nowhere")
    assert r.returncode == 2 and "no such rules directory" in r.stderr


def test_explain_prints_documentation_parameters_and_examples(cli, tmp_path):
    r = cli("rules", "explain", "io-dataloader-wait")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for part in ("io-dataloader-wait: The GPU idles", "What it measures:", "min_share = 0.1",
                 "--set io-dataloader-wait.NAME=VALUE", "Remedies:", "--remedy num_workers",
                 "fire  on ../fixtures/gpu/io_jpeg_decode", "quiet on ../fixtures/gpu/compute_convnet",
                 "Query:", "dataloader_waits_in_steps"):
        assert part in out, part
    traces(tmp_path)
    d = write_rule(tmp_path, "- {expect: fire, traces: ../zero60.json, metrics: {fills_per_step: {min: 50}}}\n")
    r = cli("rules", "explain", "many-fills", "--rules", d)
    assert "fills_per_step in [50, ]" in r.stdout


def test_explain_unknown_rule(cli):
    r = cli("rules", "explain", "io-dataloader-wiat")
    assert r.returncode == 2
    assert r.stderr.strip() == "navdoctor: error: no rule 'io-dataloader-wiat' (did you mean 'io-dataloader-wait'?)"
