"""Rules are untrusted input: what a hostile rule file can and cannot do.

Every attack below must end as a rule error naming the rule (engine.RuleFailure, the report's
`rule_errors`), while the other rules still run and report. docs/reliability.md lists them.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from navdoctor import engine, store
from navdoctor.analysis import analyze
from navdoctor.errors import RuleError
from navdoctor.rules import Rule, load_rule_file, load_rules

from kineto_factory import KinetoTrace


class Listener:
    """A TCP port on localhost that counts the connections it gets: a rule that reaches the
    network would connect here."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.hits += 1
            conn.close()

    def close(self):
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


def attacks(tmp: Path, port: int) -> dict[str, tuple[str, str]]:
    """rule id -> (query, what the error must say). Paths point into tmp (secret.* exist)."""
    secret = tmp / "secret.csv"
    url = f"http://127.0.0.1:{port}"
    return {
        # read a file
        "read-csv-passwd": ("SELECT * FROM read_csv('/etc/passwd')", "read_csv() is not allowed"),
        "read-csv-secret": (f"SELECT * FROM read_csv('{secret}')", "read_csv() is not allowed"),
        "read-text": (f"SELECT content FROM read_text('{secret}')", "read_text() is not allowed"),
        "read-blob": ("SELECT * FROM read_blob('/etc/hostname')", "read_blob() is not allowed"),
        "read-json": (f"SELECT * FROM read_json('{tmp / 'secret.json'}')", "read_json() is not allowed"),
        "read-parquet": (f"SELECT * FROM read_parquet('{tmp / 'x.parquet'}')", "read_parquet() is not allowed"),
        "glob": ("SELECT * FROM glob('/etc/*')", "glob() is not allowed"),
        "file-as-table": (f"SELECT * FROM '{secret}'", "is not a table of the trace store"),
        "file-in-subquery": (f"SELECT (SELECT count(*) FROM read_csv('{secret}')) AS n, 1 AS trace_id",
                             "read_csv() is not allowed"),
        "lateral-read": ("SELECT t.* FROM kernels k, LATERAL read_text(k.name) t", "read_text() is not allowed"),
        "query-fn": (f"SELECT * FROM query('SELECT * FROM read_csv(''{secret}'')')", "query() is not allowed"),
        "describe-file": (f"DESCRIBE '{secret}'", "is not a table of the trace store"),
        "other-duckdb": (f"SELECT * FROM read_duckdb('{tmp / 'other.duckdb'}')", "read_duckdb() is not allowed"),
        # write a file
        "copy-to": (f"COPY kernels TO '{tmp / 'out.csv'}'", "must be a read-only SELECT (found COPY)"),
        "export-db": (f"EXPORT DATABASE '{tmp / 'export'}'", "must be a read-only SELECT"),
        "create-table": ("CREATE TABLE evil AS SELECT 1", "must be a read-only SELECT (found CREATE)"),
        "insert": ("INSERT INTO kernels (trace_id) VALUES (99)", "must be a read-only SELECT (found INSERT)"),
        "two-statements": ("SELECT 1 AS x; DROP TABLE kernels", "must be exactly one statement"),
        # other databases, extensions, settings
        "attach": (f"ATTACH '{tmp / 'evil.duckdb'}' AS evil", "must be a read-only SELECT (found ATTACH)"),
        "install": ("INSTALL httpfs", "must be a read-only SELECT"),
        "load": ("LOAD httpfs", "must be a read-only SELECT"),
        "set": ("SET enable_external_access = true", "must be a read-only SELECT (found SET)"),
        "reset": ("RESET lock_configuration", "must be a read-only SELECT"),
        "pragma": ("PRAGMA enable_profiling", "must be a read-only SELECT (found PRAGMA)"),
        "set-config-fn": ("SELECT set_config('enable_external_access', 'true', false) AS x",
                          "set_config does not exist"),
        "enable-logging": (f"SELECT * FROM enable_logging(storage='file', storage_path='{tmp / 'logs'}')",
                           "enable_logging() is not allowed"),
        "settings-table": ("SELECT * FROM duckdb_settings()", "duckdb_settings() is not allowed"),
        "secrets": ("SELECT * FROM duckdb_secrets()", "duckdb_secrets() is not allowed"),
        # the network
        "http-csv": (f"SELECT * FROM read_csv('{url}/x.csv')", "read_csv() is not allowed"),
        "http-as-table": (f"SELECT * FROM '{url}/x.parquet'", "is not a table of the trace store"),
        "s3-parquet": ("SELECT * FROM read_parquet('s3://bucket/x.parquet')", "read_parquet() is not allowed"),
        "sqlite-scan": ("SELECT * FROM sqlite_scan('/tmp/x.db', 't')", "sqlite_scan() is not allowed"),
        # run forever (stopped by the time limit)
        "recursive-cte": ("WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) "
                          "SELECT count(*) AS n FROM t", "time limit"),
        "cross-join": ("SELECT count(*) AS n FROM range(1000000000) a, range(1000000000) b", "time limit"),
        "udf-forever": ("SELECT count(tensor_core_kernel('hmma_' || i)) AS n FROM range(10000000000) t(i)",
                        "time limit"),
        # return so much that Python would drown
        "huge-result": ("SELECT * FROM range(100000000)", "more than"),
    }


