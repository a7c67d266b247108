"""The HTML report (--html): what it holds, how it is written, and what a real browser makes of it.

The browser tests open the reports of two real H200 captures (memory_item_sync, Kineto + nsys;
io_jpeg_decode, nsys) and of a verify result in headless Chromium (one browser for the module):
no console error, no request but the file itself, every chart drawn with a legend entry for
every bucket in its data, the findings present; screenshots go to test-artifacts/. They skip,
saying why, where no Chromium is installed (tests/install-browser.sh installs Debian's).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, run_cli
from navdoctor.breakdown import BUCKETS
from navdoctor.reporters import data as report_data
from navdoctor.reporters.html import (BUCKET_COLOR, BUCKET_LABEL, HTML_MARK, is_navdoctor_html,
                                      render_verify_html)

GPU = FIXTURES / "gpu"
MEM_SYNC = [GPU / "memory_item_sync" / "kineto.json.gz", GPU / "memory_item_sync" / "nsys.sqlite.gz"]
JPEG_NSYS = [GPU / "io_jpeg_decode" / "nsys.sqlite.gz"]
ARTIFACTS = ROOT / "test-artifacts"
MAX_BYTES = 5_000_000


def figures_of(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="nd-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))["figures"]


def verify_result(run_dir: Path) -> dict:
    """A verify result made by verify's own code from synthetic runs: one remedy that helps
    (~1.5x), one with no effect, one code change."""
    from navdoctor.verify.command import BASELINE, Plan, Run, Settings, _arm_result
    rng = random.Random(3)
    settings = Settings(repeats=3, warmup=1, steps=10, resamples=300)

    def run(arm, rnd, ms):
        steps = [ms * (1 + rng.gauss(0, 0.02)) for _ in range(11)]
        changes = {rid: [f"{rid} applied"] for rid in arm}
        return Run(arm, rnd, 0, {"step_ms": steps, "changes": changes, "seconds": 1.0}, "log", 1.0)

    plan = Plan("train.py", [], [("num_workers",), ("channels_last",)])
    base = [run(BASELINE, r, 30.0) for r in (1, 2, 3)]
    results = [_arm_result(plan, ("num_workers",), base, [run(("num_workers",), r, 20.0) for r in (1, 2, 3)],
                           settings, None),
               _arm_result(plan, ("channels_last",), base, [run(("channels_last",), r, 30.0) for r in (1, 2, 3)],
                           settings, None)]
    results.append({"remedy": "batch_size", "remedies": ["batch_size"], "title": "Larger batch",
                    "kind": "code_change", "verdict": "needs code change", "measured": False,
                    "comparison": None, "code": "DataLoader(ds, batch_size=64)", "notes": [], "changes": []})
    return {"schema_version": "1.1", "tool": "navdoctor test", "script": "train.py", "args": [],
            "created": "2026-01-01T00:00:00", "seconds": 9.0,
            "machine": {"device": "cpu", "cpus": 2, "cpu": "test", "torch": "2", "cuda": False},
            "settings": {"repeats": 3, "warmup_steps": 1, "timed_steps": 10, "margin": 0.05,
                         "confidence": 0.95, "priming_runs": 1, "order": "interleaved"},
            "run_dir": str(run_dir), "baseline": {"median_ms": 30.0}, "results": results}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The three pages the tests look at, made once: two analyses through the command line
    (with their JSON reports), one verify page."""
    d = tmp_path_factory.mktemp("html")
    out = {}
    # io_jpeg's path already holds an earlier navdoctor page (a verify one): --html replaces it.
    verify_page = d / "verify.html"
    verify_page.write_text(render_verify_html(verify_result(d)), encoding="utf-8")
    shutil.copy(verify_page, d / "jpeg.html")
    for name, traces in (("memsync", MEM_SYNC), ("jpeg", JPEG_NSYS)):
        r = run_cli("analyze", *traces, "--json", d / f"{name}.json", "--html", d / f"{name}.html")
        assert r.returncode == 0, r.stderr
        assert f"HTML report: {d / f'{name}.html'}" in r.stdout
        out[name] = (d / f"{name}.html", json.loads((d / f"{name}.json").read_text()))
    out["verify"] = (verify_page, None)
    # a compare page: the H200 sync-bound capture against its fixed twin (nsys exports)
    r = run_cli("compare", GPU / "memory_item_sync" / "nsys.sqlite.gz",
                GPU / "memory_item_sync_fixed" / "nsys.sqlite.gz",
                "--json", d / "compare.json", "--html", d / "compare.html", "-q")
    assert r.returncode == 0, r.stderr
    out["compare"] = (d / "compare.html", json.loads((d / "compare.json").read_text()))
    return out


