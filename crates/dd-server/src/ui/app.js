// DoubleDecker's live page. Everything it needs is served by the daemon (no outside fetch): it polls
// the admin API with the token given (host scope: /v1/stats, every VM; VM scope: /v1/vm/stats, that
// VM only), keeps the last minutes of samples in memory, and draws each VM's containers' use as stacked
// areas against the VM's entitlement, static (the weight share, dashed) and effective (with the shares
// under-used VMs and containers leave lent out by weight, solid). Where a guest provisioner reports
// (`doubledecker guest provision` with `[admin]`: /v1/provisioner, or /v1/vm/provisioner in VM scope),
// each VM also shows its containers' targets and the provisioner's last decisions. When a poll fails it
// says so at once and keeps trying.
"use strict";
const POLL_MS = 2000;
const WINDOW_S = 300;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
let token = "";
let scope = null; // "host" or "vm", found from which endpoint the token opens
const past = []; // {t, vms: [{vm, totals, pools}]}

function setStatus(state, text) {
  const s = document.getElementById("status");
  s.dataset.state = state;
  s.textContent = text;
}

function get(path) {
  return fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
}

async function fetchStats() {
  if (scope !== "vm") {
    const r = await get("/v1/stats");
    if (r.ok) { scope = "host"; return r.json(); }
    if (r.status !== 401 && r.status !== 403) throw new Error("HTTP " + r.status);
  }
  const r = await get("/v1/vm/stats");
  if (r.ok) { scope = "vm"; const v = await r.json(); return { vms: [v], vm_scope: true }; }
  if (r.status === 401 || r.status === 403) { scope = null; const e = new Error("unauthorized"); e.auth = true; throw e; }
  throw new Error("HTTP " + r.status);
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

const MIB = 1048576;
function mib(bytes) { return bytes == null ? "-" : (bytes / MIB).toFixed(1) + " MiB"; }
function pct(x) { return (100 * x).toFixed(1) + "%"; }
function targetText(t) {
  if (!t) return "none";
  if (t.kind === "hit_ratio") return "hit ratio >= " + pct(t.ratio);
  if (t.kind === "mean_latency") return "latency <= " + t.ms + " ms";
  return "reads/s >= " + t.ops_s;
}
function metText(m) { return m == null ? "-" : m ? "met" : "missed"; }
function specText(s) {
  if (s.type === "hybrid") return `hybrid ${s.mem_weight}:${s.ssd_weight}`;
  return s.type === "none" ? "none" : `${s.type} ${s.weight}`;
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
  const head = el("tr", {}, ...["container", "target", "plan", "measured", "hit ratio measured / predicted",
    "latency ms measured / predicted", "reads/s", "first level", "mem cache", "ssd cache", "spec", "memory limit"].map((h) => el("th", {}, h)));
  const rows = r.containers.map((c) => el("tr", { className: "decision", "data-vm": stored.vm, "data-container": c.name,
      "data-budget": c.budget_bytes, "data-target-met": String(c.target_met), "data-measured-met": String(c.measured_target_met) },
    el("td", {}, c.name + (c.pool == null ? "" : ` (pool ${c.pool})`)),
    el("td", {}, targetText(c.target)),
    el("td", { className: "met-" + metText(c.target_met) }, metText(c.target_met)),
    el("td", { className: "met-" + metText(c.measured_target_met) }, metText(c.measured_target_met)),
    el("td", {}, `${pct(c.measured_hit_ratio)} / ${pct(c.predicted_hit_ratio)}`),
    el("td", {}, `${c.measured_latency_ms} / ${c.predicted_latency_ms}`),
    el("td", {}, `${c.reads_per_s}`),
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

function sum(c, field) { return (c.mem[field] || 0) + (c.ssd[field] || 0); }

function rate(prev, cur, pick, dt) {
  if (!prev || dt <= 0) return 0;
  return Math.max(0, (pick(cur) - pick(prev)) / dt);
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

// Stacked areas of the pools' use in `store` over the window, with the VM's static (dashed) and
// effective (solid) entitlements as lines.
function drawChart(canvas, vmId, store) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, now = Date.now() / 1000;
  ctx.clearRect(0, 0, W, H);
  const samples = past.map((h) => ({ t: h.t, vm: h.vms.find((v) => v.vm === vmId) })).filter((s) => s.vm);
  if (samples.length === 0) return;
  const poolIds = [...new Set(samples.flatMap((s) => (s.vm.pools || []).map((p) => p.pool)))].sort((a, b) => a - b);
  let max = 1;
  for (const s of samples) {
    const used = (s.vm.pools || []).reduce((a, p) => a + p.counters[store].used, 0);
    const t = s.vm.totals[store];
    max = Math.max(max, used, t.entitlement, t.effective_entitlement || 0);
  }
  const x = (t) => W - ((now - t) / WINDOW_S) * W;
  const y = (v) => H - (v / max) * (H - 10);
  const base = samples.map(() => 0);
  poolIds.forEach((pid, i) => {
    const top = samples.map((s, k) => base[k] + ((s.vm.pools || []).find((p) => p.pool === pid)?.counters[store].used || 0));
    ctx.beginPath();
    samples.forEach((s, k) => (k ? ctx.lineTo(x(s.t), y(top[k])) : ctx.moveTo(x(s.t), y(top[k]))));
    for (let k = samples.length - 1; k >= 0; k--) ctx.lineTo(x(samples[k].t), y(base[k]));
    ctx.closePath();
    ctx.fillStyle = COLORS[i % COLORS.length] + "b0";
    ctx.fill();
    top.forEach((v, k) => (base[k] = v));
  });
  for (const [field, dash] of [["entitlement", [6, 4]], ["effective_entitlement", []]]) {
    ctx.beginPath();
    ctx.setLineDash(dash);
    samples.forEach((s, k) => {
      const v = s.vm.totals[store][field] || 0;
      k ? ctx.lineTo(x(s.t), y(v)) : ctx.moveTo(x(s.t), y(v));
    });
    ctx.strokeStyle = "#000";
    ctx.lineWidth = dash.length ? 1 : 2;
    ctx.stroke();
  }
  ctx.setLineDash([]);
  ctx.lineWidth = 1;
  ctx.fillStyle = "#333";
  ctx.fillText(max + " pages", 4, 12);
}

function render(stats, prov) {
  const host = document.getElementById("host");
  host.replaceChildren();
  if (stats.stores) {
    const stores = stats.stores.filter((s) => s.configured).map((s) => `${s.kind} ${s.used_pages}/${s.capacity_pages} pages`);
    host.append(el("p", { "data-scope": "host" }, `Host: mode ${stats.mode}; stores ${stores.join(", ")}; ${stats.vms.length} VM(s)`));
  } else {
    host.append(el("p", { "data-scope": "vm" }, "VM scope: this VM only"));
  }
  const prev = past.length > 1 ? past[past.length - 2] : null;
  const cur = past[past.length - 1];
  const dt = prev ? cur.t - prev.t : 0;
  const vms = document.getElementById("vms");
  vms.replaceChildren();
  for (const v of stats.vms) {
    const pv = prev && prev.vms.find((x) => x.vm === v.vm);
    // Container names, where a provisioner reports them with their pools.
    const names = {};
    for (const c of (prov[v.vm] ? prov[v.vm].report.containers : [])) if (c.pool != null) names[c.pool] = c.name;
    const rows = (v.pools || []).map((p, i) => {
      const pp = pv && (pv.pools || []).find((x) => x.pool === p.pool);
      const c = p.counters;
      const hits = sum(c, "gets_hit"), gets = hits + c.gets_missed;
      const used = c.mem.used + c.ssd.used;
      const r = (pick) => rate(pp && pp.counters, c, pick, dt).toFixed(1);
      const ents = (st) => `${c[st].used} / ${c[st].effective_entitlement || 0} / ${c[st].entitlement}`;
      return el("tr", { "data-vm": v.vm, "data-pool": p.pool, "data-used": used,
        "data-mem-ent": c.mem.entitlement, "data-mem-eff": c.mem.effective_entitlement || 0,
        "data-ssd-ent": c.ssd.entitlement, "data-ssd-eff": c.ssd.effective_entitlement || 0, className: "container" },
        el("td", {}, el("span", { className: "swatch", style: "background:" + COLORS[i % COLORS.length] }), `pool ${p.pool}` + (names[p.pool] ? ` (${names[p.pool]})` : "")),
        el("td", {}, `${p.spec.type}`),
        el("td", {}, ents("mem")),
        el("td", {}, ents("ssd")),
        el("td", {}, gets ? (100 * hits / gets).toFixed(1) + "%" : "-"),
        el("td", {}, r((x) => sum(x, "puts"))),
        el("td", {}, r((x) => sum(x, "gets_hit") + x.gets_missed)),
        el("td", {}, r((x) => sum(x, "evictions"))),
        el("td", {}, `${c.remote_pages || 0}`));
    });
    const head = el("tr", {}, ...["container", "spec", "mem used / eff. / static ent.", "ssd used / eff. / static ent.", "hit ratio", "puts/s", "gets/s", "evictions/s", "remote pages"].map((h) => el("th", {}, h)));
    const charts = el("div", { className: "charts" });
    for (const store of ["mem", "ssd"]) {
      const canvas = el("canvas", { width: 420, height: 140 });
      charts.append(el("div", { className: "chart" }, el("h3", {}, `${store} store: use per container (stacked), the VM's effective (solid) and static (dashed) entitlement`), canvas));
      requestAnimationFrame(() => drawChart(canvas, v.vm, store));
    }
    vms.append(el("div", { className: "vm", "data-vm": v.vm },
      el("h2", {}, `VM ${v.vm} (weights mem ${v.weights.mem}, ssd ${v.weights.ssd}; entitlement effective / static: mem ${v.totals.mem.effective_entitlement || 0} / ${v.totals.mem.entitlement}, ssd ${v.totals.ssd.effective_entitlement || 0} / ${v.totals.ssd.entitlement} pages)`),
      charts, el("table", {}, head, ...rows), ...(prov[v.vm] ? [provisionerSection(prov[v.vm])] : [])));
  }
}

async function poll() {
  if (!token) { setStatus("starting", "enter a token"); return; }
  try {
    const stats = await fetchStats();
    const prov = await fetchProvisioner();
    const t = Date.now() / 1000;
    past.push({ t, vms: stats.vms });
    while (past.length && past[0].t < t - WINDOW_S) past.shift();
    render(stats, prov);
    setStatus("live", `live (${scope} scope), updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    if (e.auth) setStatus("unauthorized", "the token is not accepted (host or VM admin token)");
    else setStatus("unreachable", `daemon unreachable since ${new Date().toLocaleTimeString()}; retrying every ${POLL_MS / 1000} s`);
  }
}

document.getElementById("window").textContent = WINDOW_S / 60 + " minutes";
document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("dd-token", token);
  past.length = 0;
  scope = null;
  poll();
});
// A token in the fragment (#token=...) never reaches a server log; it is moved to session storage.
const m = location.hash.match(/token=([^&]+)/);
if (m) { token = decodeURIComponent(m[1]); sessionStorage.setItem("dd-token", token); window.history.replaceState(null, "", location.pathname); }
else token = sessionStorage.getItem("dd-token") || "";
poll();
setInterval(poll, POLL_MS);
