"""The HTML report: one self-contained file (styles, data and Plotly inline; no network), for
`analyze`, `diagnose` and `verify` (--html PATH).

The charts are Plotly figures built here as plain dicts (data + layout) and drawn by plotly.js,
which the page carries gzip-compressed and base64-encoded (about 1.9 MB instead of 4.8 MB) and
inflates with the browser's own DecompressionStream before it runs (docs/report.md says why).
Tables, findings and metadata are plain HTML, readable even where scripts do not run.
"""
from __future__ import annotations

import base64
import datetime
import functools
import gzip
import html
import json
import os
from pathlib import Path
from typing import Any

from .. import __version__
from ..breakdown import BUCKETS
from ..kernelnames import cut_name, display_kernel_name
from ..report import (NO_FINDINGS, Answer, bound_text, class_text, expected_text, settle_text,
                      stake_text, step_words)
from .data import KIND_BUCKET

HTML_MARK = "<!-- navdoctor html report"
SCHEMA = "1"  # the HTML page's own layout version, in its marker line

# One colour per bucket, everywhere (step bars, shares, timelines, legends).
BUCKET_COLOR = {"compute": "#2e7d32", "comm": "#7b1fa2", "copy": "#1565c0", "data": "#ef6c00",
                "sync": "#c62828", "launch": "#f9a825", "host": "#6d4c41", "idle": "#9e9e9e"}
BUCKET_LABEL = {"compute": "GPU compute", "comm": "exposed communication",
                "copy": "host<->device copy", "data": "waiting for data",
                "sync": "sync stalls", "launch": "launch/CPU overhead",
                "host": "CPU work (no launches)", "idle": "other idle"}
CLASS_COLOR = {"compute": BUCKET_COLOR["compute"], "memory": BUCKET_COLOR["copy"],
               "io": BUCKET_COLOR["data"], "launch": BUCKET_COLOR["launch"]}
CLASS_LABEL = {"io": "I/O (data + host)", "compute": "compute",
               "memory": "memory (copy + sync + comm)", "launch": "launch"}
VERDICT_COLOR = {"helps": "#2e7d32", "no effect": "#757575", "hurts": "#c62828",
                 "inconclusive": "#ef6c00", "failed": "#000000"}
SEVERITY_COLOR = {"critical": "#b71c1c", "high": "#c62828", "medium": "#ef6c00",
                  "low": "#0277bd", "info": "#616161"}


def bucket_label(bucket: str, has_gpu: bool = True) -> str:
    """A bucket's name in the page; in a trace without a GPU timeline, compute is CPU ops."""
    return "CPU ops (no GPU in the trace)" if bucket == "compute" and not has_gpu else BUCKET_LABEL[bucket]


def is_navdoctor_html(path: str | Path) -> bool:
    """Whether the file is an HTML report navdoctor wrote (its marker line near the top)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return HTML_MARK.encode() in head


@functools.lru_cache(maxsize=1)
def plotly_bundle() -> tuple[str, str]:
    """(base64 of the gzip-compressed plotly.min.js that the installed plotly package ships,
    plotly.js version)."""
    try:
        import plotly
    except ImportError as e:  # a declared dependency; still one line if it is missing
        from ..errors import NavdoctorError
        raise NavdoctorError("the HTML report needs the plotly package (pip install plotly)") from e
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    raw = path.read_bytes()
    version = "?"
    head = raw[:200].decode("ascii", "replace")
    if "plotly.js v" in head:
        version = head.split("plotly.js v", 1)[1].split()[0]
    return base64.b64encode(gzip.compress(raw, 6, mtime=0)).decode("ascii"), version


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _json_for_script(obj: Any) -> str:
    """JSON safe inside <script>: no '</script>', no HTML comment openers."""
    text = json.dumps(obj, separators=(",", ":"), default=str)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _ms(ns: float | int | None, digits: int = 3) -> float | None:
    return None if ns is None else round(ns / 1e6, digits)


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"


def _fmt_us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:.1f}"


# ---- figures (plain Plotly dicts) ----------------------------------------------------------

# The chart's title is HTML above its plot (chart_html), never inside it: plotly draws its mode
# bar (zoom, pan, download) at the plot's top right, where a long title ran under it. The top
# margin leaves the mode bar its own strip above the axes.
_BASE_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 32, "b": 50}, "font": {"size": 12},
                "legend": {"orientation": "h", "y": -0.2}, "paper_bgcolor": "white",
                "plot_bgcolor": "white"}


def _layout(**kw) -> dict:
    """The common layout; the legend goes under the x axis's title, a fixed number of pixels
    below the plot whatever the figure's height."""
    out = json.loads(json.dumps(_BASE_LAYOUT))
    out.update(kw)
    height = out.get("height", 450)
    out["margin"] = dict(out["margin"], b=130 if out.get("showlegend", True) else 60)
    plot_h = max(height - out["margin"]["t"] - out["margin"]["b"], 40)
    out["legend"] = dict(out["legend"], y=-62 / plot_h, yanchor="top", x=0)
    return out


def chart_html(figures: dict[str, dict], fid: str, fig: dict) -> str:
    """A chart's HTML: its title as a heading above the plot (taken out of the figure's layout),
    then the plot's div; the figure is added to `figures` for the page's script to draw."""
    title = (fig.get("layout") or {}).pop("title", None)
    text = title.get("text") if isinstance(title, dict) else title
    figures[fid] = fig
    head = f'<h3 class="chart-title" id="{fid}-title">{_e(text)}</h3>' if text else ""
    return f'{head}<div class="chart" id="{fid}"></div>'


def shares_figure(report) -> dict:
    """One stacked bar per trace: its step's buckets as shares."""
    traces = report.verdict.per_trace or []
    rows = [(f"trace {t.trace_id} ({t.source})" + (" *" if t.trace_id == report.verdict.primary_trace else ""),
             t.shares) for t in traces]
    data = []
    gpu = any(t.has_gpu for t in traces)
    for b in BUCKETS:
        xs = [round(100 * (s.get(b) or 0), 2) for _, s in rows]
        if not any(xs):
            continue
        label = bucket_label(b, gpu)
        data.append({"type": "bar", "orientation": "h", "name": label, "x": xs,
                     "y": [r for r, _ in rows], "marker": {"color": BUCKET_COLOR[b]},
                     "legendgroup": b, "hovertemplate": "%{y}: %{x:.1f}%<extra>" + label + "</extra>"})
    return {"data": data, "layout": _layout(
        barmode="stack", height=220 + 40 * len(rows), title={"text": "Where the step goes (share of step time; * = the verdict's trace)"},
        xaxis={"title": {"text": "% of step time"}, "range": [0, 100]}, yaxis={"automargin": True})}


