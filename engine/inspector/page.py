"""The inspector page (SPEC: INSP-1): one HTML document with inline style and script, no build
step and nothing loaded from elsewhere. The script renders each snapshot of ``/inspect/feed``
with DOM text nodes only (never markup built from data), draws the stage charts as inline SVG,
and asks the feed for a rollout's turn history when its row is clicked."""

from __future__ import annotations

_STYLE = """
:root { --bg:#f6f7f9; --card:#fff; --ink:#1d2430; --mute:#6b7480; --line:#e3e6ea;
  --run:#1f7ae0; --sus:#c77700; --park:#7a4fd0; --end:#4b8a3a; --bad:#c9372c; }
* { box-sizing: border-box; }
body { margin:0; font:13px/1.4 system-ui, sans-serif; background:var(--bg); color:var(--ink); }
header { display:flex; gap:16px; align-items:baseline; padding:10px 16px; background:#1d2430;
  color:#fff; }
header h1 { font-size:15px; margin:0; font-weight:600; }
header .meta { color:#b8c0cc; font-size:12px; }
#live { font-weight:600; } #live.on { color:#7fd48a; } #live.off { color:#ff9b8f; }
main { padding:12px 16px; display:grid; gap:12px; }
.tiles { display:grid; grid-template-columns:repeat(auto-fill, minmax(130px, 1fr)); gap:8px; }
.tile, .card { background:var(--card); border:1px solid var(--line); border-radius:6px; }
.tile { padding:8px 10px; } .tile b { display:block; font-size:18px; }
.tile span { color:var(--mute); font-size:11px; text-transform:uppercase; }
.charts { display:grid; grid-template-columns:repeat(auto-fit, minmax(240px, 1fr)); gap:8px; }
.card { padding:8px 10px; overflow:auto; }
.card h2 { font-size:12px; margin:0 0 6px; color:var(--mute); text-transform:uppercase; }
.card h2 small { text-transform:none; font-weight:400; }
svg { width:100%; height:56px; display:block; }
svg polyline { fill:none; stroke-width:1.5; vector-effect:non-scaling-stroke; }
.chart .now { font-size:15px; font-weight:600; white-space:pre; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:3px 6px; border-bottom:1px solid var(--line);
  white-space:nowrap; }
th { color:var(--mute); font-weight:500; font-size:11px; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
tr[data-rollout-id] { cursor:pointer; } tr[data-rollout-id]:hover { background:#eef4fd; }
tr.selected { background:#dceafc !important; }
.badge { padding:1px 6px; border-radius:9px; color:#fff; font-size:11px; }
.running { background:var(--run); } .suspended { background:var(--sus); }
.parked { background:var(--park); } .ended { background:var(--end); }
.call { display:inline-block; margin-right:4px; padding:0 5px; border:1px solid var(--line);
  border-radius:4px; background:#fbf6ec; font-family:ui-monospace, monospace; font-size:11px; }
.mono { font-family:ui-monospace, monospace; font-size:12px; }
.mute { color:var(--mute); } .bad { color:var(--bad); }
.cols { display:grid; grid-template-columns:minmax(0, 3fr) minmax(0, 2fr); gap:12px; }
@media (max-width: 1000px) { .cols { grid-template-columns:1fr; } }
"""

