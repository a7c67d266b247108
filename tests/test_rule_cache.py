"""The rule-check cache (navdoctor/rulecheck.py, CheckCache): what `analyze` found sound is not
checked again, a changed rule is, and a cache that cannot be read or written changes nothing."""
import json

import pytest

from navdoctor import engine, rulecheck
from navdoctor.errors import RuleError
from navdoctor.rules import Rule, load_rules

from conftest import FIXTURES

TRACE = FIXTURES / "gpu/io_jpeg_decode/kineto.json.gz"


def _rule(rule_id: str, query: str, **kw) -> Rule:
    return Rule(id=rule_id, title="t", category="io", severity="low", query=query,
                condition=kw.pop("condition", "n > 0"), message=kw.pop("message", "m"), **kw)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv(rulecheck.CACHE_DIR_ENV, str(d))
    return d


def _no_check(*a, **kw):
    raise AssertionError("the rules were checked again")


def test_sound_rules_are_remembered(cache_dir, monkeypatch):
    rules = load_rules([])
    rulecheck.require_valid_sql(rules)
    files = list(cache_dir.glob("rulecheck-*.json"))
    assert len(files) == 1
    assert len(json.loads(files[0].read_text())["sound"]) == len(rules)
    monkeypatch.setattr(rulecheck, "check_rules", _no_check)
    rulecheck.require_valid_sql(rules)   # all known: nothing checked


def test_a_changed_rule_is_checked_again(cache_dir, monkeypatch):
    good = _rule("cache-test", "SELECT count(*) AS n FROM kernels")
    rulecheck.require_valid_sql([good])
    changed = _rule("cache-test", "SELECT count(no_such_column) AS n FROM kernels")
    with pytest.raises(RuleError, match="invalid SQL"):
        rulecheck.require_valid_sql([changed])
    # a changed param the SQL binds is a change too
    p1 = _rule("cache-param", "SELECT count(*) AS n FROM kernels WHERE dur_ns > $x", params={"x": 1})
    rulecheck.require_valid_sql([p1])
    checked = []
    real = rulecheck.check_rules
    monkeypatch.setattr(rulecheck, "check_rules",
                        lambda rules, **kw: checked.extend(r.id for r in rules) or real(rules, **kw))
    rulecheck.require_valid_sql([p1])
    assert checked == []
    p2 = _rule("cache-param", "SELECT count(*) AS n FROM kernels WHERE dur_ns > $x", params={"x": 2.5})
    rulecheck.require_valid_sql([p2])
    assert checked == ["cache-param"]


def test_a_rule_the_sandbox_refuses_is_never_recorded(cache_dir):
    bad = _rule("cache-sandbox", "SELECT count(*) AS n FROM read_csv('/etc/passwd')")
    rulecheck.require_valid_sql([bad])   # left to fail at run time, as without the cache
    cache = rulecheck.CheckCache()
    assert cache.rule_key(bad) not in cache.load()
    with pytest.raises(RuleError, match="not allowed"):
        engine.check_read_only(bad)


def test_the_cache_is_per_code_version(cache_dir, monkeypatch):
    rulecheck.require_valid_sql([_rule("cache-v", "SELECT 1 AS n")])
    monkeypatch.setattr(rulecheck, "__version__", "0.0.0-other")
    assert rulecheck.CheckCache().path != next(cache_dir.glob("rulecheck-*.json"))
    assert rulecheck.CheckCache().load() == set()


@pytest.mark.parametrize("how", ["under-a-file", "corrupt"])
def test_an_unusable_cache_changes_nothing(tmp_path, monkeypatch, how):
    if how == "under-a-file":
        (tmp_path / "f").write_text("x")
        monkeypatch.setenv(rulecheck.CACHE_DIR_ENV, str(tmp_path / "f" / "cache"))
    else:
        monkeypatch.setenv(rulecheck.CACHE_DIR_ENV, str(tmp_path))
        rulecheck.CheckCache().path.write_text("{not json")
    rulecheck.require_valid_sql([_rule("cache-ok", "SELECT count(*) AS n FROM kernels")])
    with pytest.raises(RuleError, match="invalid SQL"):
        rulecheck.require_valid_sql([_rule("cache-bad", "SELECT nope FROM kernels")])