def classes_figure(report) -> dict:
    v = report.verdict
    classes = [c for c in ("io", "compute", "memory", "launch") if c in v.class_shares]
    ys = [round(100 * v.class_shares[c], 2) for c in classes]
    text = []
    for c in classes:
        g = v.estimated_gain.get(c)
        text.append(f"bound {g['speedup_up_to']:.2f}x" if g else "")
    return {"data": [{"type": "bar", "x": [CLASS_LABEL[c] for c in classes], "y": ys, "text": text,
                      "textposition": "outside", "name": "class share",
                      "marker": {"color": [CLASS_COLOR[c] for c in classes]},
                      "hovertemplate": "%{x}: %{y:.1f}% of the step<br>%{text}<extra></extra>"}],
            "layout": _layout(height=320, showlegend=False,
                              title={"text": "Class shares and the bound were each cause gone entirely"},
                              yaxis={"title": {"text": "% of step time"}, "range": [0, 115]})}


def steps_figure(trace_id: int, source: str, steps: dict, budget: dict | None,
                 has_gpu: bool = True) -> dict:
    xs = [str(n) for n in steps["step_num"]]
    data = []
    for b in BUCKETS:
        ys = [_ms(v) for v in steps["buckets"][b]]
        if not any(ys):
            continue
        label = bucket_label(b, has_gpu)
        data.append({"type": "bar", "name": label, "x": xs, "y": ys,
                     "marker": {"color": BUCKET_COLOR[b]}, "legendgroup": b,
                     "hovertemplate": "step %{x}: %{y:.3f} ms<extra>" + label + "</extra>"})
    stall_x = [x for x, s in zip(xs, steps["stall"]) if s]
    if stall_x:
        top = {x: _ms(n) for x, n in zip(xs, steps["step_ns"])}
        data.append({"type": "scatter", "mode": "markers", "name": "stall step (left out of the shares)",
                     "x": stall_x, "y": [top[x] * 1.04 for x in stall_x],
                     "marker": {"symbol": "triangle-down", "size": 12, "color": "#000"},
                     "hovertemplate": "step %{x}: isolated stall<extra></extra>"})
    shapes = []
    if budget:
        b_ms = _ms(budget["budget_ns"])
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": b_ms, "y1": b_ms,
                       "line": {"color": "#d50000", "dash": "dash", "width": 2},
                       "showlegend": True, "name": f"frame budget {b_ms:g} ms ({budget['rule']})"})
    shown = len(xs)
    title = f"Every step of trace {trace_id} ({source}), stacked by bucket"
    if steps.get("steps_total", shown) > shown:
        title += f" ({shown} of {steps['steps_total']} steps drawn: an even sample, every stall and the slowest 50)"
    return {"data": data, "layout": _layout(
        barmode="stack", height=380, title={"text": title}, shapes=shapes,
        xaxis={"title": {"text": "step"}, "type": "category"},
        yaxis={"title": {"text": "ms"}})}


def timeline_figure(tl: dict, has_gpu: bool = True) -> dict:
    by_kind: dict[str, list] = {}
    for lane, kind, name, s, e, n, busy in tl["boxes"]:
        by_kind.setdefault(kind, []).append((lane, name, s, e, n, busy))
    data = []
    order = [k for k in KIND_BUCKET if k in by_kind] + [b for b in BUCKETS if b in by_kind]
    for kind in order:
        boxes = by_kind[kind]
        bucket = KIND_BUCKET.get(kind, kind)
        is_bucket = kind in BUCKETS
        marker: dict[str, Any] = {"color": BUCKET_COLOR.get(bucket, "#999"), "line": {"width": 0}}
        if kind == "memset":
            marker["pattern"] = {"shape": "/"}
        text = []
        for lane, name, s, e, n, busy in boxes:
            dur = (e - s) / 1e3
            extra = f"<br>{n} merged, busy {busy / 1e3:.1f} us" if n > 1 else ""
            text.append(f"{_e(name)}<br>{dur:.1f} us at +{s / 1e6:.3f} ms{extra}")
        data.append({"type": "bar", "orientation": "h",
                     "name": ("charged to: " + bucket_label(kind, has_gpu)) if is_bucket else kind,
                     "legendgroup": bucket if is_bucket else kind,
                     "y": [b[0] for b in boxes], "x": [round((b[3] - b[2]) / 1e6, 6) for b in boxes],
                     "base": [round(b[2] / 1e6, 6) for b in boxes], "width": 0.8,
                     "marker": marker, "hovertext": text, "hoverinfo": "text"})
    lanes = list(reversed(tl["lanes"]))
    title = (f"{'Typical' if tl['which'] == 'typical' else 'Slowest'} step: step {tl['step_num']} of "
             f"trace {tl['trace_id']}, {_ms(tl['step_ns']):.2f} ms ({tl['events']} events, "
             f"{tl['drawn']} boxes drawn; events under {tl['merge_below_ns'] / 1e3:.1f} us merged)")
    return {"data": data, "layout": _layout(
        barmode="overlay", height=170 + 45 * len(lanes), title={"text": title},
        xaxis={"title": {"text": "ms from the step's start"}, "range": [0, _ms(tl["step_ns"], 6)]},
        yaxis={"categoryorder": "array", "categoryarray": lanes, "type": "category",
               "fixedrange": True, "automargin": True},
        dragmode="zoom", hovermode="closest")}


def memory_figure(mem: dict) -> dict:
    xs = [str(s) for s in mem["steps"]]
    mib = lambda vs: [None if v is None else round(v / 2**20, 2) for v in vs]  # noqa: E731
    data = [{"type": "scatter", "mode": "lines+markers", "name": "peak allocated", "x": xs,
             "y": mib(mem["peak_allocated"]), "line": {"color": BUCKET_COLOR["copy"]}},
            {"type": "scatter", "mode": "lines", "name": "lowest allocated", "x": xs,
             "y": mib(mem["low_allocated"]), "line": {"color": BUCKET_COLOR["copy"], "dash": "dot"}}]
    if any(v is not None for v in mem["peak_reserved"]):
        data.append({"type": "scatter", "mode": "lines", "name": "peak reserved (caching allocator)",
                     "x": xs, "y": mib(mem["peak_reserved"]), "line": {"color": "#455a64"}})
    return {"data": data, "layout": _layout(
        height=340, title={"text": f"GPU memory per step (trace {mem['trace_id']})"},
        xaxis={"title": {"text": "step"}, "type": "category"}, yaxis={"title": {"text": "MiB"}})}


