"""The sweep page: the curve with its bound band and knees; click a point for its schedule's memory timeline and
the three streams (hover: a layer's action, bytes, stall); what-if controls that re-solve through the API.

One template, two ways to ship it, neither of which reaches a network: `memsched serve` serves it at
/ui/traces/{id} with Plotly's own bundle from the installed `plotly` package (/ui/plotly.min.js), and
`memsched sweep --html` writes it as one file with that bundle, the curve and every point's timeline inside.
Plotly draws every chart; the page's own script only moves data between the API and Plotly.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from memsched.hardware import LINKS, for_planned_trace
from memsched.optimizer.simulate import simulate
from memsched.schema import Schedule, Trace
from memsched.service.sweep import DEFAULT_POINTS, SweepResult


def timeline_doc(trace: Trace, schedule: Schedule) -> dict[str, Any]:
    """A schedule's simulated step as the page draws it: memory per stage (a step line) and the events of the
    three streams, each with its layer's name and action. Simulated on the link the schedule was planned for."""
    sim = simulate(*for_planned_trace(trace, schedule))
    n = trace.n
    names = trace.layer_names
    actions = [a.action.value for a in schedule.actions]
    stages = []
    for t in range(2 * n):
        layer = t if t < n else 2 * n - 1 - t
        stages.append(
            {
                "start": sim.stage_start[t],
                "end": sim.stage_end[t],
                "bytes": sim.static_bytes + sim.stage_bytes[t],
                "layer": names[layer],
                "phase": "forward" if t < n else "backward",
                "action": actions[layer],
            }
        )
    events = [
        {
            "stream": e.stream,
            "kind": e.kind,
            "layer": names[e.layer],
            "action": actions[e.layer],
            "start": e.start,
            "end": e.end,
            "bytes": e.bytes,
            "saved_bytes": trace.layers[e.layer].saved_bytes,
        }
        for e in sim.events
        if e.end > e.start
    ]
    planned = schedule.planned_for
    return {
        "budget_bytes": schedule.budget_bytes,
        "static_bytes": sim.static_bytes,
        "peak_bytes": sim.peak_bytes,
        "step_s": sim.step_s,
        "keepall_step_s": sim.keepall_step_s,
        "overhead_s": sim.overhead_s,
        "stall_s": sim.stall_s,
        "recompute_s": sim.recompute_s,
        "host_peak_bytes": sim.host_peak_bytes,
        "host_budget_bytes": schedule.host_budget_bytes,
        "counts": schedule.action_counts(),
        "link": planned.link if planned else "measured",
        "h2d_bytes_per_s": planned.h2d_bytes_per_s if planned else trace.device.h2d_bytes_per_s,
        "stages": stages,
        "events": events,
    }