# ---- the file ------------------------------------------------------------------------------

def test_page_is_one_offline_file_with_a_marker(reports):
    for name, (path, _report) in reports.items():
        text = path.read_text(encoding="utf-8")
        assert text.startswith("<!DOCTYPE html>\n" + HTML_MARK) and is_navdoctor_html(path)
        assert path.stat().st_size < MAX_BYTES, (name, path.stat().st_size)
        # nothing loaded from elsewhere: no external script, stylesheet, image or font
        assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", text), name
        assert "https://cdn" not in text and "@import" not in text
        assert "default-src 'none'" in text and "connect-src 'none'" in text
        # plotly.js travels inside, compressed
        assert re.search(r'id="nd-plotly">[A-Za-z0-9+/=]{1000000,}</script>', text)


def test_figures_are_valid_plotly_and_colours_are_one_per_bucket(reports):
    go = pytest.importorskip("plotly.graph_objects")
    path, report = reports["memsync"]
    figs = figures_of(path)
    assert {"fig-shares", "fig-classes", "fig-timeline-typical", "fig-timeline-slowest"} <= set(figs)
    assert {f"fig-steps-{t['trace_id']}" for t in report["verdict"]["per_trace"]} <= set(figs)
    for fid, fig in figs.items():
        go.Figure(fig)                  # raises on a property plotly does not know
    colour_of = {}
    for fid, fig in figs.items():
        for tr in fig["data"]:
            if tr.get("legendgroup") in BUCKETS:
                colour_of.setdefault(tr["legendgroup"], set()).add(tr["marker"]["color"])
    assert colour_of and all(c == {BUCKET_COLOR[b]} for b, c in colour_of.items())


def test_step_bars_are_the_breakdown(reports):
    """Each step's stacked bar sums to its step time, and the shares of the verdict's trace come
    out of the same numbers (the steady steps, stalls left out)."""
    path, report = reports["memsync"]
    figs = figures_of(path)
    for t in report["verdict"]["per_trace"]:
        fig = figs[f"fig-steps-{t['trace_id']}"]
        bars = [tr for tr in fig["data"] if tr["type"] == "bar"]
        assert len(bars[0]["x"]) == t["steps"] + t["stall_steps"]
        totals = [sum(tr["y"][i] or 0 for tr in bars) for i in range(len(bars[0]["x"]))]
        mean = sum(totals) / len(totals)
        assert mean == pytest.approx(t["step_ms"], rel=0.02)
        per_bucket = {tr["legendgroup"]: sum(tr["y"]) / sum(totals) for tr in bars}
        for b, share in t["shares"].items():
            assert per_bucket.get(b, 0) == pytest.approx(share, abs=0.01)