_BODY = """
<header><h1>rollout engine &middot; inspector</h1>
<span id="live" class="off">connecting&hellip;</span>
<span class="meta" id="updated"></span><span class="meta" id="uptime"></span>
<form method="post" action="/inspect/logout" class="meta"><button id="signout">sign out</button>
</form></header>
<main>
<section class="tiles" id="tiles"></section>
<section class="charts">
 <div class="card chart" id="chart-pre"><h2>pre-inference <small>ms / response</small></h2>
  <div class="now">&ndash;</div><svg viewBox="0 0 240 56" preserveAspectRatio="none"></svg></div>
 <div class="card chart" id="chart-model"><h2>model <small>ms / sampling response</small></h2>
  <div class="now">&ndash;</div><svg viewBox="0 0 240 56" preserveAspectRatio="none"></svg></div>
 <div class="card chart" id="chart-post"><h2>post-inference <small>ms / record</small></h2>
  <div class="now">&ndash;</div><svg viewBox="0 0 240 56" preserveAspectRatio="none"></svg></div>
 <div class="card chart" id="chart-rate"><h2>responses <small>per second</small></h2>
  <div class="now">&ndash;</div><svg viewBox="0 0 240 56" preserveAspectRatio="none"></svg></div>
</section>
<section class="card"><h2>rollouts <small id="rollouts-note"></small></h2>
  <table id="rollouts"><thead><tr><th>rollout</th><th>state</th><th>mode</th><th>model</th>
  <th>connection</th><th>lane</th><th>response</th><th class="num">age</th>
  <th class="num">idle</th><th class="num">tokens held</th><th>pending calls</th>
  <th class="num">turns</th></tr></thead><tbody></tbody></table></section>
<section class="card" id="detail"><h2>turn history <small id="detail-title">
  (click a rollout)</small></h2>
  <table id="turns"><thead><tr><th class="num">#</th><th>response</th>
  <th class="num">rendered</th><th class="num">prompt</th><th class="num">output</th>
  <th>calls</th><th>finish</th><th class="num">pre ms</th><th class="num">ttft ms</th>
  <th class="num">model ms</th></tr></thead><tbody></tbody></table></section>
<section class="card"><h2>recently ended <small>(seen by the sampler)</small></h2>
 <table id="ended"><thead><tr><th>rollout</th><th>status</th><th>mode</th><th>model</th>
 <th>connection</th><th>last response</th><th class="num">tokens</th><th class="num">turns</th>
 </tr></thead><tbody></tbody></table></section>
<section class="cols">
 <div class="card"><h2>connections <small id="connections-note"></small></h2>
  <table id="connections"><thead><tr><th>connection</th><th class="num">age</th><th>lanes</th>
  <th class="num">frames in</th><th class="num">frames out</th><th class="num">rollouts</th>
  </tr></thead><tbody></tbody></table></div>
 <div class="card"><h2>caches and store</h2><table id="caches"><tbody></tbody></table></div>
</section>
<section class="card"><h2>recent errors <small id="errors-note"></small></h2>
 <table id="errors"><thead><tr><th>time</th><th>source</th><th class="num">status</th>
 <th>code</th><th>message</th></tr></thead><tbody></tbody></table></section>
</main>
"""

