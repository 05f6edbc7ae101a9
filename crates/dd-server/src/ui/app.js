// DoubleDecker's live page. Everything it needs is served by the daemon (no outside fetch): it polls
// the admin API with the token given (host scope: /v1/stats and /v1/history, every VM; VM scope:
// /v1/vm/stats and /v1/vm/history, that VM only). The history is the daemon's (it samples every VM and
// pool, `[history]` of its configuration), so a reload shows the past at once: the page fetches it
// whole once, then only the samples after the last one it has. Per VM it draws, over the chosen time
// range, each store's use per container (stacked) against the VM's entitlement, static (dashed) and
// effective (solid, with the shares under-used VMs and containers leave lent out by weight), and per
// container the second-chance hit ratio and the rates of gets, puts and evictions; every chart has a
// time axis, y ticks and a tooltip. Sizes are MiB throughout. Containers carry the names the watcher
// gave their pools (SET_LABEL). Where a guest provisioner reports (`doubledecker guest provision` with
// `[admin]`), each VM also shows its containers' targets and the provisioner's last decisions. When a
// poll fails it says since when, and keeps trying.
"use strict";
const POLL_MS = 2000;
const RANGES = [["5 minutes", 300], ["15 minutes", 900], ["1 hour", 3600]];
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const MIB = 1048576;
let token = "";
let scope = null; // "host" or "vm", found from which endpoint the token opens
let rangeS = 900;
let downSince = null; // when polls started failing (first failure), null while live
// The daemon's history, merged: {page_size_bytes, samples, vms: Map(vm -> {series, pools: Map(pool -> {label, series})})}
let hist = null;
let lastT = 0; // the newest sample's time (ms since the epoch, the daemon's clock)
let lastStats = null, lastProv = {};

function setStatus(state, text) {
  const s = document.getElementById("status");
  s.dataset.state = state;
  s.textContent = text;
}

function get(path) {
  return fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
}

function unauthorized() { scope = null; const e = new Error("unauthorized"); e.auth = true; return e; }

async function fetchStats() {
  if (scope !== "vm") {
    const r = await get("/v1/stats");
    if (r.ok) { scope = "host"; return r.json(); }
    if (r.status !== 401 && r.status !== 403) throw new Error("HTTP " + r.status);
  }
  const r = await get("/v1/vm/stats");
  if (r.ok) { scope = "vm"; const v = await r.json(); return { vms: [v], vm_scope: true }; }
  if (r.status === 401 || r.status === 403) throw unauthorized();
  throw new Error("HTTP " + r.status);
}

// The samples after the newest one the page has (all of them the first time), merged into `hist`.
async function fetchHistory() {
  const r = await get((scope === "host" ? "/v1/history" : "/v1/vm/history") + "?since_unix_ms=" + lastT);
  if (r.status === 401 || r.status === 403) throw unauthorized();
  if (!r.ok) throw new Error("HTTP " + r.status);
  const h = await r.json();
  if (!hist) hist = { vms: new Map() };
  hist.page_size_bytes = h.page_size_bytes;
  hist.samples = h.samples;
  hist.interval_ms = h.interval_ms;
  const append = (into, add) => {
    for (const [k, v] of Object.entries(add)) {
      const col = (into[k] = into[k] || []);
      col.push(...v);
      if (col.length > h.samples) col.splice(0, col.length - h.samples);
    }
  };
  const vms = new Map();
  for (const v of h.vms) {
    const old = hist.vms.get(v.vm) || { series: {}, pools: new Map() };
    append(old.series, v.series);
    const pools = new Map();
    for (const p of v.pools) {
      const op = old.pools.get(p.pool) || { series: {} };
      op.label = p.label;
      append(op.series, p.series);
      pools.set(p.pool, op);
    }
    old.pools = pools; // pools the daemon no longer has are gone from the answer, so from the page
    vms.set(v.vm, old);
    const t = v.series.t_unix_ms;
    if (t.length) lastT = Math.max(lastT, t[t.length - 1]);
  }
  hist.vms = vms;
}