def _margin_shapes(margin: float) -> list[dict]:
    """A speed-up axis's marks: no change (1) and the grey band within the margin."""
    return [{"type": "line", "x0": 1, "x1": 1, "y0": 0, "y1": 1, "yref": "paper",
             "line": {"color": "#000", "width": 1}},
            {"type": "rect", "x0": 1 / (1 + margin), "x1": 1 + margin, "y0": 0, "y1": 1,
             "yref": "paper", "fillcolor": "rgba(0,0,0,0.06)", "line": {"width": 0}}]


def forest_figure(result: dict) -> dict:
    rows = [r for r in result.get("results", []) if (r.get("comparison") or {}).get("speedup")]
    margin = (result.get("settings") or {}).get("margin", 0.05)
    data = []
    names = [r["remedy"] for r in rows]
    for verdict in dict.fromkeys(r.get("verdict") for r in rows):
        sel = [r for r in rows if r.get("verdict") == verdict]
        sp = [r["comparison"]["speedup"] for r in sel]
        lo = [(r["comparison"].get("ci") or [None, None])[0] for r in sel]
        hi = [(r["comparison"].get("ci") or [None, None])[1] for r in sel]
        data.append({"type": "scatter", "mode": "markers", "name": str(verdict),
                     "x": sp, "y": [r["remedy"] for r in sel],
                     "marker": {"size": 12, "color": VERDICT_COLOR.get(verdict, "#333")},
                     "error_x": {"type": "data", "symmetric": False,
                                 "array": [round(h - s, 4) if h is not None else 0 for h, s in zip(hi, sp)],
                                 "arrayminus": [round(s - lo_, 4) if lo_ is not None else 0 for lo_, s in zip(lo, sp)],
                                 "thickness": 2, "width": 6},
                     "customdata": [[l_, h] for l_, h in zip(lo, hi)],
                     "hovertemplate": "%{y}: %{x:.3f}x (CI %{customdata[0]:.3f} to %{customdata[1]:.3f})<extra>"
                                      + _e(verdict) + "</extra>"})
    xs = [v for r in rows for v in [r["comparison"]["speedup"], *(r["comparison"].get("ci") or [])] if v]
    lo_x, hi_x = min(xs + [1 / (1 + margin)]) * 0.95, max(xs + [1 + margin]) * 1.05
    shapes = _margin_shapes(margin)
    return {"data": data, "layout": _layout(
        height=160 + 50 * max(len(names), 1), shapes=shapes,
        title={"text": f"Speed-up per remedy with its {result.get('settings', {}).get('confidence', 0.95):.0%} "
                       f"interval (grey band: within the ±{margin:.0%} margin)"},
        xaxis={"title": {"text": "speed-up (baseline step / remedy step)"}, "type": "log",
               "range": [_log10(lo_x), _log10(hi_x)]},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(names)), "type": "category",
               "automargin": True})}


def _log10(x: float) -> float:
    import math
    return math.log10(max(x, 1e-6))


# ---- page ----------------------------------------------------------------------------------

_CSS = """
:root{--fg:#212121;--muted:#616161;--line:#e0e0e0;--bg:#fafafa}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{background:#263238;color:#fff;padding:16px 24px}header h1{margin:0;font-size:22px}
header .sub{color:#cfd8dc;font-size:13px;margin-top:4px}
nav{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid var(--line);padding:6px 24px;font-size:13px}
nav a{margin-right:14px;color:#1565c0;text-decoration:none}
main{max-width:1280px;margin:0 auto;padding:8px 24px 40px}
section{background:#fff;border:1px solid var(--line);border-radius:6px;padding:12px 16px;margin:14px 0}
h2{font-size:17px;margin:4px 0 10px}h3{font-size:15px;margin:12px 0 6px}
.verdict{font-size:20px;font-weight:600}.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:12px;font-weight:600;vertical-align:middle}
.muted{color:var(--muted)}.chart{width:100%;min-height:120px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid var(--line);padding:4px 6px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f5f5f5;position:sticky;top:31px}
table.sortable th{cursor:pointer;user-select:none}table.sortable th:after{content:" \\2195";color:#bbb}
td.name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.finding{border-left:5px solid #999;padding:6px 12px;margin:10px 0;background:#fcfcfc}
.finding h3{margin:2px 0 4px}pre{background:#f5f5f5;padding:8px;border-radius:4px;overflow:auto;font-size:12px;margin:4px 0}
details summary{cursor:pointer;color:#1565c0}.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.warn{color:#8d6e00}.err{color:#b71c1c}#nd-status{font-size:12px;color:var(--muted)}
h3.chart-title{font-size:14px;font-weight:600;margin:16px 0 0}
#nd-answer{border-left:5px solid #2e7d32}#nd-answer .do{font-size:16px;font-weight:600}
#nd-answer .why{margin:2px 0 6px}
main{overflow-wrap:anywhere}
"""