@functools.cache
def plotly_js() -> str:
    """Plotly's browser bundle, from the installed package (no CDN)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def _script_json(value: object) -> str:
    # Inside <script>, "</" would end the element early; "<\/" is the same string to JSON.
    return json.dumps(value).replace("</", "<\\/")


def _page(config: dict[str, Any], plotly_tag: str) -> str:
    presets = "".join(
        f'<option value="{p.value}">{p.value} ({f.h2d_bytes_per_s / 1e9:g} / {f.d2h_bytes_per_s / 1e9:g} GB/s)</option>'
        for p, f in LINKS.items()
    )
    return (
        _TEMPLATE.replace("__PLOTLY__", plotly_tag)
        .replace("__PRESETS__", presets)
        .replace("__CONFIG__", _script_json(config))
        .replace("__TITLE__", str(config["title"]).replace("<", "&lt;"))
    )


def standalone_page(trace: Trace, result: SweepResult) -> str:
    """One self-contained HTML file: Plotly's bundle, the curve and every point's timeline (the what-if
    controls need a server; the page says so)."""
    config = {
        "mode": "standalone",
        "title": f"{trace.model} (batch {trace.batch_size}, {trace.n} layers)",
        "sweep": result.model_dump(mode="json"),
        "timelines": [timeline_doc(trace, p.schedule) for p in result.points],
    }
    return _page(config, f"<script>{plotly_js()}</script>")


def served_page(trace_id: str) -> str:
    """The page `memsched serve` answers for a stored trace: it holds no data of the trace (the server cannot
    tell who opens it), and asks the API for the sweep and timelines with the key typed into it."""
    config = {
        "mode": "served",
        "title": f"trace {trace_id[:12]}",
        "trace_id": trace_id,
        "default_points": min(DEFAULT_POINTS, 12),
    }
    return _page(config, '<script src="/ui/plotly.min.js"></script>')


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>memsched sweep: __TITLE__</title>
__PLOTLY__
<style>
body { font: 14px system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; }
#controls { display: flex; gap: 14px; align-items: end; flex-wrap: wrap; margin: 10px 0; padding: 8px 10px;
  background: #f4f5f7; border-radius: 6px; }
#controls label { display: flex; flex-direction: column; font-size: 12px; color: #555; }
#status { margin: 6px 0; min-height: 1.3em; }
#status.error { color: #b00020; }
.note { color: #666; font-size: 12px; }
#point-info { margin: 8px 0 0; font-weight: 600; }
</style></head>
<body data-curve="none" data-point="none" data-resolves="0">
<h1>Step time against memory: <span id="title">__TITLE__</span></h1>
<div class="note" id="summary"></div>
<form id="controls" onsubmit="return false">
  <label>link<select id="link"><option value="">measured (the trace's)</option>__PRESETS__
    <option value="custom">custom bytes/s…</option></select></label>
  <label>custom rate (bytes/s)<input id="rate" type="text" placeholder="25e9" size="10"></label>
  <label>ranks per link<input id="ranks" type="number" min="1" value="1" style="width:5em"></label>
  <label>host budget<input id="host" type="text" placeholder="none, e.g. 64GiB" size="12"></label>
  <label>points<input id="points" type="number" min="2" max="200" style="width:5em"></label>
  <label>seconds per point<input id="limit" type="number" min="0.1" step="0.5" value="2" style="width:5em"></label>
  <label>API key<input id="key" type="password" size="14" placeholder="if the server needs one"></label>
  <button id="resolve" type="button">Re-solve</button>
</form>
<div id="status"></div>
<div id="curve" style="height:420px"></div>
<div id="point-info">Click a point of the curve to see its schedule.</div>
<div id="memory" style="height:300px"></div>
<div id="streams" style="height:260px"></div>
<script>
"use strict";
const CFG = __CONFIG__;
const GiB = 2 ** 30;
const KIND_COLORS = {forward: "#4C72B0", backward: "#55A868", recompute: "#DD8452", stall: "#C44E52",
  offload: "#8172B3", prefetch: "#937860"};
const STREAMS = {compute: "compute", d2h: "device → host", h2d: "host → device"};
let sweep = CFG.sweep || null;
let timelines = CFG.timelines || null;
const $ = (id) => document.getElementById(id);
const fmtBytes = (b) => b >= GiB ? (b / GiB).toFixed(2) + " GiB" : (b / 2 ** 20).toFixed(1) + " MiB";
const ms = (s) => (s * 1e3).toFixed(2) + " ms";

function status(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

function headers() {
  const h = {"content-type": "application/json"};
  const key = $("key").value || sessionStorage.getItem("memsched-key") || "";
  if (key) { h["authorization"] = "Bearer " + key; sessionStorage.setItem("memsched-key", key); }
  return h;
}

async function api(path, body) {
  const r = await fetch(path, {method: "POST", headers: headers(), body: JSON.stringify(body)});
  const doc = await r.json().catch(() => ({detail: r.statusText}));
  if (!r.ok) {
    const min = doc.min_feasible_bytes ? " (smallest feasible: " + fmtBytes(doc.min_feasible_bytes) + ")" :
      doc.min_feasible_host_bytes ? " (smallest host budget: " + fmtBytes(doc.min_feasible_host_bytes) + ")" : "";
    throw new Error((doc.field ? doc.field + ": " : "") + (doc.detail || r.status) + min);
  }
  return doc;
}

function renderCurve() {
  const pct = 100 / sweep.keepall_step_s;
  const xs = sweep.points.map((p) => p.budget_bytes / GiB);
  const hover = sweep.points.map((p) =>
    "budget " + fmtBytes(p.budget_bytes) + "<br>overhead " + ms(p.overhead_s) + " (+" + p.overhead_pct.toFixed(2) +
    "%)<br>bound " + (p.bound_s === null ? "none" : ms(p.bound_s)) + "<br>gap " +
    (p.gap === null ? "-" : (100 * p.gap).toFixed(2) + "%") + "<br>status " + p.status +
    "<br>keep/offload/recompute " + p.actions.keep + "/" + p.actions.offload + "/" + p.actions.recompute);
  const traces = [
    {x: xs, y: sweep.points.map((p) => (p.bound_s === null ? 0 : p.bound_s) * pct), mode: "lines",
     line: {width: 0}, name: "lower bound", hoverinfo: "skip"},
    {x: xs, y: sweep.points.map((p) => p.overhead_s * pct), mode: "lines+markers", fill: "tonexty",
     fillcolor: "rgba(76,114,176,0.2)", line: {color: "#2B4C7E"}, marker: {size: 9},
     name: "best schedule (band: up to the bound)", customdata: sweep.points.map((_, i) => i),
     text: hover, hovertemplate: "%{text}<extra></extra>"},
    {x: sweep.knees.map((k) => k.budget_bytes / GiB), y: sweep.knees.map((k) => k.overhead_s * pct),
     mode: "markers", marker: {symbol: "diamond", size: 14, color: "#C44E52"}, name: "knee",
     text: sweep.knees.map((k) => "knee " + fmtBytes(k.budget_bytes) + ": below it each GiB less costs " +
       ms(k.slope_below_s_per_gib)), hovertemplate: "%{text}<extra></extra>"},
  ];
  const shapes = sweep.zero_overhead_bytes === null ? [] : [{type: "line", x0: sweep.zero_overhead_bytes / GiB,
    x1: sweep.zero_overhead_bytes / GiB, yref: "paper", y0: 0, y1: 1, line: {dash: "dash", color: "#55A868"}}];
  Plotly.newPlot("curve", traces, {margin: {t: 30}, shapes: shapes, hovermode: "closest",
    xaxis: {title: {text: "device-memory budget (GiB)"}}, yaxis: {title: {text: "overhead vs keep-all (%)"},
    rangemode: "tozero"}, title: {text: "click a point for its schedule", font: {size: 12}}},
    {displaylogo: false, responsive: true});
  $("curve").on("plotly_click", (ev) => {
    const pt = ev.points.find((p) => p.curveNumber === 1);
    if (pt) selectPoint(pt.customdata);
  });
  const o = sweep.options;
  $("summary").textContent = sweep.points.length + " budgets from " + fmtBytes(sweep.lo_bytes) + " to " +
    fmtBytes(sweep.hi_bytes) + " in " + sweep.wall_s.toFixed(1) + " s; link " + (o.link === null ? "measured" :
    o.link) + (o.ranks_per_link ? ", " + o.ranks_per_link + " ranks per link" : "") +
    (o.host_budget === null || o.host_budget === undefined ? "" : "; host budget " + fmtBytes(o.host_budget)) +
    "; knees at " +
    (sweep.knees.map((k) => fmtBytes(k.budget_bytes)).join(", ") || "none") +
    (sweep.zero_overhead_bytes === null ? "" : "; no overhead from " + fmtBytes(sweep.zero_overhead_bytes));
  document.body.dataset.curve = "ready";
}

async function selectPoint(i) {
  const p = sweep.points[i];
  status("loading the schedule at " + fmtBytes(p.budget_bytes) + "…");
  try {
    const tl = timelines ? timelines[i] :
      await api("/v1/sweeps/timeline", {trace_id: CFG.trace_id, schedule: p.schedule});
    renderTimeline(tl);
    document.body.dataset.point = String(i);
    status("");
  } catch (e) { status(String(e.message || e), true); }
}

function renderTimeline(tl) {
  const c = tl.counts;
  $("point-info").textContent = "budget " + fmtBytes(tl.budget_bytes) + ": peak " + fmtBytes(tl.peak_bytes) +
    ", step " + ms(tl.step_s) + " (stall " + ms(tl.stall_s) + ", recompute " + ms(tl.recompute_s) + "); keep " +
    c.keep + ", offload " + c.offload + ", recompute " + c.recompute + "; link " + tl.link +
    "; host peak " + fmtBytes(tl.host_peak_bytes || 0) +
    (tl.host_budget_bytes === null || tl.host_budget_bytes === undefined ? "" :
      " (host budget " + fmtBytes(tl.host_budget_bytes) + ")");
  const xs = [], ys = [], hv = [];
  for (const s of tl.stages) {
    const text = s.phase + " of " + s.layer + " (" + s.action + ")<br>" + fmtBytes(s.bytes);
    xs.push(s.start * 1e3, s.end * 1e3); ys.push(s.bytes / GiB, s.bytes / GiB); hv.push(text, text);
  }
  const end = tl.step_s * 1e3;
  Plotly.newPlot("memory", [
    {x: xs, y: ys, mode: "lines", fill: "tozeroy", line: {color: "#2B4C7E"}, name: "device memory", text: hv,
     hovertemplate: "%{text}<extra></extra>"},
    {x: [0, end], y: [tl.budget_bytes / GiB, tl.budget_bytes / GiB], mode: "lines", name: "budget",
     line: {dash: "dash", color: "#C44E52"}},
    {x: [0, end], y: [tl.static_bytes / GiB, tl.static_bytes / GiB], mode: "lines", name: "static",
     line: {dash: "dot", color: "#8C8C8C"}},
  ], {margin: {t: 10}, yaxis: {title: {text: "GiB"}, rangemode: "tozero"}, xaxis: {range: [0, end]},
     hovermode: "closest"}, {displaylogo: false, responsive: true});
  const kinds = {};
  for (const e of tl.events) (kinds[e.kind] = kinds[e.kind] || []).push(e);
  const bars = Object.entries(kinds).map(([kind, evs]) => ({
    type: "bar", orientation: "h", name: kind, marker: {color: KIND_COLORS[kind] || "#999"},
    base: evs.map((e) => e.start * 1e3), x: evs.map((e) => (e.end - e.start) * 1e3),
    y: evs.map((e) => STREAMS[e.stream] || e.stream),
    text: evs.map((e) => e.kind + ": " + e.layer + " (" + e.action + ")<br>" + ms(e.end - e.start) +
      (e.bytes ? "<br>copies " + fmtBytes(e.bytes) : "<br>saved " + fmtBytes(e.saved_bytes)) +
      (e.kind === "stall" ? "<br>stall: waiting for a copy" : "")),
    hovertemplate: "%{text}<extra></extra>", textposition: "none",
  }));
  Plotly.newPlot("streams", bars, {barmode: "overlay", margin: {t: 10}, hovermode: "closest",
    xaxis: {title: {text: "time in one step (ms)"}, range: [0, end]},
    yaxis: {categoryorder: "array", categoryarray: Object.values(STREAMS).reverse()}},
    {displaylogo: false, responsive: true});
}

async function resolve() {
  const body = {trace_id: CFG.trace_id, points: Number($("points").value),
    time_limit_s: Number($("limit").value)};
  const link = $("link").value;
  if (link === "custom") body.link = $("rate").value.trim();
  else if (link) body.link = link;
  const ranks = Number($("ranks").value);
  if (ranks !== 1) body.ranks_per_link = ranks;
  const host = $("host").value.trim();
  if (host) body.host_budget = /^[0-9]+$/.test(host) ? Number(host) : host;
  status("solving " + body.points + " budgets…");
  $("resolve").disabled = true;
  try {
    sweep = await api("/v1/sweeps", body);
    timelines = null;
    renderCurve();
    $("title").textContent = sweep.model + " (trace " + CFG.trace_id.slice(0, 12) + ")";
    document.body.dataset.resolves = String(Number(document.body.dataset.resolves) + 1);
    status("");
    await selectPoint(Math.floor(sweep.points.length / 2));
  } catch (e) { status(String(e.message || e), true); }
  finally { $("resolve").disabled = false; }
}

$("points").value = sweep ? sweep.points.length : CFG.default_points;
if (CFG.mode === "standalone") {
  for (const el of $("controls").querySelectorAll("input,select,button")) el.disabled = true;
  $("controls").insertAdjacentHTML("beforeend",
    '<span class="note">what-if controls re-solve through <code>memsched serve</code> ' +
    '(this file is standalone)</span>');
  renderCurve();
  selectPoint(Math.floor(sweep.points.length / 2));
} else {
  $("resolve").addEventListener("click", resolve);
  resolve();
}
</script>
</body></html>
"""