def test_cli_rule_file_edited_between_runs(cli, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    f = rules / "r.yaml"
    f.write_text("id: edited\ntitle: t\ncategory: io\nseverity: low\n"
                 "query: SELECT count(*) AS n FROM kernels\ncondition: n < 0\nmessage: m\n")
    env = {rulecheck.CACHE_DIR_ENV: str(tmp_path / "cache")}
    assert cli("analyze", TRACE, "--rules", rules, "-q", env=env).returncode == 0
    assert list((tmp_path / "cache").glob("rulecheck-*.json"))
    f.write_text(f.read_text().replace("count(*)", "count(no_such_column)"))
    r = cli("analyze", TRACE, "--rules", rules, "-q", env=env)
    assert r.returncode == 2 and "edited" in r.stderr and "invalid SQL" in r.stderr
    # a cache folder that cannot be made: the run is the same
    (tmp_path / "file").write_text("x")
    f.write_text(f.read_text().replace("count(no_such_column)", "count(*)"))
    r = cli("analyze", TRACE, "--rules", rules, "-q",
            env={rulecheck.CACHE_DIR_ENV: str(tmp_path / "file" / "cache")})
    assert r.returncode == 0, r.stderr


# ---- the parse cache (navdoctor/rules.py, ParseCache) -------------------------------------

def test_rule_files_known_to_the_parse_cache_load_the_same_rules_without_yaml(cache_dir, monkeypatch):
    """A rule file's parse is kept by its text: the next load gives the same rules without
    parsing (PyYAML not even imported in a fresh process); a changed text is parsed again."""
    import subprocess
    import sys
    from navdoctor import rules as rules_mod
    first = [r.model_dump() for r in load_rules([])]
    assert len(list(cache_dir.glob("rules-parsed-*.json"))) == 1
    monkeypatch.setattr(rules_mod, "_parse_yaml", _no_check)
    again = load_rules([])
    assert [r.model_dump() for r in again] == first
    # each load gets objects of its own: a --set on one load leaves the next one alone
    again[0].params["x"] = 1
    assert [r.model_dump() for r in load_rules([])] == first
    code = ("import sys; from navdoctor.rules import load_rules; n = len(load_rules([])); "
            "print(n, 'yaml' in sys.modules)")
    import os
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env, cwd=cache_dir)
    assert out.stdout.split() == [str(len(first)), "False"]
    monkeypatch.undo()
    monkeypatch.setenv(rulecheck.CACHE_DIR_ENV, str(cache_dir))
    d = cache_dir.parent / "mine"
    d.mkdir()
    text = """updated: 2026-12-06
rules:
  - id: mine
    title: t
    category: io
    severity: low
    query: SELECT 1 AS n
    condition: n > 0
    message: m
    params: {a: 1.5, b: 3, s: "x", t: true}
"""
    (d / "r.yaml").write_text(text)
    (mine,) = rules_mod.load_rules_dir(d)   # a date (JSON has none): parsed each time
    with monkeypatch.context() as m:
        m.setattr(rules_mod, "_parse_yaml", _no_check)
        # its rules, validated, are JSON's own: kept by the text, no parse needed
        assert rules_mod.load_rules_dir(d) == [mine]
        m.setattr(rules_mod.ParseCache, "validated", lambda self, text: None)
        with pytest.raises(AssertionError, match="checked again"):
            rules_mod.load_rules_dir(d)
    (d / "r.yaml").write_text(text.replace("updated: 2026-12-06\n", ""))
    (mine,) = rules_mod.load_rules_dir(d)
    monkeypatch.setattr(rules_mod, "_parse_yaml", _no_check)
    assert rules_mod.load_rules_dir(d)[0].params == mine.params == {"a": 1.5, "b": 3, "s": "x", "t": True}
    (d / "r.yaml").write_text(text.replace("a: 1.5", "a: 2.5"))
    with pytest.raises(AssertionError, match="checked again"):   # a new text is parsed
        rules_mod.load_rules_dir(d)


def test_a_yaml_error_is_the_parsers_each_time(cache_dir, tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "r.yaml").write_text("rules:\n  - id: [unclosed\n")
    from navdoctor import rules as rules_mod
    messages = set()
    for _ in range(2):
        with pytest.raises(RuleError) as info:
            rules_mod.load_rules_dir(d)
        messages.add(str(info.value))
    assert len(messages) == 1 and "YAML syntax error" in messages.pop()


def test_only_what_json_gives_back_unchanged_is_kept():
    from navdoctor.rules import _json_safe
    assert _json_safe({"a": [1, 2.5, "x", None, True, {"b": -0.0}]}, set())
    shared = [1]
    assert not _json_safe({"a": shared, "b": shared}, set())
    assert not _json_safe({1: "x"}, set())
    assert not _json_safe({"a": float("nan")}, set())
    assert not _json_safe({"a": (1, 2)}, set())
    import datetime
    assert not _json_safe([datetime.date(2026, 12, 6)], set())