_BOOT_JS = r"""
(function(){
  var status = document.getElementById('nd-status');
  function say(t){ if (status) status.textContent = t; }
  function b64bytes(b64){ var bin = atob(b64), n = bin.length, out = new Uint8Array(n);
    for (var i = 0; i < n; i++) out[i] = bin.charCodeAt(i); return out; }
  async function loadPlotly(){
    if (window.Plotly) return;
    if (typeof DecompressionStream === 'undefined') throw new Error('this browser has no DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+ have it)');
    var el = document.getElementById('nd-plotly');
    var stream = new Blob([b64bytes(el.textContent.trim())]).stream().pipeThrough(new DecompressionStream('gzip'));
    var code = await new Response(stream).text();
    var s = document.createElement('script'); s.textContent = code; document.head.appendChild(s);
    el.textContent = '';
  }
  function sortable(){
    document.querySelectorAll('table.sortable').forEach(function(t){
      t.querySelectorAll('th').forEach(function(th, col){
        th.addEventListener('click', function(){
          var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
          var dir = th.dataset.dir === 'desc' ? 1 : -1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
          rows.sort(function(a, b){
            var x = a.cells[col].dataset.v !== undefined ? a.cells[col].dataset.v : a.cells[col].textContent;
            var y = b.cells[col].dataset.v !== undefined ? b.cells[col].dataset.v : b.cells[col].textContent;
            var nx = parseFloat(x), ny = parseFloat(y);
            if (!isNaN(nx) && !isNaN(ny)) return dir * (nx - ny);
            return dir * String(x).localeCompare(String(y));
          });
          rows.forEach(function(r){ body.appendChild(r); });
        });
      });
    });
  }
  async function main(){
    sortable();
    var data = JSON.parse(document.getElementById('nd-data').textContent);
    say('drawing charts...');
    var t0 = performance.now();
    await loadPlotly();
    document.body.dataset.plotlyMs = Math.round(performance.now() - t0);
    var config = {displaylogo: false, responsive: true, scrollZoom: false,
                  modeBarButtonsToRemove: ['select2d', 'lasso2d']};
    var ids = Object.keys(data.figures);
    for (var i = 0; i < ids.length; i++) {
      var div = document.getElementById(ids[i]); var f = data.figures[ids[i]];
      if (div) await Plotly.newPlot(div, f.data, f.layout, config);
    }
    document.body.dataset.charts = 'drawn';
    document.body.dataset.drawMs = Math.round(performance.now() - t0);
    say('');
  }
  main().catch(function(e){ say('charts could not be drawn: ' + e.message); document.body.dataset.charts = 'failed'; console.error(e); });
})();
"""


def _page(title: str, subtitle: str, nav: list[tuple[str, str]], body: list[str],
          figures: dict[str, dict], kind: str) -> str:
    bundle, plotly_version = plotly_bundle()
    nav_html = "".join(f'<a href="#{i}">{_e(t)}</a>' for i, t in nav)
    return "".join([
        "<!DOCTYPE html>\n",
        f"{HTML_MARK} {SCHEMA} {kind} -->\n",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # No network: nothing but inline scripts, styles and data: images may load.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; "
        "font-src data:; connect-src 'none'\">",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1><div class=\"sub\">{subtitle}</div></header>",
        f'<nav>{nav_html}<span id="nd-status">loading charts...</span></nav><main>',
        *body,
        f'<p class="muted">Made by navdoctor {_e(__version__)} on '
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; charts drawn with plotly.js "
        f"{_e(plotly_version)} (MIT licence), carried inside this file. No network access.</p>",
        "</main>",
        f'<script type="application/json" id="nd-data">{_json_for_script({"figures": figures})}</script>',
        f'<script type="application/gzip+base64" id="nd-plotly">{bundle}</script>',
        f"<script>{_BOOT_JS}</script></body></html>\n"])


def _finding_html(i: int, f) -> str:
    color = SEVERITY_COLOR.get(f.severity, "#999")
    stake = ""
    if f.at_stake_ms_per_step:
        stake = f" <span class=\"muted\">{_e(stake_text(f, ' of the step'))}</span>"
    ev = "".join(f"<tr><td>{_e(k)}</td><td class=\"n\">{_e(_num(v))}</td></tr>"
                 for k, v in f.evidence.items())
    rem = []
    for r in f.remedies:
        item = (f"<li><b>{_e(r.title)}</b>"
                + (f' <span class="muted">[{_e(expected_text(r.speedup_expected, r.speedup_range))}]</span>'
                   if r.speedup_expected else "")
                + (f": {_e(r.text)}" if r.text else ""))
        if r.code:
            item += f"<pre>{_e(r.code.rstrip())}</pre>"
        if r.link:
            link = (f'<a href="{_e(r.link)}" rel="noreferrer noopener" target="_blank">{_e(r.link)}</a>'
                    if r.link.startswith(("https://", "http://")) else _e(r.link))
            item += f' <span class="muted">({link})</span>'
        if r.verify:
            item += f' <span class="muted">verify: <code>navdoctor verify --remedy {_e(r.verify)}</code></span>'
        rem.append(item + "</li>")
    return (f'<div class="finding" style="border-left-color:{color}" data-rule="{_e(f.rule)}">'
            f'<h3>{i}. <span class="badge" style="background:{color}">{_e(f.severity.upper())}</span> '
            f"{_e(f.category)}: {_e(f.title)}{stake}</h3>"
            f"<div>{_e(f.message)}</div>"
            + (f"<h4>Remedies</h4><ul>{''.join(rem)}</ul>" if rem else "")
            + f"<details><summary>numbers (rule {_e(f.rule)}"
            + (f", trace{'s' if len(f.traces) > 1 else ''} {_e(', '.join(map(str, f.traces)))}"
               if f.traces else "") + f")</summary><table>{ev}</table></details></div>")