// The provisioners' last reports by VM id (none where no provisioner reports: 404 no_report).
async function fetchProvisioner() {
  const r = await get(scope === "host" ? "/v1/provisioner" : "/v1/vm/provisioner");
  if (r.status === 404) return {};
  if (!r.ok) throw new Error("HTTP " + r.status);
  const body = await r.json();
  const out = {};
  for (const rep of Array.isArray(body) ? body : [body]) out[rep.vm] = rep;
  return out;
}

function pageSize() { return (hist && hist.page_size_bytes) || (lastStats && lastStats.page_size) || 4096; }
function mib(bytes) { return bytes == null ? "-" : (bytes / MIB).toFixed(1) + " MiB"; }
function mibOfPages(pages) { return (pages * pageSize() / MIB).toFixed(1); }
function pct(x) { return (100 * x).toFixed(1) + "%"; }
function targetText(t) {
  if (!t) return "none";
  if (t.kind === "hit_ratio") return "hit ratio >= " + pct(t.ratio);
  if (t.kind === "mean_latency") return "latency <= " + t.ms + " ms";
  return "reads/s >= " + t.ops_s;
}
function metText(m) { return m == null ? "-" : m ? "met" : "missed"; }
function specText(s) {
  if (s.type === "hybrid") return `hybrid, weights mem ${s.mem_weight} : ssd ${s.ssd_weight}`;
  return s.type === "none" ? "none" : `${s.type}, weight ${s.weight}`;
}
function two(n) { return String(n).padStart(2, "0"); }
function clock(ms) { const d = new Date(ms); return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`; }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

// A container's name: the watcher's label, else the provisioner's name for its pool, else its number.
function containerName(vmId, poolId, label) {
  if (label) return label;
  const rep = lastProv[vmId];
  const c = rep && rep.report.containers.find((x) => x.pool === poolId);
  return c ? c.name : `pool ${poolId}`;
}

// Per-second rates of a counter column (one point per interval between two samples).
function rates(t, v) {
  const out = { t: [], v: [] };
  for (let i = 1; i < t.length; i++) {
    const dt = (t[i] - t[i - 1]) / 1000;
    if (dt > 0) { out.t.push(t[i]); out.v.push(Math.max(0, (v[i] - v[i - 1]) / dt)); }
  }
  return out;
}

// The second-chance hit ratio per interval (null where the interval had no gets: a gap).
function hitRatios(s) {
  const out = { t: [], v: [] };
  for (let i = 1; i < s.t_unix_ms.length; i++) {
    const h = s.gets_hit[i] - s.gets_hit[i - 1], m = s.gets_missed[i] - s.gets_missed[i - 1];
    out.t.push(s.t_unix_ms[i]);
    out.v.push(h + m > 0 ? Math.max(0, h) / (h + m) : null);
  }
  return out;
}

function niceStep(max, n) {
  const raw = max / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

const TIME_STEPS = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800].map((s) => s * 1000);

// Draws `lines` ([{name, color, t, v, dash, width, fill}]) over [t1 - range, t1] with axes, ticks
// and (through `canvas.chart`) a tooltip. `stack`: fills are stacked areas in order.
function drawChart(canvas, spec) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  const L = 56, R = 8, T = 8, B = 22; // plot margins: y tick labels left, time labels below
  ctx.clearRect(0, 0, W, H);
  // The range chosen, or the history there is when it is shorter (a young daemon's charts fill the width).
  const oldest = Math.min(...spec.lines.filter((l) => l.t.length).map((l) => l.t[0]));
  const t1 = lastT, t0 = Math.min(t1 - 10000, Math.max(t1 - rangeS * 1000, oldest));
  const inRange = (l) => l.t.map((t, i) => [t, l.v[i]]).filter(([t]) => t >= t0 && t <= t1);
  const lines = spec.lines.map((l) => ({ ...l, pts: inRange(l) }));
  let max = spec.minMax || 0;
  for (const l of lines) for (const [, v] of l.pts) if (v != null) max = Math.max(max, v);
  if (spec.fixedMax) max = spec.fixedMax;
  if (!(max > 0)) max = 1;
  const step = niceStep(max, 4);
  max = Math.ceil(max / step) * step;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  // Grid and y ticks.
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeStyle = "#e6e6e6";
  ctx.fillStyle = "#444";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= max + step / 2; v += step) {
    ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(W - R, y(v)); ctx.stroke();
    ctx.fillText(spec.fmt(v), L - 4, y(v));
  }
  // Time ticks: about five over the range.
  const ts = TIME_STEPS.find((s) => (t1 - t0) / s <= 6) || 3600000;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let t = Math.ceil(t0 / ts) * ts; t <= t1; t += ts) {
    ctx.beginPath(); ctx.moveTo(x(t), T); ctx.lineTo(x(t), H - B); ctx.stroke();
    ctx.fillText(clock(t), x(t), H - B + 4);
  }
  ctx.strokeStyle = "#888";
  ctx.beginPath(); ctx.moveTo(L, T); ctx.lineTo(L, H - B); ctx.lineTo(W - R, H - B); ctx.stroke();
  // Stacked areas, then lines.
  const base = new Map();
  for (const l of lines.filter((l) => l.fill)) {
    if (!l.pts.length) continue;
    const top = l.pts.map(([t, v]) => [t, (base.get(t) || 0) + (v || 0)]);
    ctx.beginPath();
    top.forEach(([t, v], k) => (k ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    for (let k = l.pts.length - 1; k >= 0; k--) ctx.lineTo(x(l.pts[k][0]), y(base.get(l.pts[k][0]) || 0));
    ctx.closePath();
    ctx.fillStyle = l.color + "b0";
    ctx.fill();
    for (const [t, v] of top) base.set(t, v);
  }
  for (const l of lines.filter((l) => !l.fill)) {
    ctx.beginPath();
    ctx.setLineDash(l.dash || []);
    let pen = false;
    for (const [t, v] of l.pts) {
      if (v == null) { pen = false; continue; }
      pen ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v));
      pen = true;
    }
    ctx.strokeStyle = l.color;
    ctx.lineWidth = l.width || 1.5;
    ctx.stroke();
  }
  ctx.setLineDash([]);
  ctx.lineWidth = 1;
  canvas.chart = { lines, x, t0, t1, L, R, W, fmt: spec.fmt };
  // What the page drew, for those who read the DOM (the browser test): the points of the fullest line.
  canvas.dataset.points = String(Math.max(0, ...lines.map((l) => l.pts.length)));
  canvas.dataset.series = lines.map((l) => l.name).join("|");
}

function showTip(ev) {
  const c = ev.target.chart, tip = document.getElementById("tip");
  if (!c) return;
  const rect = ev.target.getBoundingClientRect();
  const px = (ev.clientX - rect.left) * (ev.target.width / rect.width);
  const t = c.t0 + ((px - c.L) / (c.W - c.L - c.R)) * (c.t1 - c.t0);
  const rows = [];
  let at = null;
  for (const l of c.lines) {
    if (!l.pts.length) continue;
    let best = l.pts[0];
    for (const p of l.pts) if (Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p;
    at = at || best[0];
    rows.push(el("div", {}, el("span", { className: "swatch", style: "background:" + l.color }), `${l.name}: ${best[1] == null ? "-" : c.fmt(best[1])}`));
  }
  if (!rows.length) { tip.hidden = true; return; }
  tip.replaceChildren(el("div", { className: "tip-time" }, clock(at)), ...rows);
  tip.hidden = false;
  tip.style.left = ev.pageX + 12 + "px";
  tip.style.top = ev.pageY + 12 + "px";
}

function chartBox(title, kind, vmId, spec) {
  const canvas = el("canvas", { width: 460, height: 170, className: "chart-canvas", "data-chart": kind, "data-vm": vmId });
  canvas.addEventListener("mousemove", showTip);
  canvas.addEventListener("mouseleave", () => (document.getElementById("tip").hidden = true));
  const legend = el("div", { className: "legend" }, ...spec.lines.filter((l) => !l.hideInLegend).map((l) =>
    el("span", {}, el("span", { className: "swatch" + (l.dash ? " dashed" : ""), style: "background:" + l.color }), l.name)));
  const box = el("div", { className: "chart" }, el("h3", {}, title), canvas, legend);
  box.draw = () => drawChart(canvas, spec);
  return box;
}

// A VM's provisioner section: its last round's targets and decisions, with how old the report is.
function provisionerSection(stored) {
  const r = stored.report;
  const age = Math.max(0, Math.round((Date.now() - stored.received_unix_ms) / 1000));
  // Missed: measured below the target for the closed loop's report_after rounds; infeasible: nothing
  // measured or predicted within the budget meets it.
  const said = [["infeasible", r.infeasible], ["missed", r.missed || []]].filter(([, l]) => l.length)
    .map(([k, l]) => k + ": " + l.join(", "));
  const verdict = r.feasible ? "every target feasible" : (said.join("; ") || "a target below, not yet reported");
  const head = el("tr", {}, ...["container", "target", "plan", "measured", "hit ratio of reads, measured / predicted",
    "latency ms measured / predicted", "reads/s measured / predicted (correction)", "first level", "mem cache", "ssd cache", "spec", "memory limit"].map((h) => el("th", {}, h)));
  const rows = r.containers.map((c) => el("tr", { className: "decision", "data-vm": stored.vm, "data-container": c.name,
      "data-budget": c.budget_bytes, "data-target-met": String(c.target_met), "data-measured-met": String(c.measured_target_met) },
    el("td", {}, c.name + (c.pool == null ? "" : ` (pool ${c.pool})`)),
    el("td", {}, targetText(c.target)),
    el("td", { className: "met-" + metText(c.target_met) }, metText(c.target_met)),
    el("td", { className: "met-" + metText(c.measured_target_met) }, metText(c.measured_target_met)),
    el("td", {}, `${pct(c.measured_hit_ratio)} / ${pct(c.predicted_hit_ratio)}`),
    el("td", {}, `${c.measured_latency_ms} / ${c.predicted_latency_ms}`),
    // The correction: measured over predicted throughput the closed loop learnt (1: the model was right).
    el("td", {}, `${c.reads_per_s} / ${c.predicted_reads_per_s} (x${c.correction ?? 1})`),
    el("td", {}, mib(c.budget_bytes)),
    el("td", {}, mib(c.mem_cache_bytes)),
    el("td", {}, mib(c.ssd_cache_bytes)),
    el("td", {}, specText(c.spec)),
    el("td", {}, mib(c.memory_limit_bytes))));
  return el("div", { className: "provisioner", "data-provisioner-vm": stored.vm, "data-feasible": String(r.feasible) },
    el("h3", {}, `Provisioner: round ${r.round}${r.applied ? "" : " (dry run)"}, ${verdict}; shared out: first level ${mib(r.memory_bytes)}, ` +
      `mem cache ${mib(r.mem_cache_bytes)}, ssd cache ${mib(r.ssd_cache_bytes)}; reported ${age} s ago`),
    el("table", {}, head, ...rows));
}

function last(col) { return col && col.length ? col[col.length - 1] : 0; }

// One VM: its charts from the history, then a table of its containers as they are now.
function vmSection(v, h) {
  const pools = [...(h ? h.pools.entries() : [])].sort((a, b) => a[0] - b[0]);
  const color = (i) => COLORS[i % COLORS.length];
  const name = (pid, p) => containerName(v.vm, pid, p.label);
  const charts = [];
  const pagesToMib = (col) => (col || []).map((x) => (x * pageSize()) / MIB);
  const mibFmt = (x) => x.toFixed(x < 10 ? 1 : 0) + " MiB";
  for (const store of ["mem", "ssd"]) {
    if (!h) break;
    const vs = h.series;
    if (store === "ssd" && !last(vs.ssd_entitlement_pages) && !last(vs.ssd_used_pages)) continue;
    const lines = pools.map(([pid, p], i) => ({ name: name(pid, p), color: color(i), fill: true, t: p.series.t_unix_ms, v: pagesToMib(p.series[store + "_used_pages"]) }));
    lines.push({ name: "effective entitlement", color: "#000", width: 2, t: vs.t_unix_ms, v: pagesToMib(vs[store + "_effective_entitlement_pages"]) });
    lines.push({ name: "static entitlement", color: "#000", dash: [6, 4], width: 1, t: vs.t_unix_ms, v: pagesToMib(vs[store + "_entitlement_pages"]) });
    charts.push(chartBox(`${store} store: use per container (stacked), MiB, against the VM's entitlement`, store + "-use", v.vm, { lines, fmt: mibFmt, minMax: 1 }));
  }
  if (h) {
    charts.push(chartBox("second-chance hit ratio per container (hits / gets of the pool, per interval)", "hit-ratio", v.vm, {
      lines: pools.map(([pid, p], i) => ({ name: name(pid, p), color: color(i), ...hitRatios(p.series) })),
      fmt: (x) => (100 * x).toFixed(0) + "%", fixedMax: 1,
    }));
    for (const [field, what] of [["gets", "gets/s"], ["puts", "puts/s"], ["evictions", "evictions/s"]]) {
      const lines = pools.map(([pid, p], i) => {
        const s = p.series;
        const v = field === "gets" ? s.gets_hit.map((x, k) => x + s.gets_missed[k]) : s[field];
        return { name: name(pid, p), color: color(i), ...rates(s.t_unix_ms, v) };
      });
      charts.push(chartBox(`${what} per container`, field + "-rate", v.vm, { lines, fmt: (x) => (x >= 1000 ? (x / 1000).toFixed(1) + "k" : x.toFixed(x < 10 ? 1 : 0)), minMax: 1 }));
    }
  }
  const rows = (v.pools || []).map((p) => {
    const i = pools.findIndex(([pid]) => pid === p.pool);
    const hp = i >= 0 ? pools[i][1].series : null;
    const c = p.counters;
    const hits = c.mem.gets_hit + c.ssd.gets_hit, gets = hits + c.gets_missed;
    const used = c.mem.used + c.ssd.used;
    const rate = (pick) => {
      if (!hp || hp.t_unix_ms.length < 2) return "-";
      const r = rates(hp.t_unix_ms.slice(-2), pick(hp).slice(-2));
      return r.v.length ? r.v[0].toFixed(1) : "-";
    };
    const ents = (st) => `${mibOfPages(c[st].used)} / ${mibOfPages(c[st].effective_entitlement || 0)} / ${mibOfPages(c[st].entitlement)}`;
    const label = containerName(v.vm, p.pool, p.label);
    return el("tr", { "data-vm": v.vm, "data-pool": p.pool, "data-used": used, "data-name": label,
      "data-mem-ent": c.mem.entitlement, "data-mem-eff": c.mem.effective_entitlement || 0,
      "data-ssd-ent": c.ssd.entitlement, "data-ssd-eff": c.ssd.effective_entitlement || 0, className: "container" },
      el("td", {}, el("span", { className: "swatch", style: "background:" + color(i < 0 ? 0 : i) }), label + (label === `pool ${p.pool}` ? "" : ` (pool ${p.pool})`)),
      el("td", {}, specText(p.spec)),
      el("td", {}, ents("mem")),
      el("td", {}, ents("ssd")),
      el("td", {}, gets ? pct(hits / gets) : "-"),
      el("td", {}, rate((s) => s.puts)),
      el("td", {}, rate((s) => s.gets_hit.map((x, k) => x + s.gets_missed[k]))),
      el("td", {}, rate((s) => s.evictions)),
      el("td", {}, `${c.remote_pages || 0}`));
  });
  const head = el("tr", {}, ...["container", "spec", "mem MiB used / eff. / static ent.", "ssd MiB used / eff. / static ent.",
    "second-chance hit ratio (since created)", "puts/s", "gets/s", "evictions/s", "remote pages"].map((x) => el("th", {}, x)));
  const t = v.totals;
  const section = el("div", { className: "vm", "data-vm": v.vm },
    el("h2", {}, `VM ${v.vm} (weights mem ${v.weights.mem}, ssd ${v.weights.ssd}; entitlement effective / static: mem ${mibOfPages(t.mem.effective_entitlement || 0)} / ${mibOfPages(t.mem.entitlement)} MiB, ssd ${mibOfPages(t.ssd.effective_entitlement || 0)} / ${mibOfPages(t.ssd.entitlement)} MiB)`),
    el("div", { className: "charts" }, ...charts), el("table", {}, head, ...rows), ...(lastProv[v.vm] ? [provisionerSection(lastProv[v.vm])] : []));
  section.charts = charts;
  return section;
}

