"""The rule format, its validation errors, the condition language and rule isolation."""
import textwrap

import duckdb
import pytest

from navdoctor import store
from navdoctor.engine import evaluate_rules as _evaluate, merge_by_rule


def evaluate_rules(con, rules):
    ev = _evaluate(con, rules)
    return merge_by_rule(ev, None), ev.failures
from navdoctor.errors import RuleError
from navdoctor.rule_expr import evaluate
from navdoctor.rules import load_rule_file, load_rules, load_rules_dir

GOOD = textwrap.dedent("""
    id: my-rule
    title: Many kernels
    category: launch
    severity: low
    query: SELECT count(*) AS n FROM kernels
    condition: n >= min_n
    params: {min_n: 2}
    message: "{n} kernels"
    remedies:
      - title: Fewer kernels
""")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def con_with_kernels(n):
    con = duckdb.connect()
    store.create_schema(con)
    for i in range(n):
        con.execute("INSERT INTO kernels (trace_id, source, name, start_ns, end_ns, dur_ns) "
                    "VALUES (1, 'kineto', 'k', ?, ?, 10)", [i * 100, i * 100 + 10])
    return con


def test_rule_fires_and_does_not(tmp_path):
    rules = load_rules_dir(write(tmp_path, "r.yaml", GOOD).parent)
    fired, failures = evaluate_rules(con_with_kernels(3), rules)
    assert [f.message for f in fired] == ["3 kernels"] and not failures
    fired, failures = evaluate_rules(con_with_kernels(1), rules)
    assert fired == [] and not failures


@pytest.mark.parametrize("mutation, field", [
    (("category: launch", "category: disk"), "category"),
    (("severity: low", "severity: huge"), "severity"),
    (("condition: n >= min_n", "condition: n >= "), "condition"),
    (("condition: n >= min_n", "condition: __import__('os')"), "condition"),
    (("title: Many kernels\n", ""), "title"),
    (("remedies:\n  - title: Fewer kernels", "remedies:\n  - text: no title"), "remedies.0.title"),
])
def test_malformed_rule_names_file_rule_and_field(tmp_path, mutation, field):
    path = write(tmp_path, "bad.yaml", GOOD.replace(*mutation))
    with pytest.raises(RuleError) as e:
        load_rule_file(path)
    assert e.value.file == str(path) and e.value.rule_id == "my-rule" and e.value.field == field
    assert str(path) in str(e.value) and "my-rule" in str(e.value)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "broken.yaml", "id: x\ntitle: [unclosed\n")
    with pytest.raises(RuleError, match=r"broken.yaml: YAML syntax error at line"):
        load_rule_file(path)


def test_user_rule_overrides_builtin_by_id(tmp_path):
    write(tmp_path, "o.yaml", GOOD.replace("id: my-rule", "id: launch-overhead"))
    rules = {r.id: r for r in load_rules([tmp_path])}
    assert rules["launch-overhead"].title == "Many kernels"
    assert "io-dataloader-wait" in rules


def test_param_override_and_unknown_param():
    rules = {r.id: r for r in load_rules([], {"launch-overhead.min_share": "0.5"})}
    assert rules["launch-overhead"].params["min_share"] == 0.5
    with pytest.raises(RuleError, match="no such parameter"):
        load_rules([], {"launch-overhead.nope": "1"})


def test_bad_sql_and_write_sql_fail_only_that_rule(tmp_path):
    write(tmp_path, "a.yaml", GOOD)
    write(tmp_path, "b.yaml", GOOD.replace("my-rule", "bad-sql").replace(
        "SELECT count(*) AS n FROM kernels", "SELEC nonsense"))
    write(tmp_path, "c.yaml", GOOD.replace("my-rule", "writer").replace(
        "SELECT count(*) AS n FROM kernels", "DELETE FROM kernels"))
    fired, failures = evaluate_rules(con_with_kernels(3), load_rules_dir(tmp_path))
    assert [f.rule.id for f in fired] == ["my-rule"]
    assert sorted(f.rule_id for f in failures) == ["bad-sql", "writer"]
    assert any("read-only SELECT" in f.error for f in failures)


def test_condition_language():
    assert evaluate("a >= b and not c", {"a": 2, "b": 1, "c": False})
    assert evaluate("max(a, b) / 2 > 0.5", {"a": 2, "b": 1})
    assert not evaluate("a > 1", {"a": None})  # a missing metric never fires
    for bad in ["a.b", "a[0]", "open('x')", "lambda: 1"]:
        with pytest.raises(ValueError):
            evaluate(bad, {"a": 1})


def test_every_builtin_rule_validates_against_the_schema(cli):
    from navdoctor.rules import BUILTIN_RULES_DIR
    r = cli("rules", "check", BUILTIN_RULES_DIR)
    assert r.returncode == 0, r.stderr