_SCRIPT = r"""
"use strict";
const $ = (sel) => document.querySelector(sel);
let selected = null, selectedTurns = -1, feed = null;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.append(c instanceof Node ? c : el("td", "", c));
  return tr;
}
function short(id) {
  const td = el("td", "mono");
  if (id === null || id === undefined) { td.textContent = "\u2013"; return td; }
  const cut = id.indexOf("_") + 11;
  td.textContent = id.length > cut + 1 ? id.slice(0, cut) + "\u2026" : id;
  td.title = id;
  return td;
}
const num = (v) => el("td", "num", v === null || v === undefined ? "\u2013" : v);
const mono = (v) => el("td", "mono", v === null || v === undefined ? "\u2013" : v);
function age(s) {
  if (s === null || s === undefined) return "\u2013";
  if (s < 60) return s.toFixed(1) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + Math.floor(s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}
const ms = (s) => (s === null || s === undefined ? null : (s * 1000).toFixed(2));
const pct = (r) => (r.rate === null ? "\u2013" : (r.rate * 100).toFixed(1) + "%");
function fill(sel, rows) { $(sel + " tbody").replaceChildren(...rows); }
function badge(state) { const td = el("td"); td.append(el("span", "badge " + state, state));
  return td; }

function tiles(d) {
  const t = d.totals, c = d.caches, out = [];
  const add = (label, value) => { const n = el("div", "tile"); n.append(el("b", "", value),
    el("span", "", label)); out.push(n); };
  add("connections", t.connections); add("running", t.running);
  add("suspended", t.suspended);
  if ("parked" in t) add("parked", t.parked);
  add("tokens held", t.tokens_held.toLocaleString());
  add("connection cache hits", pct(c.connection));
  add("hydration hits", c.hydration ? pct(c.hydration) : "n/a");
  add("errors", d.errors_total);
  $("#tiles").replaceChildren(...out);
}

function chart(id, points, key, color, unit, mean) {
  const box = $(id), svg = box.querySelector("svg");
  const values = points.map((p) => p[key]);
  const known = values.filter((v) => v !== null);
  const last = known.length ? known[known.length - 1] : null;
  box.querySelector(".now").textContent = (last === null ? "\u2013" : last + " " + unit) +
    (mean === undefined ? "" : mean === null ? "  \u00b7  no records yet" :
      "  \u00b7  mean since start " + mean + " " + unit);
  const top = Math.max(...known, 1e-9), lines = [];
  let line = [];
  values.forEach((v, i) => {
    if (v === null) { if (line.length) lines.push(line); line = []; return; }
    const x = values.length > 1 ? (i / (values.length - 1)) * 240 : 240;
    line.push(x.toFixed(1) + "," + (54 - (v / top) * 50).toFixed(1));
  });
  if (line.length) lines.push(line);
  const svgNs = "http://www.w3.org/2000/svg";
  const shapes = lines.map((pts) => {
    if (pts.length === 1) {  // a lone point between gaps: a dot
      const [x, y] = pts[0].split(",");
      const dot = document.createElementNS(svgNs, "circle");
      dot.setAttribute("cx", x); dot.setAttribute("cy", y); dot.setAttribute("r", "2");
      dot.setAttribute("fill", color);
      return dot;
    }
    const p = document.createElementNS(svgNs, "polyline");
    p.setAttribute("points", pts.join(" "));
    p.setAttribute("stroke", color);
    return p;
  });
  svg.replaceChildren(...shapes);
}

function rolloutRow(r) {
  const tr = row([short(r.id), badge(r.state), r.mode, r.model, mono(r.connection),
    mono(r.lane), short(r.response_id), num(age(r.age_s)), num(age(r.idle_s)),
    num(r.tokens.toLocaleString())]);
  const calls = el("td", "pending");
  for (const call of r.pending) {
    const chip = el("span", "call", call.name + " \u00b7 " + call.call_id);
    chip.dataset.callId = call.call_id;
    calls.append(chip);
  }
  tr.append(calls, num(r.turns));
  tr.dataset.rolloutId = r.id;
  tr.onclick = () => select(r.id);
  if (r.id === selected) tr.classList.add("selected");
  return tr;
}

function endedRow(r) {
  const status = el("td"); status.append(el("span", "badge ended", r.status));
  const tr = row([short(r.id), status, r.mode, r.model, mono(r.connection), short(r.response_id),
    num(r.tokens.toLocaleString()), num(r.turns)]);
  tr.dataset.rolloutId = r.id;
  tr.onclick = () => select(r.id);
  if (r.id === selected) tr.classList.add("selected");
  return tr;
}

function render(d) {
  $("#updated").textContent = "updated " + new Date(d.t * 1000).toLocaleTimeString();
  $("#uptime").textContent = "up " + age(d.uptime_s);
  tiles(d);
  const m = d.stage_means;
  chart("#chart-pre", d.series, "pre_ms", "#1f7ae0", "ms", m.pre_ms);
  chart("#chart-model", d.series, "model_ms", "#c77700", "ms", m.model_ms);
  chart("#chart-post", d.series, "post_ms", "#4b8a3a", "ms", m.post_ms);
  chart("#chart-rate", d.series, "per_s", "#7a4fd0", "/s");
  const t = d.totals, live = t.running + t.suspended + (t.parked || 0);
  $("#rollouts-note").textContent = "(" + d.rollouts.length + " shown of " + live + ")";
  fill("#rollouts", d.rollouts.map(rolloutRow));
  fill("#ended", d.ended.slice().reverse().map(endedRow));
  $("#connections-note").textContent =
    "(" + d.connections.length + " shown of " + t.connections + ")";
  fill("#connections", d.connections.map((c) => row([mono(c.id), num(age(c.age_s)),
    c.lanes.join(", ") + (c.lanes_n > c.lanes.length ? " \u2026" : ""),
    num(c.frames_in), num(c.frames_out), num(c.rollouts)])));
  const caches = [["connection cache", pct(d.caches.connection) + "  (" +
    d.caches.connection.hits + " hits / " + d.caches.connection.misses + " misses)"]];
  if (d.caches.hydration) caches.push(["hydration cache", pct(d.caches.hydration)]);
  for (const [path, n] of Object.entries(d.caches.paths)) caches.push(["create." + path, n]);
  for (const [name, section] of Object.entries(d.sections))
    for (const [k, v] of Object.entries(section))
      caches.push([name + "." + k, typeof v === "object" ? JSON.stringify(v) : v]);
  fill("#caches", caches.map(([k, v]) => row([el("th", "", k), v])));
  $("#errors-note").textContent = "(" + d.errors.length + " newest of " + d.errors_total + ")";
  fill("#errors", d.errors.slice().reverse().map((e) => row([
    new Date(e.at * 1000).toLocaleTimeString(), e.source, num(e.status),
    el("td", "mono bad", e.code), e.message])));
  if (selected) {
    const found = d.rollouts.concat(d.ended).find((r) => r.id === selected);
    if (found && found.turns !== selectedTurns) ask(selected);
  }
}

function select(id) { selected = id; selectedTurns = -1;
  document.querySelectorAll("tr.selected").forEach((n) => n.classList.remove("selected"));
  document.querySelectorAll('tr[data-rollout-id="' + CSS.escape(id) + '"]')
    .forEach((n) => n.classList.add("selected"));
  ask(id); }
function ask(id) { if (feed && feed.readyState === 1)
  feed.send(JSON.stringify({ type: "turns", rollout_id: id })); }

function renderTurns(d) {
  if (d.rollout_id !== selected) return;
  selectedTurns = d.found ? d.turns.length : -1;
  $("#detail-title").textContent = d.rollout_id + (d.found ? " \u00b7 last response " +
    d.status : " \u00b7 no longer known");
  fill("#turns", d.turns.map((t) => row([num(t.index), mono(t.response_id),
    num(t.rendered_tokens), num(t.prompt_tokens), num(t.output_tokens),
    t.calls.join(", ") || "\u2013", t.finish, num(ms(t.pre_seconds)),
    num(ms(t.ttft_seconds)), num(ms(t.model_seconds))])));
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  feed = new WebSocket(scheme + location.host + "/inspect/feed");
  feed.onopen = () => { $("#live").textContent = "\u25cf live"; $("#live").className = "on";
    if (selected) ask(selected); };
  feed.onclose = () => { $("#live").textContent = "\u25cb reconnecting";
    $("#live").className = "off"; setTimeout(connect, 1000); };
  feed.onmessage = (m) => { const d = JSON.parse(m.data);
    if (d.type === "snapshot") render(d); else if (d.type === "turns") renderTurns(d); };
}
connect();
"""

PAGE = (
    "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
    "<meta name=viewport content='width=device-width, initial-scale=1'>"
    "<title>rollout inspector</title><style>"
    + _STYLE
    + "</style></head><body>"
    + _BODY
    + "<noscript><p>The inspector renders its live feed with JavaScript.</p></noscript>"
    + "<script>"
    + _SCRIPT
    + "</script></body></html>\n"
)


# The inspector's login (AUTH-13): the key goes in a POST body, so it never sits in a URL, an
# access log or the browser's history; it opens a session (AUTH-14); ``{retry}`` is replaced
# by a note after a refusal.
LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rollout inspector: sign in</title>
<style>body{font:14px system-ui,sans-serif;margin:15vh auto;max-width:360px;color:#222}
input{width:100%;padding:8px;margin:8px 0;box-sizing:border-box}</style></head>
<body><h1>rollout inspector</h1>{retry}
<form method="post" action="/inspect/login">
<label for="key">API key</label>
<input id="key" name="key" type="password" autocomplete="current-password" autofocus required>
<button type="submit">Open the inspector</button>
</form></body></html>
"""