function render() {
  const stats = lastStats;
  if (!stats) return;
  const host = document.getElementById("host");
  host.replaceChildren();
  if (stats.stores) {
    const ps = stats.page_size || pageSize();
    const stores = stats.stores.filter((s) => s.configured).map((s) => `${s.kind} ${mib(s.used_pages * ps)} of ${mib(s.capacity_pages * ps)}`);
    host.append(el("p", { "data-scope": "host" }, `Host: mode ${stats.mode}; stores ${stores.join(", ")}; ${stats.vms.length} VM(s)`));
  } else {
    host.append(el("p", { "data-scope": "vm" }, "VM scope: this VM only"));
  }
  if (hist) host.append(el("p", { className: "note" }, `The daemon samples every ${hist.interval_ms / 1000} s and keeps ${hist.samples} samples (${(hist.samples * hist.interval_ms / 60000).toFixed(0)} minutes).`));
  const vms = document.getElementById("vms");
  vms.replaceChildren();
  for (const v of stats.vms) {
    const s = vmSection(v, hist && hist.vms.get(v.vm));
    vms.append(s);
    for (const c of s.charts) c.draw();
  }
}

async function poll() {
  if (!token) { setStatus("starting", "enter a token"); return; }
  try {
    lastStats = await fetchStats();
    await fetchHistory();
    lastProv = await fetchProvisioner();
    downSince = null;
    render();
    setStatus("live", `live (${scope} scope), updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    if (e.auth) setStatus("unauthorized", "the token is not accepted (host or VM admin token)");
    else {
      downSince = downSince || new Date();
      setStatus("unreachable", `daemon unreachable since ${downSince.toLocaleTimeString()}; retrying every ${POLL_MS / 1000} s`);
    }
  }
}

const select = document.getElementById("range");
for (const [label, s] of RANGES) select.append(el("option", { value: String(s), selected: s === rangeS }, label));
select.addEventListener("change", () => { rangeS = Number(select.value); render(); });
document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("dd-token", token);
  hist = null;
  lastT = 0;
  scope = null;
  poll();
});
// A token in the fragment (#token=...) never reaches a server log; it is moved to session storage.
const m = location.hash.match(/token=([^&]+)/);
if (m) { token = decodeURIComponent(m[1]); sessionStorage.setItem("dd-token", token); window.history.replaceState(null, "", location.pathname); }
else token = sessionStorage.getItem("dd-token") || "";
poll();
setInterval(poll, POLL_MS);