GOOD_RULE = dict(id="good-rule", title="Counts kernels", category="other", severity="low",
                 query="SELECT trace_id, count(*) AS n FROM kernels GROUP BY trace_id",
                 condition="n >= 1", message="{n} kernels")


def write_rules(directory: Path, rules: dict[str, tuple[str, str]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    docs = [dict(id=rid, title=f"attack {rid}", category="other", severity="low", query=q,
                 condition="1 > 0", message="attack ran") for rid, (q, _) in rules.items()]
    docs.append(GOOD_RULE)
    (directory / "attacks.yaml").write_text(yaml.safe_dump({"rules": docs}, sort_keys=False))
    return directory


def make_secrets(tmp: Path) -> None:
    (tmp / "secret.csv").write_text("password\nhunter2\n")
    (tmp / "secret.json").write_text('{"password": "hunter2"}')
    other = duckdb.connect(str(tmp / "other.duckdb"))
    other.execute("CREATE TABLE t AS SELECT 'hunter2' AS password")
    other.close()


def tiny_trace(tmp: Path) -> str:
    t = KinetoTrace()
    for n in range(3):
        t.step(n, n * 1000, 1000)
        t.launch_kernel("ampere_sgemm_128x64_tn", n * 1000 + 10, n * 1000 + 20, 500)
    return t.write(tmp / "trace.json")


def no_new_files(tmp: Path, before: set[str]) -> list[str]:
    return sorted({str(p.relative_to(tmp)) for p in tmp.rglob("*")} - before)


def test_every_attack_is_stopped_and_named_the_rest_still_run(tmp_path, listener, monkeypatch):
    """In-process, through analysis.analyze: the order the real command runs things in."""
    monkeypatch.setenv("NAVDOCTOR_RULE_TIME_LIMIT_S", "1")
    make_secrets(tmp_path)
    trace = tiny_trace(tmp_path)
    cases = attacks(tmp_path, listener.port)
    rules = load_rules([write_rules(tmp_path / "rules", cases)])
    before = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    db = tmp_path / "t.duckdb"
    t0 = time.monotonic()
    a = analyze([trace], rules, str(db))
    elapsed = time.monotonic() - t0
    errors = {f.rule_id: f.error for f in a.rule_failures}
    for rid, (_, expect) in cases.items():
        assert rid in errors, f"attack {rid} was not stopped"
        assert f"rule '{rid}'" in errors[rid] and "attacks.yaml" in errors[rid]
        assert expect in errors[rid], (rid, errors[rid])
    assert set(errors) == set(cases)              # no built-in rule failed
    assert "good-rule" in [f.rule.id for f in a.findings]
    assert a.rules_run == len(rules) > len(cases) + 1
    assert listener.hits == 0                      # nothing reached the network
    assert no_new_files(tmp_path, before) == ["t.duckdb"]  # nothing written, attached or exported
    assert elapsed < 30                            # the three endless rules took ~1 s each
    con = duckdb.connect(str(db), read_only=True)  # the kept database holds no rule's doing
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    con.close()
    assert "evil" not in tables


def test_cli_reports_rule_errors_and_exits_0(cli, tmp_path, listener):
    """The real command: attacks are rule errors in the JSON report and on the terminal."""
    make_secrets(tmp_path)
    trace = tiny_trace(tmp_path)
    cases = {k: v for k, v in attacks(tmp_path, listener.port).items()
             if k in ("read-csv-passwd", "file-as-table", "copy-to", "attach", "set", "http-csv",
                      "recursive-cte")}
    rules_dir = write_rules(tmp_path / "rules", cases)
    r = cli("analyze", trace, "--rules", rules_dir, "--json", tmp_path / "r.json",
            env={"NAVDOCTOR_RULE_TIME_LIMIT_S": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    errors = {e["rule"]: e["error"] for e in report["rule_errors"]}
    assert set(errors) == set(cases)
    for rid, (_, expect) in cases.items():
        assert expect in errors[rid]
        assert f"rule error: {errors[rid]}" in r.stdout  # shown on the terminal too
    assert "good-rule" in [f["rule"] for f in report["findings"]]
    assert listener.hits == 0


def test_rules_check_refuses_file_and_network_access_before_binding(cli, tmp_path, listener):
    """`navdoctor rules check` binds each query (EXPLAIN) on a connection that is not locked
    down; binding read_csv() already opens the file (and would fetch a URL), so the sources
    are checked from the parse tree first."""
    make_secrets(tmp_path)
    cases = {k: v for k, v in attacks(tmp_path, listener.port).items()
             if k in ("read-csv-secret", "file-as-table", "http-csv", "http-as-table", "query-fn",
                      "describe-file", "copy-to")}
    rules_dir = write_rules(tmp_path / "rules", cases)
    r = cli("rules", "check", rules_dir, timeout=60)
    assert r.returncode == 2
    for rid, (_, expect) in cases.items():
        line = [l for l in r.stderr.splitlines() if f"rule '{rid}'" in l]
        assert len(line) == 1 and expect in line[0], (rid, r.stderr)
    assert "Traceback" not in r.stderr and "hunter2" not in r.stderr
    assert listener.hits == 0


def test_lock_is_in_place_before_the_first_rule(tmp_path):
    """A rule can read the two settings (read-only) and sees them locked: rules never run on
    an open connection, also when the database is a file (--db)."""
    rule = Rule(id="probe", title="t", category="other", severity="low",
                query="SELECT current_setting('enable_external_access') AS ext, "
                      "current_setting('lock_configuration') AS locked, "
                      "current_setting('autoinstall_known_extensions') AS autoinstall",
                condition="1 > 0", message="{ext} {locked} {autoinstall}")
    for db in (None, str(tmp_path / "t.duckdb")):
        a = analyze([tiny_trace(tmp_path)], [rule], db)
        assert [f.message for f in a.findings] == ["False True False"]


def test_time_limit_is_configurable(monkeypatch):
    con = duckdb.connect()
    store.create_schema(con)
    engine.lock_down(con)
    forever = Rule(id="forever", title="t", category="other", severity="low",
                   query="WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) "
                         "SELECT count(*) AS n FROM t", condition="1 > 0", message="m")
    for how in ("argument", "constant", "env"):
        t0 = time.monotonic()
        if how == "argument":
            ev = engine.evaluate_rules(con, [forever], time_limit_s=0.3)
        elif how == "constant":
            monkeypatch.setattr(engine, "RULE_TIME_LIMIT_S", 0.3)
            ev = engine.evaluate_rules(con, [forever])
            monkeypatch.undo()
        else:
            monkeypatch.setenv("NAVDOCTOR_RULE_TIME_LIMIT_S", "0.3")
            ev = engine.evaluate_rules(con, [forever])
            monkeypatch.delenv("NAVDOCTOR_RULE_TIME_LIMIT_S")
        assert time.monotonic() - t0 < 5
        assert "stopped after the 0.3 s time limit" in ev.failures[0].error
    monkeypatch.setenv("NAVDOCTOR_RULE_TIME_LIMIT_S", "nonsense")
    assert engine.rule_time_limit() == engine.RULE_TIME_LIMIT_S


def locked_store():
    con = duckdb.connect()
    store.create_schema(con)
    con.execute("INSERT INTO kernels (trace_id, source, name, start_ns, end_ns, dur_ns) "
                "VALUES (1, 'kineto', 'ampere_sgemm_128x64_tn', 0, 10, 10)")
    engine.lock_down(con)
    return con


def rule(rid="r", query="SELECT 1 AS x", condition="1 > 0", message="m"):
    return Rule(id=rid, title="t", category="other", severity="low", query=query,
                condition=condition, message=message, source_file="evil.yaml")


@pytest.mark.parametrize("message, expect", [
    # A Python object among the metrics would open the way to module globals.
    ("{u.__init__.__globals__[os].environ}", "is not allowed"),
    ("{x.__class__.__mro__}", "is not allowed"),
    ("{x[0]}", "is not allowed"),
    ("{0}", "is not allowed"),
    ("{x:>99999999999}", "widths and precisions above 1000"),
    ("{x:.999999999f}", "widths and precisions above 1000"),
    ("{x:{x}}", "nested fields"),
    ("{x", "invalid template"),
])
def test_message_template_cannot_reach_python_objects(message, expect):
    ev = engine.evaluate_rules(locked_store(), [rule(query="SELECT 1 AS x, uuid() AS u",
                                                     message=message)])
    assert not ev.findings and expect in ev.failures[0].error
    assert "field 'message'" in ev.failures[0].error and "evil.yaml" in ev.failures[0].error


def test_metrics_are_plain_data():
    """Odd SQL types become plain values in findings (and so in the JSON report)."""
    ev = engine.evaluate_rules(locked_store(), [rule(
        query="SELECT uuid() AS u, INTERVAL 90 SECOND AS iv, 'ab'::BLOB AS b, TIME '10:00' AS t, "
              "[1, 2] AS l, {'a': 1.5} AS s, 1.5::DECIMAL(4,2) AS d, 'NaN'::DOUBLE AS nan",
        message="{u} {iv} {b} {t}")])
    m = ev.findings[0].metrics
    assert isinstance(m["u"], str) and len(m["u"]) == 36
    assert (m["iv"], m["b"], m["t"], m["l"], m["s"], m["d"], m["nan"]) == \
        (90.0, "6162", "10:00:00", [1, 2], {"a": 1.5}, 1.5, None)
    json.dumps(m)


@pytest.mark.parametrize("condition, expect", [
    ("9 ** 9 ** 9 > 1", "'**' needs a constant exponent"),
    ("x ** x > 1", "'**' needs a constant exponent"),
    ("'a' * 1000000000 > 'a'", "no arithmetic on strings"),
    ("'%0999999999d' % x > 'a'", "no arithmetic on strings"),
    ("s * 1000000000 > 'a'", "no arithmetic on strings"),   # s is a metric string
    ("l * 1000000000 > 1", "no arithmetic on lists"),
])
def test_condition_cannot_hang_python(condition, expect):
    """Conditions run in Python, where no time limit can interrupt C code: numbers of a
    billion digits and gigabyte strings are refused up front or at their first operation."""
    t0 = time.monotonic()
    ev = engine.evaluate_rules(locked_store(), [rule(query="SELECT 10 AS x, 'a' AS s, [1] AS l",
                                                     condition=condition)])
    assert time.monotonic() - t0 < 5
    assert not ev.findings and expect in ev.failures[0].error


def test_small_powers_still_work():
    ev = engine.evaluate_rules(locked_store(), [rule(query="SELECT 10 AS x",
                                                     condition="x ** 2 > 99 and x ** -1 < 1 and x ** 0.5 > 3")])
    assert ev.findings and not ev.failures


def test_tensor_core_udf_cannot_be_abused():
    """tensor_core_kernel() is Python called from SQL. Inside rules it answers NULL for
    names longer than any kernel name, does not cache long names, and stays interruptible."""
    from navdoctor.kernelnames import tensor_core_kernel
    con = locked_store()
    before = tensor_core_kernel.cache_info().currsize
    ev = engine.evaluate_rules(con, [
        rule("normal", "SELECT tensor_core_kernel('ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn') AS a, "
                       "tensor_core_kernel('ampere_sgemm_128x64_tn') AS b, tensor_core_kernel(NULL) AS c",
             message="{a} {b} {c}"),  # (messages show NULL as 0)
        rule("huge-names", "SELECT count(tensor_core_kernel(repeat('hmma', 5000) || i)) AS n "
                           "FROM range(200) t(i)", message="{n}"),
        rule("long-names", "SELECT count(tensor_core_kernel('ampere_sgemm_' || repeat('x', 600) || i)) AS n "
                           "FROM range(2000) t(i)", message="{n}"),
    ], time_limit_s=10)
    assert not ev.failures
    assert [f.message for f in ev.findings] == ["True False 0", "0", "2000"]
    assert tensor_core_kernel.cache_info().currsize - before <= 2   # only the two real names


def test_yaml_python_tags_are_refused(tmp_path):
    p = tmp_path / "evil.yaml"
    marker = tmp_path / "PWNED"
    p.write_text(f'id: !!python/object/apply:os.system ["touch {marker}"]\ntitle: t\n'
                 "category: other\nseverity: low\nquery: SELECT 1 AS x\ncondition: x > 0\nmessage: m\n")
    with pytest.raises(RuleError) as e:
        load_rule_file(p)
    assert str(p) in str(e.value) and "python/object/apply:os.system" in str(e.value)
    assert not marker.exists()
    for tag in ("!!python/object:os.PathLike {}", "!!python/name:os.system", "!!python/module:os"):
        p.write_text(f"id: x\ntitle: {tag}\ncategory: other\nseverity: low\nquery: SELECT 1\n"
                     "condition: 1 > 0\nmessage: m\n")
        with pytest.raises(RuleError) as e:
            load_rule_file(p)
        assert str(p) in str(e.value)


def test_yaml_alias_bomb_is_cheap(cli, tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines += ["id: bomb", "title: t", "category: other", "severity: low", "query: SELECT 1 AS x",
              "condition: x > 0", "message: m", "remedies: *i"]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    r = cli("rules", "list", "--rules", tmp_path, timeout=60)
    assert r.returncode == 2 and "bomb.yaml" in r.stderr and "Traceback" not in r.stderr


def test_allowed_table_functions_still_work():
    ev = engine.evaluate_rules(locked_store(), [rule(
        query="SELECT (SELECT count(*) FROM range(10)) AS a, (SELECT count(*) FROM generate_series(1, 5)) AS b, "
              "(SELECT count(*) FROM unnest([1, 2, 3])) AS c, (SELECT count(*) FROM kernels) AS k",
        message="{a} {b} {c} {k}")])
    assert [f.message for f in ev.findings] == ["10 5 3 1"] and not ev.failures


def test_lock_down_alone_still_blocks_files_network_and_settings(tmp_path, listener):
    """Second layer: were the parse-tree check bypassed, the locked connection still refuses."""
    make_secrets(tmp_path)
    con = locked_store()
    cur = con.cursor()
    for sql in (f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')",
                f"SELECT * FROM '{tmp_path / 'secret.csv'}'",
                f"SELECT * FROM read_text('{tmp_path / 'secret.json'}')",
                f"SELECT * FROM read_duckdb('{tmp_path / 'other.duckdb'}')",
                f"SELECT * FROM read_csv('http://127.0.0.1:{listener.port}/x.csv')",
                f"ATTACH '{tmp_path / 'evil.duckdb'}'",
                f"COPY kernels TO '{tmp_path / 'out.csv'}'",
                "SELECT * FROM sqlite_scan('/tmp/x.db', 't')",   # would auto-install an extension
                "SET enable_external_access = true",
                "SET lock_configuration = false",
                "SET autoinstall_known_extensions = true",
                "SELECT * FROM enable_logging(storage='file')"):
        with pytest.raises(duckdb.Error) as e:
            cur.execute(sql).fetchall()
        assert "hunter2" not in str(e.value)
    assert listener.hits == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.duckdb", "secret.csv", "secret.json"]