def _num(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _kernels_html(k: dict, source: str) -> str:
    rows = []
    for r in k["rows"]:
        share = r["total_ns"] / k["total_ns"] if k["total_ns"] else 0
        per_step = r["calls"] / k["steps"] if k.get("steps") else None
        tc = {True: "yes", False: "no", None: "?"}[r["tensor_cores"]]
        occ = "-" if r["occupancy"] is None else f"{r['occupancy']:.2f}"
        if r.get("occupancy_from"):
            occ += f" (trace {r['occupancy_from']})"
        name = r["name"] or "(no name)"
        rows.append(f'<tr><td class="name" title="{_e(name)}">{_e(display_kernel_name(name, 200))}</td>'
                    f'<td class="n" data-v="{r["total_ns"]}">{r["total_ns"] / 1e6:.3f}</td>'
                    f'<td class="n" data-v="{share}">{share:.1%}</td>'
                    f'<td class="n">{r["calls"]}</td>'
                    f'<td class="n">{"-" if per_step is None else f"{per_step:.1f}"}</td>'
                    f'<td class="n" data-v="{r["mean_ns"]}">{_fmt_us(r["mean_ns"])}</td>'
                    f"<td>{tc}{' (comm)' if r['communication'] else ''}</td>"
                    f'<td class="n" data-v="{-1 if r["occupancy"] is None else r["occupancy"]}">{occ}</td></tr>')
    return (f'<p class="muted">Trace {k["trace_id"]} ({_e(source)}), steady steps: '
            f"{k['total_ns'] / 1e6:.2f} ms of kernels over {k.get('steps') or '?'} steps, "
            f"{k['distinct']} distinct kernels; top {len(rows)} by total time. Click a column to sort. "
            "Tensor cores from the kernel name (? = the name does not say); occupancy is the "
            "profiler's estimate where the trace records it.</p>"
            '<table class="sortable" id="nd-kernels"><thead><tr><th>kernel</th><th class="n">total ms</th>'
            '<th class="n">share</th><th class="n">calls</th><th class="n">calls/step</th>'
            '<th class="n">mean us</th><th>tensor cores</th><th class="n">occupancy</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _ops_html(o: dict, source: str) -> str:
    rows = [f'<tr><td class="name" title="{_e(r["name"])}">{_e(cut_name(r["name"], 200))}</td>'
            f'<td class="n" data-v="{r["total_ns"]}">{r["total_ns"] / 1e6:.3f}</td>'
            f'<td class="n">{r["calls"]}</td>'
            f'<td class="n" data-v="{r["mean_ns"]}">{_fmt_us(r["mean_ns"])}</td></tr>' for r in o["rows"]]
    return (f'<p class="muted">Trace {o["trace_id"]} ({_e(source)}), host-side PyTorch operators '
            "in the steady steps, top by total (inclusive) time: an operator's time includes the "
            "operators it calls.</p>"
            '<table class="sortable" id="nd-operators"><thead><tr><th>operator</th><th class="n">total ms</th>'
            '<th class="n">calls</th><th class="n">mean us</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def render_report_html(report, data: dict | None) -> str:
    """The HTML page of one analysis: `report` (navdoctor.report.Report) and the views gathered
    from its store (navdoctor.reporters.data.gather)."""
    page = _ReportPage(report, data or {})
    # the answer first: the verdict, what to do first, the findings; then the charts and tables
    sections = [page.verdict(), page.answer(), page.findings(), page.shares(), page.steps(),
                page.timelines(), page.kernels(), page.operators(), page.memory(), page.traces(),
                page.inputs()]
    sections = [s for s in sections if s is not None]
    nav = [(anchor, label) for anchor, label, _html in sections]
    body = [html_text for _anchor, _label, html_text in sections]
    v = report.verdict
    names = ", ".join(Path(i.path).name for i in report.inputs)
    head = v.bound.upper() if v.bound else "?"
    subtitle = (f"{_e(head)} · confidence {v.confidence:.2f} · {_e(page.step_words)} · {_e(names)}")
    return _page(f"navdoctor report: {v.bound}-bound" if v.bound not in ("balanced", "unknown")
                 else f"navdoctor report: {v.bound}", subtitle, nav, body, page.figures, "analysis")


class _ReportPage:
    """The sections of one analysis's page, each (anchor, nav label, HTML) or None where it
    has nothing to show; the figures they draw collect in `figures`."""

    def __init__(self, report, data: dict):
        self.report, self.data = report, data
        self.v = report.verdict
        self.src = {i.trace_id: i.source for i in report.inputs}
        self.gpu_of = {t.trace_id: t.has_gpu for t in self.v.per_trace}
        self.figures: dict[str, dict] = {}
        v = self.v
        self.step_words = step_words(v)

    def verdict(self):
        report, v, src = self.report, self.v, self.src
        html_text = (
            '<section id="nd-verdict"><h2>Verdict</h2>'
            f'<div class="verdict" id="nd-bound" data-bound="{_e(v.bound)}">{_e(bound_text(v))}</div>'
            f'<div>confidence <b>{v.confidence:.2f}</b>'
            + (f'; <span class="warn" id="nd-close">close call with {_e(" and ".join(v.close_to))}</span>'
               if v.close_to else "")
            + f'; {_e(self.step_words)}'
            + (f"; steps from {_e(v.step_source)}" if v.step_source else "")
            + (f"; verdict from trace {v.primary_trace} ({_e(src.get(v.primary_trace, '?'))})" if v.primary_trace else "")
            + "</div>"
            + "".join(f'<div class="warn">disagreement: {_e(d)}</div>' for d in v.disagreements)
            + "".join(f'<div class="muted">note: {_e(n)}</div>' for n in v.notes)
            + (f'<div id="nd-settle">settle the close call: {settle}</div>'
               if (settle := settle_text(report, code=lambda c: f"<code>{_e(c)}</code>")) else "")
            + "</section>")
        return "nd-verdict", "verdict", html_text

    def answer(self):
        """What to do first (report.Answer: the words of the terminal and Markdown reports)."""
        a = Answer(self.report)
        if a.remedy is None:
            return None
        check = (_e(a.lead) + " " if a.lead else "") + f'<code id="nd-check">{_e(a.command)}</code>'
        return ("nd-answer", "do this first",
                '<section id="nd-answer"><h2>Do this first</h2>'
                f'<div class="do">{_e(a.title)}</div>'
                + (f'<div class="why"><b id="nd-expected">{_e(a.expected)}</b> '
                   f'<span class="muted">(from the finding below: {_e(a.source)})</span></div>'
                   if a.expected else f'<div class="why muted">from the finding below: {_e(a.source)}</div>')
                + (f"<pre>{_e(a.remedy.code.rstrip())}</pre>" if a.remedy.code else "")
                + f"<div>check it: {check}</div></section>")

    def shares(self):
        report, v = self.report, self.v
        if not (v.per_trace or v.class_shares):
            return None
        gains = "".join(
            f"<tr><td>{_e(CLASS_LABEL.get(c, c))}</td><td class=\"n\">{100 * v.class_shares.get(c, 0):.1f}%</td>"
            f"<td class=\"n\">{g['step_ms_without']:.2f}</td><td class=\"n\">{g['speedup_expected']:.2f}x</td>"
            f"<td class=\"n\">{g['step_ms_at_least']:.2f}</td><td class=\"n\">{g['speedup_up_to']:.2f}x</td></tr>"
            for c, g in v.estimated_gain.items())
        parts = ['<section id="nd-shares"><h2>Where the step goes</h2>']
        if v.per_trace:
            parts.append(chart_html(self.figures, "fig-shares", shares_figure(report)))
        if v.class_shares:
            parts.append(chart_html(self.figures, "fig-classes", classes_figure(report)))
        if gains:
            parts.append("<h3>Each class's time, and the bound on removing it</h3><p class=\"muted\">"
                         "Without its time: the step if that class's own time were gone and nothing else "
                         "changed (what the verdict weighs; a remedy's expected speed-up is the what-if "
                         "model's, with its finding). Up to: a bound, the step cannot get shorter than the "
                         "GPU's own work (<code>navdoctor verify</code> measures what a remedy really "
                         "gives).</p><table id=\"nd-gains\"><thead><tr><th>class</th>"
                         "<th class=\"n\">share</th><th class=\"n\">step ms without</th><th class=\"n\">without its time</th>"
                         "<th class=\"n\">step ms at least</th><th class=\"n\">up to</th>"
                         f"</tr></thead><tbody>{gains}</tbody></table>")
        return "nd-shares", "shares", "".join(parts) + "</section>"

    def steps(self):
        data, v, src = self.data, self.v, self.src
        steps = data.get("steps") or {}
        if not steps:
            return None
        parts = ['<section id="nd-steps"><h2>Steps</h2><p class="muted">Each bar is one step, '
                 "split into the eight buckets of docs/verdict.md (the same colours everywhere). "
                 "A triangle marks an isolated stall, left out of the shares; the dashed line is the "
                 "frame budget of the realtime-frame-budget rule, for inference runs.</p>"]
        for tid in sorted(steps, key=lambda t: (t != v.primary_trace, t)):
            fid = f"fig-steps-{tid}"
            parts.append(chart_html(self.figures, fid, steps_figure(
                tid, src.get(tid, "?"), steps[tid], (data.get("budget") or {}).get(tid),
                self.gpu_of.get(tid, True))))
        return "nd-steps", "steps", "".join(parts) + "</section>"

    def timelines(self):
        tls = self.data.get("timelines") or []
        if not tls:
            return None
        parts = ['<section id="nd-timeline"><h2>Step timelines</h2><p class="muted">GPU streams '
                 "(kernels, copies, memsets), the launching thread (CUDA calls, syncs, DataLoader "
                 "waits) and, on top, which bucket each instant of the step was charged to: idle GPU "
                 "time takes the colour of its cause. Drag to zoom, double-click to reset. Events "
                 "shorter than a bin are merged into one box per lane (hover says how many).</p>"]
        for tl in tls:
            fid = f"fig-timeline-{tl['which']}"
            parts.append(chart_html(self.figures, fid,
                                    timeline_figure(tl, self.gpu_of.get(tl["trace_id"], True))))
        return "nd-timeline", "timelines", "".join(parts) + "</section>"

    def kernels(self):
        data = self.data
        if not (data.get("kernels") and data["kernels"]["rows"]):
            return None
        return ("nd-kernels-s", "kernels", '<section id="nd-kernels-s"><h2>Top kernels</h2>'
                + _kernels_html(data["kernels"], self.src.get(data["kernels"]["trace_id"], "?"))
                + "</section>")

    def operators(self):
        data = self.data
        if not (data.get("operators") and data["operators"]["rows"]):
            return None
        return ("nd-operators-s", "operators", '<section id="nd-operators-s"><h2>Top operators</h2>'
                + _ops_html(data["operators"], self.src.get(data["operators"]["trace_id"], "?"))
                + "</section>")

    def memory(self):
        mem = self.data.get("memory")
        if not mem:
            return None
        total = (f"; the device has {mem['device_total'] / 2**30:.1f} GiB" if mem.get("device_total") else "")
        return ("nd-memory", "memory", '<section id="nd-memory"><h2>GPU memory</h2><p class="muted">From the '
                f"allocator events of trace {mem['trace_id']}{total}.</p>"
                + chart_html(self.figures, "fig-memory", memory_figure(mem)) + "</section>")

    def findings(self):
        report = self.report
        if report.findings:
            fh = "".join(_finding_html(i, f) for i, f in enumerate(report.findings, start=1))
        else:
            fh = f"<p>{NO_FINDINGS}</p>"
        errs = "".join(f'<div class="err">rule error ({_e(x.rule)}, {_e(x.file)}): {_e(x.error)}</div>'
                       for x in report.rule_errors)
        return ("nd-findings", "findings",
                f'<section id="nd-findings"><h2>Findings ({len(report.findings)})</h2>'
                '<p class="muted">Ranked by the time they cost per step; "up to" is the speed-up if '
                f"that time were removed entirely (a bound, not a promise).</p>{fh}{errs}</section>")

    def traces(self):
        v = self.v
        rows = "".join(
            f"<tr><td>{t.trace_id}{' *' if t.trace_id == v.primary_trace else ''}</td><td>{_e(t.source)}</td>"
            f"<td>{_e(t.bound)}</td><td class=\"n\">{t.confidence:.2f}</td><td class=\"n\">{t.step_ms:.2f}</td>"
            f"<td class=\"n\">{t.steps}</td><td class=\"n\">{t.stall_steps}</td><td>{_e(t.step_origin)}</td>"
            f"<td>{'yes' if t.has_gpu else 'no'}</td></tr>" for t in v.per_trace)
        return ("nd-traces", "traces",
                '<section id="nd-traces"><h2>Per-trace verdicts</h2><table id="nd-per-trace"><thead><tr>'
                "<th>trace</th><th>source</th><th>bound</th><th class=\"n\">confidence</th>"
                "<th class=\"n\">mean ms/step</th><th class=\"n\">steps</th><th class=\"n\">stalls left out</th>"
                f"<th>steps from</th><th>GPU timeline</th></tr></thead><tbody>{rows}</tbody></table>"
                + ("<h3>Disagreements</h3><ul>" + "".join(f"<li>{_e(d)}</li>" for d in v.disagreements)
                   + "</ul>" if v.disagreements else '<p class="muted">The traces do not disagree.</p>')
                + "</section>")

    def inputs(self):
        report, data = self.report, self.data
        devices = data.get("devices") or {}
        irows = "".join(
            f"<tr><td>{i.trace_id}</td><td class=\"name\">{_e(i.path)}</td><td>{_e(i.format)}</td>"
            f"<td>{_e(i.producer)}</td><td>{_e(devices.get(i.trace_id, '-'))}</td><td class=\"n\">{i.events}</td>"
            f"<td>{_e('; '.join(i.warnings))}</td></tr>" for i in report.inputs)
        run = ""
        if report.run:
            r = report.run
            passes = "".join(f"<li>{_e(p.get('pass'))}: exit {_e(p.get('exit_code'))}, {_e(p.get('steps'))} steps "
                             f"from {_e(p.get('step_source'))}, trace {_e(p.get('trace'))}</li>"
                             for p in r.get("passes", []))
            run = (f"<h3>Run</h3><p>script <code>{_e(' '.join([r.get('script') or '', *r.get('args', [])]))}</code>, "
                   f"exit code {_e(r.get('script_exit_code'))}; run directory <code>{_e(r.get('dir'))}</code></p>"
                   f"<ul>{passes}</ul>" + "".join(f'<div class="muted">{_e(n)}</div>' for n in r.get("notes", [])))
        warns = "".join(f'<div class="warn">warning: {_e(w)}</div>' for w in report.warnings)
        gaps = "".join(f'<div class="err">not shown: {_e(e)}</div>' for e in data.get("errors", []))
        return ("nd-inputs", "inputs",
                '<section id="nd-inputs"><h2>Inputs and run</h2><table id="nd-input-table"><thead><tr>'
                "<th>trace</th><th>path</th><th>format</th><th>producer</th><th>GPU</th>"
                f"<th class=\"n\">events</th><th>warnings</th></tr></thead><tbody>{irows}</tbody></table>"
                f"{run}{warns}{gaps}<p class=\"muted\">{_e(report.tool)}, report schema "
                f"{_e(report.schema_version)}; {report.rules_run} rules ran"
                + (f"; database {_e(report.database)}" if report.database else "") + "</p></section>")


def render_verify_html(result: dict) -> str:
    """The HTML page of a `navdoctor verify` result (the dict verify.json holds)."""
    s = result.get("settings") or {}
    m = result.get("machine") or {}
    figures: dict[str, dict] = {}
    nav = [("nd-forest", "speed-ups"), ("nd-remedies", "remedies"), ("nd-inputs", "run")]
    body = []
    measured = [r for r in result.get("results", []) if (r.get("comparison") or {}).get("speedup")]
    forest = chart_html(figures, "fig-forest", forest_figure(result)) if measured else ""
    rows = []
    for r in result.get("results", []):
        c = r.get("comparison") or {}
        ci = c.get("ci") or [None, None]
        cls = r.get("class") or {}
        cls_text = (f"{class_text(cls['before'], cls.get('before_detail'))} → "
                    f"{class_text(cls['after'], cls.get('after_detail'))}"
                    if cls.get("before") and cls.get("after") else "-")
        color = VERDICT_COLOR.get(r.get("verdict"), "#555")
        speed = "-" if c.get("speedup") is None else f"{c['speedup']:.3f}x"
        interval = "-" if ci[0] is None or ci[1] is None else f"{ci[0]:.3f} – {ci[1]:.3f}"
        rows.append(f'<tr data-remedy="{_e(r.get("remedy"))}"><td><b>{_e(r.get("remedy"))}</b><br>'
                    f'<span class="muted">{_e(r.get("title"))}</span></td>'
                    f'<td><span class="badge" style="background:{color}">{_e(r.get("verdict"))}</span></td>'
                    f'<td class="n">{_fmt_ms(c.get("before_ms"))}</td><td class="n">{_fmt_ms(c.get("after_ms"))}</td>'
                    f'<td class="n">{speed}</td><td class="n">{interval}</td>'
                    f"<td>{_e(cls_text)}</td><td>"
                    + "".join(f"<div>{_e(x)}</div>" for x in (r.get("changes") or []) + (r.get("notes") or []))
                    + (f"<pre>{_e(r['code'])}</pre>" if r.get("code") else "") + "</td></tr>")
    body.append('<section id="nd-forest"><h2>Speed-up per remedy</h2>'
                + (forest if measured else "<p>No remedy was measured.</p>") + "</section>")
    body.append('<section id="nd-remedies"><h2>Remedies and verdicts</h2><table id="nd-verify-table"><thead><tr>'
                '<th>remedy</th><th>verdict</th><th class="n">before ms</th><th class="n">after ms</th>'
                '<th class="n">speed-up</th><th class="n">interval</th><th>class before → after</th>'
                f"<th>changes and notes</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>")
    diag = result.get("diagnosis")
    body.append('<section id="nd-inputs"><h2>Run</h2>'
                f"<p>script <code>{_e(' '.join([result.get('script') or '', *result.get('args', [])]))}</code>; "
                f"machine {_e(m.get('device') or 'cpu')}, {_e(m.get('cpus'))} CPUs ({_e(m.get('cpu'))}), "
                f"torch {_e(m.get('torch'))}, {'CUDA' if m.get('cuda') else 'no CUDA'}</p>"
                f"<p>{_e(s.get('repeats'))} run(s) per arm, interleaved ({_e(s.get('order'))}), after "
                f"{_e(s.get('priming_runs'))} priming run(s); {_e(s.get('timed_steps'))} timed steps after "
                f"{_e(s.get('warmup_steps'))} warm-up steps; {100 * (s.get('confidence') or 0):.0f}% interval, "
                f"margin {100 * (s.get('margin') or 0):.0f}%; baseline median "
                f"{_fmt_ms((result.get('baseline') or {}).get('median_ms'))} ms/step; "
                f"{_e(result.get('seconds'))} s in all</p>"
                + (f"<p>diagnosis: {_e(diag.get('bound'))} ({_e(diag.get('report'))})</p>" if diag else "")
                + f"<p class=\"muted\">run directory <code>{_e(result.get('run_dir'))}</code>; "
                f"{_e(result.get('tool'))}, verify schema {_e(result.get('schema_version'))}; "
                f"created {_e(result.get('created'))}</p></section>")
    n_help = sum(1 for r in result.get("results", []) if r.get("verdict") == "helps")
    subtitle = (f"{_e(os.path.basename(result.get('script') or ''))} · {len(result.get('results', []))} "
                f"remedies · {n_help} help")
    return _page("navdoctor verify", subtitle, nav, body, figures, "verify")


COMPARE_COLOR = {"faster": "#2e7d32", "slower": "#c62828", "no change beyond the noise": "#757575"}


def compare_buckets_figure(result: dict) -> dict:
    """Each bucket's ms per step, before beside after (one colour per bucket, as elsewhere)."""
    rows = [b for b in result.get("buckets", []) if b["before_ms"] or b["after_ms"]]
    data = [{"type": "bar", "orientation": "h", "name": bucket_label(b["bucket"]),
             "y": ["before", "after"], "x": [b["before_ms"], b["after_ms"]],
             "marker": {"color": BUCKET_COLOR.get(b["bucket"], "#999")}, "legendgroup": b["bucket"],
             "hovertemplate": "%{y}: %{x:.3f} ms/step<extra>" + _e(bucket_label(b["bucket"])) + "</extra>"}
            for b in rows]
    return {"data": data, "layout": _layout(
        barmode="stack", height=300, title={"text": "Where the step goes, before and after (ms per step)"},
        xaxis={"title": {"text": "ms per step (mean over captures)"}},
        yaxis={"categoryorder": "array", "categoryarray": ["after", "before"], "automargin": True})}


def compare_step_figure(result: dict) -> dict:
    """The speed-up with its interval against the margin band (log scale, as verify's forest)."""
    st = result["step_time"]
    lo, hi, sp, margin = st["ci"][0], st["ci"][1], st["speedup"], st["margin"]
    data = [{"type": "scatter", "mode": "markers", "name": st["result"], "x": [sp], "y": ["after vs before"],
             "marker": {"size": 14, "color": COMPARE_COLOR.get(st["result"], "#333")},
             "error_x": {"type": "data", "symmetric": False, "array": [round(hi - sp, 4)],
                         "arrayminus": [round(sp - lo, 4)], "thickness": 2, "width": 8},
             "hovertemplate": f"%{{x:.3f}}x (interval {lo:.3f} to {hi:.3f})<extra></extra>"}]
    lo_x, hi_x = min(lo, 1 / (1 + margin)) * 0.9, max(hi, 1 + margin) * 1.1
    shapes = _margin_shapes(margin)
    return {"data": data, "layout": _layout(
        height=230, shapes=shapes,
        title={"text": f"Speed-up (mean step before / after) with its 95% interval "
                       f"(grey band: within ±{margin:.0%})"},
        xaxis={"title": {"text": "speed-up (>1: faster)"}, "type": "log", "range": [_log10(lo_x), _log10(hi_x)]},
        yaxis={"type": "category", "automargin": True})}


def _changes_html(rows: list[dict], table_id: str, what: str) -> str:
    if not rows:
        return f"<p class=\"muted\">No {what} to compare.</p>"
    body = "".join(f"<tr><td class=\"name\"><code>{_e(r['name'])}</code></td><td class=\"n\">{r['before_ms']:.3f}</td>"
                   f"<td class=\"n\">{r['after_ms']:.3f}</td><td class=\"n\">{r['delta_ms']:+.3f}</td></tr>"
                   for r in rows)
    return (f'<table id="{table_id}" class="sortable"><thead><tr><th>{_e(what)}</th><th class="n">before ms/step</th>'
            f'<th class="n">after ms/step</th><th class="n">change</th></tr></thead><tbody>{body}</tbody></table>')


def render_compare_html(result: dict) -> str:
    """The HTML page of a `navdoctor compare` result (the dict its JSON holds)."""
    st = result["step_time"]
    figures: dict[str, dict] = {}
    step_chart = chart_html(figures, "fig-compare-step", compare_step_figure(result))
    buckets_chart = chart_html(figures, "fig-compare-buckets", compare_buckets_figure(result))
    nav = [("nd-step", "step time"), ("nd-buckets", "buckets"), ("nd-findings", "findings"),
           ("nd-changes", "kernels and operators"), ("nd-captures", "captures")]
    color = COMPARE_COLOR.get(st["result"], "#555")
    cc = result.get("class_change") or {}
    body = [f'<section id="nd-step"><h2>Step time</h2><p class="verdict">'
            f'<span class="badge" style="background:{color}">{_e(st["result"])}</span> '
            f'{st["before_ms"]:.3f} → {st["after_ms"]:.3f} ms/step ({_e(st.get("statistic", "mean"))} '
            f'of the steady steps), {st["speedup"]:.3f}× '
            f'[{st["ci"][0]:.3f}, {st["ci"][1]:.3f}]; {_e(st["detail"])}</p>'
            + "".join(f'<p class="muted" id="nd-interval">{_e(n)}</p>' for n in result.get("notes", [])[:1]
                      if n.startswith("interval:"))
            + f'<p>class: {_e(cc.get("before"))} → {_e(cc.get("after"))}</p>'
            + step_chart + '</section>',
            '<section id="nd-buckets"><h2>Buckets</h2>' + buckets_chart
            + '<table id="nd-compare-buckets"><thead><tr><th>bucket</th><th class="n">share before</th>'
            '<th class="n">share after</th><th class="n">ms before</th><th class="n">ms after</th>'
            '<th class="n">change ms</th></tr></thead><tbody>'
            + "".join(f'<tr><td>{_e(bucket_label(b["bucket"]))}</td><td class="n">{100 * b["before_share"]:.1f}%</td>'
                      f'<td class="n">{100 * b["after_share"]:.1f}%</td><td class="n">{b["before_ms"]:.3f}</td>'
                      f'<td class="n">{b["after_ms"]:.3f}</td><td class="n">{b["delta_ms"]:+.3f}</td></tr>'
                      for b in result.get("buckets", []) if b["before_ms"] or b["after_ms"])
            + "</tbody></table></section>"]
    f = result.get("findings") or {}
    body.append('<section id="nd-findings"><h2>Findings</h2>'
                + "".join(f'<p><b>{label}</b>: ' + (", ".join(f'<code class="finding-change" data-change="{key}">{_e(r)}</code>'
                                                            for r in f.get(key, [])) or "none") + "</p>"
                          for key, label in (("appeared", "appeared"), ("disappeared", "gone"), ("both", "in both")))
                + "</section>")
    body.append('<section id="nd-changes"><h2>Kernels and operators that changed most</h2>'
                + _changes_html(result.get("kernels", []), "nd-compare-kernels", "kernel family")
                + _changes_html(result.get("operators", []), "nd-compare-ops", "CPU operator")
                + "</section>")
    caps = []
    for side in ("before", "after"):
        for c in (result.get(side) or {}).get("captures", []):
            caps.append(f"<tr><td>{side}</td><td>{_e(c.get('label'))}</td><td class=\"n\">{_e(c.get('steps'))}</td>"
                        f"<td class=\"n\">{_fmt_ms(c.get('step_ms'))}</td><td>{_e(c.get('bound'))}</td></tr>")
    body.append('<section id="nd-captures"><h2>Captures</h2><table><thead><tr><th>side</th><th>capture</th>'
                '<th class="n">steps</th><th class="n">mean ms</th><th>class</th></tr></thead><tbody>'
                + "".join(caps) + "</tbody></table>"
                + "".join(f"<p class=\"note\">{_e(n)}</p>" for n in result.get("notes", []))
                + f"<p class=\"muted\">{_e(result.get('tool'))}, compare schema {_e(result.get('schema_version'))}</p></section>")
    subtitle = f"{_e(st['result'])} · {st['speedup']:.2f}× · {st['before_ms']:.2f} → {st['after_ms']:.2f} ms/step"
    return _page("navdoctor compare", subtitle, nav, body, figures, "compare")