def test_findings_and_traces_are_in_the_page(reports):
    path, report = reports["memsync"]
    text = path.read_text(encoding="utf-8")
    assert report["findings"]
    for f in report["findings"]:
        assert f'data-rule="{f["rule"]}"' in text
        for r in f["remedies"]:
            assert r["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in text.replace("&#x27;", "'")
    assert f'data-bound="{report["verdict"]["bound"]}"' in text
    for i in report["inputs"]:
        assert i["path"] in text


def test_stall_steps_are_marked_and_the_frame_budget_drawn():
    """nav_realtime_graphs (the navigation workload with CUDA graphs; H200, nsys) has one
    isolated stall step; it is an inference loop, so the realtime-frame-budget line is drawn at
    the rule's budget, --set included."""
    from navdoctor.report import build_report
    from navdoctor.reporters.html import steps_figure
    from navdoctor.rules import load_rules
    rules = load_rules(overrides={"realtime-frame-budget.budget_ms": "33"})
    a, html_data = _analyze_for_html([str(GPU / "nav_realtime_graphs" / "nsys.sqlite.gz")], rules)
    (t,) = build_report(a).verdict.per_trace
    steps = html_data["steps"][t.trace_id]
    assert t.stall_steps == 1 and sum(steps["stall"]) == 1
    fig = steps_figure(t.trace_id, t.source, steps, html_data["budget"].get(t.trace_id))
    (marker,) = [tr for tr in fig["data"] if tr["type"] == "scatter"]
    stalled = [str(n) for n, st in zip(steps["step_num"], steps["stall"]) if st]
    assert marker["x"] == stalled and "stall" in marker["name"]
    slowest = max(steps["step_ns"])
    assert steps["step_ns"][steps["stall"].index(True)] == slowest
    (line,) = fig["layout"]["shapes"]
    assert line["y0"] == line["y1"] == 33 and "33 ms" in line["name"]


def _analyze_for_html(paths, rules):
    """An analysis with the HTML report's store reader, and what it gathered."""
    from navdoctor.analysis import analyze
    views = report_data.HtmlViews()
    return analyze(paths, rules, None, reader=views), views.data


def test_timelines_are_capped_and_merging_keeps_the_busy_time(monkeypatch):
    """With a cap of a third of the boxes drawn, a step's events become at most that many boxes,
    and the merged boxes still add up to the time the events took, lane by lane."""
    from navdoctor.analysis import analyze
    from navdoctor.rules import load_rules
    rules = load_rules()
    nav = [str(GPU / "nav_default" / "nsys.sqlite.gz")]   # ~3400 events a step
    full = _analyze_for_html(nav, rules)[1]
    cap = min(tl["drawn"] for tl in full["timelines"]) // 3
    assert cap >= 100
    monkeypatch.setattr(report_data, "TIMELINE_MAX_ITEMS", cap)
    capped = _analyze_for_html(nav, rules)[1]
    assert full["timelines"] and len(capped["timelines"]) == len(full["timelines"])
    for a, b in zip(full["timelines"], capped["timelines"]):
        assert a["step_num"] == b["step_num"] and a["events"] == b["events"]
        assert b["drawn"] <= cap < b["events"] and b["merge_below_ns"] > a["merge_below_ns"]

        def busy(tl):
            out = {}
            for lane, _kind, _name, _s, _e, _n, busy_ns in tl["boxes"]:
                out[lane] = out.get(lane, 0) + busy_ns
            return out
        assert busy(a) == busy(b)
        # the bucket lane covers the whole step, once: its boxes hold the step's time and
        # never overlap
        for tl in (a, b):
            lane = sorted((s, e) for ln, _k, _n, s, e, _c, _b in tl["boxes"] if ln == "step time charged to")
            assert busy(tl)["step time charged to"] == tl["step_ns"]
            assert all(e0 <= s1 for (_s0, e0), (s1, _e1) in zip(lane, lane[1:]))
    # a plain analysis gathers nothing for HTML
    monkeypatch.setattr(report_data, "gather", lambda *a: pytest.fail("gathered without --html"))
    monkeypatch.setattr(report_data, "capture_step_segments",
                        lambda *a: pytest.fail("gathered without --html"))
    analyze(nav, rules, None)


def test_verify_page_has_a_forest_plot_of_the_intervals(tmp_path):
    go = pytest.importorskip("plotly.graph_objects")
    result = verify_result(tmp_path)
    page = tmp_path / "v.html"
    page.write_text(render_verify_html(result), encoding="utf-8")
    fig = figures_of(page)["fig-forest"]
    go.Figure(fig)
    measured = {r["remedy"]: r for r in result["results"] if r.get("comparison")}
    seen = {}
    for tr in fig["data"]:
        for y, x, plus, minus in zip(tr["y"], tr["x"], tr["error_x"]["array"], tr["error_x"]["arrayminus"]):
            seen[y] = (tr["name"], x - minus, x, x + plus)
    assert set(seen) == set(measured)
    for name, r in measured.items():
        verdict, lo, sp, hi = seen[name]
        c = r["comparison"]
        assert verdict == r["verdict"] and sp == c["speedup"]
        assert lo == pytest.approx(c["ci"][0], abs=1e-3) and hi == pytest.approx(c["ci"][1], abs=1e-3)
    assert measured["num_workers"]["verdict"] == "helps"
    assert "needs code change" in page.read_text()


# ---- the command line ----------------------------------------------------------------------

def test_bad_html_paths_are_one_line_errors_before_any_work(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    missing_trace = tmp_path / "nope.json"
    # the output path is checked first: the missing trace is never looked at
    for args, what in (((mine,), "exists and is not a navdoctor HTML report"),
                       ((tmp_path / "no-dir" / "r.html",), "does not exist"),
                       (("/proc/navdoctor-test.html",), "cannot write in /proc"),
                       (("-",), "--html needs a file path"),
                       ((tmp_path,), "is a directory")):
        r = run_cli("analyze", missing_trace, "--html", *args)
        assert r.returncode == 2 and what in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert mine.read_text() == "my notes\n"
    same = tmp_path / "r.out"
    r = run_cli("analyze", missing_trace, "--json", same, "--html", same)
    assert r.returncode == 2 and "is the path of both --json and --html" in r.stderr and not same.exists()
    # diagnose and verify refuse before running the script
    script = tmp_path / "s.py"
    ran = tmp_path / "ran"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    for cmd in (("diagnose", "--no-nsys", "--out", tmp_path / "runs"), ("verify", "--out", tmp_path / "runs",
                                                                         "--remedy", "num_workers")):
        r = run_cli(*cmd, "--html", mine, script, cwd=tmp_path)
        assert r.returncode == 2 and "not a navdoctor HTML report" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not ran.exists() and mine.read_text() == "my notes\n"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".navdoctor-")]


def test_diagnose_writes_report_html_into_its_run_directory(tmp_path):
    loop = tmp_path / "loop.py"
    loop.write_text("import torch\n"
                    "model = torch.nn.Linear(8, 2)\n"
                    "data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 2))\n"
                    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                    "for x, y in torch.utils.data.DataLoader(data, batch_size=4):\n"
                    "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
                    "    opt.zero_grad(); loss.backward(); opt.step()\n")
    extra = tmp_path / "copy.html"
    r = run_cli("diagnose", "--out", tmp_path / "runs", "--no-nsys", "--wait", "1", "--warmup", "1",
                "--steps", "3", "--json", tmp_path / "r.json", "--html", extra, loop, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    page = Path(report["run"]["dir"]) / "report.html"
    assert is_navdoctor_html(page) and is_navdoctor_html(extra)
    assert f"HTML report: {extra}" in r.stdout
    for p in (page, extra):
        text = p.read_text()
        assert f'data-bound="{report["verdict"]["bound"]}"' in text and report["run"]["dir"] in text
        assert f"fig-steps-{report['verdict']['primary_trace']}" in figures_of(p)


def test_replaces_an_earlier_report_only(reports, tmp_path):
    """jpeg.html held a verify page before the fixture's analyze wrote over it."""
    path, _ = reports["jpeg"]
    assert "<!-- navdoctor html report 1 analysis -->" in path.read_text()[:200]


# ---- in a browser ----------------------------------------------------------------------------

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    for c in (os.environ.get("NAVDOCTOR_CHROMIUM"), shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if c and os.path.exists(c):
            return c
    return None


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium installed (tests/install-browser.sh installs Debian's `chromium` "
                    "as root; or set NAVDOCTOR_CHROMIUM): browser tests skipped")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]'): browser tests skipped")
    with sync_playwright() as pw:
        try:
            b = pw.chromium.launch(executable_path=exe, args=BROWSER_ARGS)
        except Exception as e:  # a browser that cannot start here is a skip, not a failure
            pytest.skip(f"Chromium at {exe} does not start: {str(e).splitlines()[0]}")
        yield b
        b.close()


def open_page(browser, path: Path, shot: str):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    problems, requests = [], []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.charts !== undefined", timeout=60_000)
    assert page.evaluate("document.body.dataset.charts") == "drawn", page.inner_text("#nd-status")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    assert (ARTIFACTS / shot).stat().st_size > 10_000
    assert problems == []
    assert requests == [path.as_uri()]      # the page itself, nothing else
    return page


def drawn_charts(page) -> dict:
    return page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll('.chart')).map(d => {
        const svg = d.querySelector('svg.main-svg'); const r = svg ? svg.getBoundingClientRect() : null;
        return [d.id, {w: r ? r.width : 0, h: r ? r.height : 0,
                       marks: d.querySelectorAll('.cartesianlayer .point, .cartesianlayer .js-line').length,
                       legend: Array.from(d.querySelectorAll('.legendtext')).map(t => t.textContent)}];
    }))""")


@pytest.mark.parametrize("name", ["memsync", "jpeg"])
def test_analysis_page_in_chromium(browser, reports, name):
    path, report = reports[name]
    page = open_page(browser, path, f"html-report-{name}.png")
    charts = drawn_charts(page)
    figs = figures_of(path)
    assert set(charts) == set(figs)
    for fid, c in charts.items():
        assert c["w"] > 300 and c["h"] > 100 and c["marks"] > 0, (fid, c)
    # every bucket with time in a trace's steps has its legend entry in that trace's chart
    for t in report["verdict"]["per_trace"]:
        legend = set(charts[f"fig-steps-{t['trace_id']}"]["legend"])
        present = {b for b, s in t["shares"].items() if s > 0}
        assert {BUCKET_LABEL[b] for b in present} <= legend, (legend, present)
    for which in ("typical", "slowest"):
        if f"fig-timeline-{which}" in charts:
            legend = charts[f"fig-timeline-{which}"]["legend"]
            assert any(x.startswith("charged to: ") for x in legend) and "kernel" in legend
    shown = page.evaluate("Array.from(document.querySelectorAll('.finding')).map(f => f.dataset.rule)")
    assert shown == [f["rule"] for f in report["findings"]] and shown
    # the kernel table sorts on a click: first descending, then ascending
    if page.locator("#nd-kernels").count():
        def calls():
            return page.evaluate("Array.from(document.querySelectorAll('#nd-kernels tbody tr'))"
                                 ".map(r => +r.cells[3].textContent)")
        assert len(calls()) > 1
        page.click("#nd-kernels th:nth-child(4)")
        assert calls() == sorted(calls(), reverse=True)
        page.click("#nd-kernels th:nth-child(4)")
        assert calls() == sorted(calls())
    page.close()


def test_verify_page_in_chromium(browser, reports):
    path, _ = reports["verify"]
    page = open_page(browser, path, "html-report-verify.png")
    charts = drawn_charts(page)
    assert charts["fig-forest"]["w"] > 300 and charts["fig-forest"]["marks"] > 0
    assert {"helps", "no effect"} <= set(charts["fig-forest"]["legend"])
    rows = page.evaluate("Array.from(document.querySelectorAll('#nd-verify-table tbody tr')).map(r => r.dataset.remedy)")
    assert rows == ["num_workers", "channels_last", "batch_size"]
    page.close()


def test_compare_page_holds_the_comparison(reports):
    path, result = reports["compare"]
    assert is_navdoctor_html(path)
    figs = figures_of(path)
    assert set(figs) == {"fig-compare-step", "fig-compare-buckets"}
    step = figs["fig-compare-step"]["data"][0]
    assert step["x"] == [result["step_time"]["speedup"]] and step["name"] == result["step_time"]["result"]
    # one bar trace per bucket with time on either side, in the report's colours
    want = {b["bucket"] for b in result["buckets"] if b["before_ms"] or b["after_ms"]}
    got = {t["legendgroup"]: t for t in figs["fig-compare-buckets"]["data"]}
    assert set(got) == want
    for b in result["buckets"]:
        if b["bucket"] in got:
            assert got[b["bucket"]]["x"] == [b["before_ms"], b["after_ms"]]
            assert got[b["bucket"]]["marker"]["color"] == BUCKET_COLOR[b["bucket"]]
    text = path.read_text(encoding="utf-8")
    for rule in result["findings"]["disappeared"]:
        assert rule in text


def test_compare_html_path_is_checked_before_any_work(tmp_path):
    other = tmp_path / "notes.html"
    other.write_text("<html>mine</html>")
    r = run_cli("compare", GPU / "memory_item_sync" / "nsys.sqlite.gz",
                GPU / "memory_item_sync_fixed" / "nsys.sqlite.gz", "--html", other)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert other.read_text() == "<html>mine</html>"


def test_compare_page_in_chromium(browser, reports):
    path, result = reports["compare"]
    page = open_page(browser, path, "html-report-compare.png")
    charts = drawn_charts(page)
    assert charts["fig-compare-step"]["w"] > 300 and charts["fig-compare-step"]["marks"] > 0
    assert charts["fig-compare-buckets"]["w"] > 300
    present = {b["bucket"] for b in result["buckets"] if b["before_ms"] or b["after_ms"]}
    assert {BUCKET_LABEL[b] for b in present} <= set(charts["fig-compare-buckets"]["legend"])
    gone = page.evaluate("Array.from(document.querySelectorAll('[data-change=disappeared]')).map(c => c.textContent)")
    assert gone == result["findings"]["disappeared"] and gone
    page.close()


def test_html_report_of_kernels_without_a_name(tmp_path):
    """A Kineto trace whose kernels carry no name (null) gets its HTML report: the top-kernels
    table says "(no name)" instead of the command failing on them."""
    events = []
    corr = 0
    for step in range(2):
        t0 = 1_700_000_000_000.0 + step * 10_000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": 1, "tid": 1, "ts": t0, "dur": 10_000})
        for i in range(3):
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                           "tid": 1, "ts": t0 + 100 + 10 * i, "dur": 4.0, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": None if step else "ampere_sgemm_128x64_tn",
                           "pid": 0, "tid": "stream 7", "ts": t0 + 130 + 2000 * i, "dur": 1900,
                           "args": {"device": 0, "stream": 7, "correlation": corr}})
    trace = tmp_path / "nameless.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    out = tmp_path / "r.html"
    r = run_cli("analyze", trace, "--html", out, "-q")
    assert r.returncode in (0, 1), r.stderr
    assert "(no name)" in out.read_text()


# ---- the layout at the screens people use -------------------------------------------------

REFERENCE = ROOT / "tests" / "data"
THUMB = 4            # reference screenshots are kept at a quarter of the screen's width
# (NAVDOCTOR_UPDATE_SCREENSHOTS=1 rewrites them from the page as drawn here)

_COMPARE_JS = """async ([shot, ref, w, h, write]) => {
  const load = src => new Promise((ok, bad) => { const i = new Image(); i.onload = () => ok(i);
                                                 i.onerror = () => bad(new Error('image')); i.src = src; });
  const pixels = img => { const c = document.createElement('canvas'); c.width = w; c.height = h;
    const g = c.getContext('2d'); g.drawImage(img, 0, 0, w, h); return [c, g.getImageData(0, 0, w, h).data]; };
  const [canvas, a] = pixels(await load('data:image/png;base64,' + shot));
  if (write) return {png: canvas.toDataURL('image/png').split(',')[1]};
  const [, b] = pixels(await load('data:image/png;base64,' + ref));
  let sum = 0;
  for (let i = 0; i < a.length; i += 4)
    sum += (Math.abs(a[i] - b[i]) + Math.abs(a[i + 1] - b[i + 1]) + Math.abs(a[i + 2] - b[i + 2])) / 3;
  return {diff: sum / (a.length / 4) / 255};
}"""

_BOXES_JS = """() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {l: r.left, t: r.top + scrollY, r: r.right, b: r.bottom + scrollY}; };
  const one = s => { const e = document.querySelector(s); return e ? box(e) : null; };
  return {answer: one('#nd-answer'), findings: one('#nd-findings'), verdict: one('#nd-verdict'),
          charts: Array.from(document.querySelectorAll('.chart')).map(c => ({id: c.id, ...box(c)})),
          titles: Array.from(document.querySelectorAll('h3.chart-title')).map(t => ({id: t.id, ...box(t)})),
          modebars: Array.from(document.querySelectorAll('.modebar-container, .modebar')).map(box),
          scrollWidth: document.documentElement.scrollWidth,
          clientWidth: document.documentElement.clientWidth};
}"""


def _overlap(a, b) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


@pytest.mark.parametrize("width, height", [(1366, 768), (1920, 1080)])
def test_the_answer_comes_first_at_common_screen_sizes(browser, reports, width, height):
    """At a laptop's 1366x768 and a desktop's 1920x1080: the verdict, then what to do first,
    then the findings, whose top is on the first screen; every chart after them; no chart title
    under plotly's mode bar; nothing wider than the window. The first screen, at a quarter of
    its size, matches the reference screenshot in tests/data."""
    import base64
    path, report = reports["memsync"]
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.charts !== undefined", timeout=60_000)
    assert page.evaluate("document.body.dataset.charts") == "drawn"
    boxes = page.evaluate(_BOXES_JS)
    assert boxes["verdict"]["t"] < boxes["answer"]["t"] < boxes["findings"]["t"] < height, boxes
    assert re.match(r"expected \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\dx\)", page.inner_text("#nd-expected"))
    assert report["findings"][0]["remedies"][0]["code"].splitlines()[0].strip() in page.inner_text("#nd-answer")
    assert boxes["charts"] and all(c["t"] > boxes["findings"]["b"] for c in boxes["charts"]), boxes["charts"]
    assert len(boxes["titles"]) == len(boxes["charts"]) and boxes["modebars"]
    for t in boxes["titles"]:
        assert not any(_overlap(t, m) for m in boxes["modebars"]), t
    assert boxes["scrollWidth"] <= boxes["clientWidth"], boxes
    shot = base64.b64encode(page.screenshot()).decode()
    w, h = width // THUMB, height // THUMB
    ref = REFERENCE / f"html-first-screen-{width}.png"
    scratch = browser.new_page()         # a blank page: the report's own policy stays as it is
    if os.environ.get("NAVDOCTOR_UPDATE_SCREENSHOTS") or not ref.exists():
        png = scratch.evaluate(_COMPARE_JS, [shot, "", w, h, True])["png"]
        ref.write_bytes(base64.b64decode(png))
    diff = scratch.evaluate(_COMPARE_JS, [shot, base64.b64encode(ref.read_bytes()).decode(), w, h, False])["diff"]
    # fonts and anti-aliasing move a few pixels; a section moved, added or dropped moves many
    assert diff < 0.03, f"the first screen differs from {ref.name} by {diff:.1%}"
    scratch.close()
    page.close()
