// ReCycle live cluster page: plain JS, no build step. Reads /v1/page/... with the admin
// token (sessionStorage; from the login box or the URL fragment #token=..., which the
// browser never sends to the server) and draws the grid, the plan in force and history.
"use strict";

const STATES = ["live", "slow", "rejoining", "waiting", "finished", "fenced", "failed"];
const STATE_TIPS = {
  live: "in the plan, heartbeating", slow: "a straggler: the plan gives it a speed below 1",
  rejoining: "a newer incarnation, loading its stage from a peer (no heartbeat yet)",
  waiting: "in the plan, no heartbeat yet",
  finished: "the job finished (training completed): the worker exits, no longer watched",
  fenced: "failed by an operator: fenced out of the plan",
  failed: "failed (its own report or heartbeat silence)",
};
const OPS = { F: "#4c8bf5", I: "#f08a24", W: "#9aa5b1", B: "#e0663a", OPT: "#3a3f4b" };
const KEY = "recycle.admin";
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString([], { hour12: false }) : "");
const num = (x) => (x == null ? "–" : Number(x).toLocaleString("en-US"));
// Plan durations (period, makespan, bounds) are in the job spec's time unit: microseconds
// for a job measured by `recycle profile` / `recycle train`, whatever the spec's author
// chose otherwise.
const UNIT = "units";
const UNIT_TIP = "time units of the job spec's costs (microseconds when measured by recycle profile or recycle train)";
const dur = (x) => (x == null ? "–" : num(x) + " " + UNIT);

let token = null;
const ui = { view: null, plan: null, planVersion: -1, picked: null, feed: null };

// ---- token -------------------------------------------------------------------------------
function takeToken() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);  // out of the URL bar
  }
  token = sessionStorage.getItem(KEY);
}

function showLogin(message) {
  token = null;
  sessionStorage.removeItem(KEY);
  if (ui.feed) ui.feed.abort();
  for (const id of ["jobs", "job"]) $(id).hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("login-error").textContent = message || "";
  setConn("", "signed out");
}

class Denied extends Error {}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  if (r.status === 401 || r.status === 403) {
    const detail = (await r.json().catch(() => ({}))).detail || r.statusText;
    showLogin(r.status === 401 ? "Token rejected: " + detail : "Not allowed: " + detail);
    throw new Denied(detail);
  }
  if (!r.ok) throw new Error((await r.json().catch(() => ({}))).detail || r.statusText);
  return r;
}

function setConn(cls, text) {
  const c = $("conn");
  c.className = "conn " + cls;
  c.textContent = text;
}

// ---- job list ----------------------------------------------------------------------------
async function showJobs() {
  $("jobs").hidden = false;
  $("where").textContent = "jobs";
  for (;;) {
    try {
      const jobs = await (await api("/v1/page/jobs")).json();
      $("no-jobs").hidden = jobs.length > 0;
      $("job-table").querySelector("tbody").innerHTML = jobs.map((j) =>
        `<tr><td><a href="/jobs/${esc(j.id)}">${esc(j.id)}</a></td><td>${esc(j.state)}</td>` +
        `<td>${j.replicas} x ${j.stages}</td><td>${j.version}</td><td>${j.failed}</td>` +
        `<td>${clock(j.created)}</td></tr>`).join("");
      setConn("ok", "live");
    } catch (e) {
      if (e instanceof Denied) return;
      setConn("down", "service unreachable");
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
}

// ---- the live feed -----------------------------------------------------------------------
async function follow(jobId) {
  $("job").hidden = false;
  $("where").textContent = "job " + jobId;
  for (;;) {
    ui.feed = new AbortController();
    try {
      const r = await fetch(`/v1/page/jobs/${encodeURIComponent(jobId)}/live`, {
        headers: { Authorization: "Bearer " + token }, signal: ui.feed.signal, cache: "no-store" });
      if (r.status === 401 || r.status === 403 || r.status === 404) {
        const detail = (await r.json().catch(() => ({}))).detail || r.statusText;
        if (r.status === 404) { setConn("down", detail); $("job").hidden = true; return; }
        showLogin((r.status === 401 ? "Token rejected: " : "Not allowed: ") + detail);
        return;
      }
      if (!r.ok) throw new Error(r.statusText);
      setConn("ok", "live");
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const msg = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = msg.split("\n").filter((l) => l.startsWith("data: "))
            .map((l) => l.slice(6)).join("\n");
          if (data) await render(JSON.parse(data));
        }
      }
    } catch (e) {
      if (!token) return;  // signed out
    }
    setConn("down", "reconnecting");
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// ---- rendering ---------------------------------------------------------------------------
async function render(v) {
  ui.view = v;
  document.body.dataset.version = v.version;
  document.body.dataset.state = v.state;
  renderCards(v);
  renderGrid(v);
  renderTables(v);
  if (v.version !== ui.planVersion || (v.state === "halted") !== (ui.plan === null)) {
    ui.planVersion = v.version;
    ui.plan = null;  // a halted job has no plan in force (its /plan answers 410)
    if (v.state !== "halted") {
      try {
        ui.plan = await (await api(`/v1/page/jobs/${encodeURIComponent(v.id)}/plan`)).json();
      } catch (e) {
        ui.plan = null;
      }
    }
    renderGantt();
  }
}

function card(k, label, value, sub, tip) {
  return `<div class="card" data-k="${k}"${tip ? ` title="${esc(tip)}"` : ""}><div class="k">${label}</div>` +
    `<div class="v">${value}</div><div class="s">${sub || ""}</div></div>`;
}

function renderCards(v) {
  const counts = {};
  for (const row of v.states) for (const s of row) counts[s] = (counts[s] || 0) + 1;
  let oldest = null;
  v.ages.forEach((row, d) => row.forEach((a, s) => {
    if (a != null && v.states[d][s] !== "failed" && (!oldest || a > oldest[0])) oldest = [a, d, s];
  }));
  const p = v.precompute;
  const pct = p && p.total ? Math.round((100 * p.done) / p.total) : p && p.state === "done" ? 100 : 0;
  $("cards").innerHTML =
    card("state", "job", esc(v.state), `${v.replicas} replicas x ${v.stages} stages, ${v.microbatches} micro-batches`) +
    card("version", "plan version", v.version, esc(v.solver) + " " + esc(v.solver_status)) +
    training(v.progress) +
    card("period", "period", dur(v.period), "makespan " + dur(v.makespan), UNIT_TIP) +
    card("bound", "lower bound", dur(v.lower_bound), "gap " + (100 * v.gap).toFixed(1) + " %", UNIT_TIP) +
    card("kept", "kept throughput", v.kept == null ? "–" : (100 * v.kept).toFixed(1) + " %",
         "failure-free period " + dur(v.baseline_period), UNIT_TIP) +
    card("failed", "failed", (counts.failed || 0) + (counts.fenced || 0),
         `${counts.slow || 0} slow, ${counts.rejoining || 0} rejoining`) +
    card("heartbeat", "oldest heartbeat", oldest ? oldest[0].toFixed(1) + " s" : "–",
         oldest ? `worker ${oldest[1]}:${oldest[2]}, timeout ${v.timeout_s} s` : `timeout ${v.timeout_s} s`) +
    card("precompute", "precompute", p ? esc(p.state) : "–",
         p ? `${p.done} / ${p.total} failed sets<div class="bar"><div style="width:${pct}%"></div></div>` : "");
  $("reason").hidden = !v.reason;
  $("reason").textContent = v.reason || "";
  $("legend").innerHTML = STATES.map((s) =>
    `<span title="${esc(STATE_TIPS[s])}"><i class="st-${s}" style="background:var(--${s})"></i>${s} ${counts[s] || 0}</span>`).join("");
}

// The coordinator's last progress report (POST /v1/jobs/{id}/progress), if any.
function training(p) {
  if (!p) return card("progress", "training", "–", "no progress reported yet");
  const of = p.iterations ? ` / ${num(p.iterations)}` : "";
  const tok = p.tokens_per_s == null ? "– tok/s" : num(Math.round(p.tokens_per_s)) + " tok/s";
  const snap = p.snapshot_every == null ? "" : p.snapshot_every === 0 ? "snapshots off, " :
    `<span class="snap">snapshots every ${num(p.snapshot_every)}` +
    (p.snapshot_mib == null ? "" : ` (${Number(p.snapshot_mib).toFixed(1)} MiB a worker)`) + "</span>, ";
  return card("progress", "training", `iteration ${num(p.iteration)}${of}`,
    `loss <span class="loss">${p.loss == null ? "–" : Number(p.loss).toFixed(4)}</span>, <span class="tok">${tok}</span>, ` +
    snap + `reported ${clock(p.at)}`, "the newest iteration whose losses are all in (0-based)");
}

function picked(v) {
  if (ui.picked) return ui.picked;
  if (v.replicas * v.stages <= 32) return [...Array(v.replicas).keys()];  // small: all
  const out = [];
  v.states.forEach((row, d) => { if (row.some((s) => s !== "live" && s !== "waiting") && out.length < 3) out.push(d); });
  if (!out.includes(0)) out.unshift(0);
  return out.slice(0, 4).sort((a, b) => a - b);
}

function renderGrid(v) {
  const D = v.replicas, S = v.stages;
  const cw = Math.max(14, Math.min(56, Math.floor(1180 / D)));
  const ch = Math.max(14, Math.min(36, cw));
  const left = 34, top = 18, big = cw >= 40;
  const every = Math.ceil(26 / cw);
  const sel = new Set(picked(v));
  const parts = [];
  for (let d = 0; d < D; d += every) {
    parts.push(`<text x="${left + d * cw + cw / 2}" y="12" text-anchor="middle">${d}</text>`);
  }
  for (let s = 0; s < S; s++) {
    parts.push(`<text x="${left - 6}" y="${top + s * ch + ch / 2 + 4}" text-anchor="end">s${s}</text>`);
    for (let d = 0; d < D; d++) {
      const st = v.states[d][s], age = v.ages[d][s], x = left + d * cw, y = top + s * ch;
      // with roles: the slot this worker fills; marked when it is not its home slot
      const slot = v.roles ? v.roles[d][s] : null;
      const away = slot != null && (slot[0] !== d || slot[1] !== s);
      const tip = `worker ${d}:${s} (replica ${d}, stage ${s}): ${st}` +
        (away ? `, fills slot ${slot[0]}:${slot[1]} (stage ${slot[1]})` : "") +
        (age == null ? ", no heartbeat yet" : `, heartbeat ${age.toFixed(1)} s ago`) +
        `, speed ${v.speeds[d][s]}, incarnation ${v.incarnations[d][s]}`;
      parts.push(`<rect class="cell st-${st}${sel.has(d) ? " sel" : ""}${away ? " away" : ""}" data-replica="${d}" data-stage="${s}" ` +
        `data-state="${st}"${slot ? ` data-slot="${slot[0]}:${slot[1]}"` : ""} x="${x + 1}" y="${y + 1}" width="${cw - 2}" height="${ch - 2}" rx="2"><title>${esc(tip)}</title></rect>`);
      if (age != null && st !== "failed" && st !== "fenced") {
        const frac = Math.min(1, age / v.timeout_s);
        parts.push(`<rect class="age" x="${x + 2}" y="${y + ch - 4}" width="${Math.max(1, (cw - 4) * frac)}" height="2"/>`);
      }
      if (big) {
        const label = away ? `\u2192${slot[0]}:${slot[1]}` : st === "slow" ? "x" + v.speeds[d][s] : st !== "live" ? st : age.toFixed(1) + "s";
        parts.push(`<text class="in" x="${x + cw / 2}" y="${y + ch / 2 + 3}" text-anchor="middle">${esc(label)}</text>`);
      } else if (away) {
        parts.push(`<text class="in" x="${x + cw / 2}" y="${y + ch / 2 + 3}" text-anchor="middle">\u2192</text>`);
      }
    }
  }
  const svg = $("grid");
  svg.setAttribute("width", left + D * cw + 4);
  svg.setAttribute("height", top + S * ch + 4);
  svg.innerHTML = parts.join("");
}

// A version's moves: worker id, the stage it leaves (or "new": a fresh worker), the stage
// it takes, and where the state comes from.
function moves(ms) {
  return (ms || []).map((m) => `${m.worker} ${m.from_stage == null ? "new" : "s" + m.from_stage}` +
    `\u2192s${m.to_stage} (${m.source})`).join(", ");
}

function renderTables(v) {
  $("versions").querySelector("tbody").innerHTML = v.versions.slice().reverse().map((p) =>
    `<tr data-version="${p.version}"><td>${p.version}</td><td>${esc(p.cause)}</td>` +
    `<td>${esc(p.failed_key)}</td><td>${dur(p.period)}</td><td>${esc(p.solver)}</td>` +
    `<td class="moves">${esc(moves(p.moves))}</td><td>${clock(p.created)}</td></tr>`).join("");
  $("events").querySelector("tbody").innerHTML = v.events.slice().reverse().map((e) =>
    `<tr data-kind="${esc(e.kind)}"><td>${clock(e.created)}</td><td>${esc(e.kind)}${e.kind === "speed" ? " " + esc(e.speed) : ""}</td>` +
    `<td>${e.workers ? e.workers.map((w) => w[0] + ":" + w[1]).join(" ") : e.replica + ":" + e.stage}</td>` +
    `<td>${esc(e.source)}</td><td>${e.plan_version ?? ""}</td>` +
    `<td class="reason">${esc(e.reason)}</td></tr>`).join("");
}

function renderGantt() {
  const svg = $("gantt"), plan = ui.plan, v = ui.view;
  if (!plan || !v) {
    svg.innerHTML = "";
    $("gantt-title").textContent = "(none: the job is halted)";
    return;
  }
  const reps = picked(v), S = v.stages, M = v.microbatches;
  const byKey = new Map(plan.workers.map((w) => [w.replica + ":" + w.stage, w]));
  const filler = new Map((plan.roles || []).map((r) => [r.replica + ":" + r.stage, r.worker]));
  const rows = [];
  for (const d of reps) for (let s = 0; s < S; s++) rows.push([d, s, byKey.get(d + ":" + s)]);
  let end = 1;
  for (const [, , w] of rows) if (w) for (const a of w.actions) end = Math.max(end, a.end);
  const left = plan.roles ? 92 : 56, top = 16, rh = S * reps.length > 32 ? 12 : 18, width = 1150;
  const k = width / end;
  const parts = [];
  const step = Math.pow(10, Math.floor(Math.log10(end / 4)));
  for (let t = 0; t <= end; t += step * (end / step > 12 ? 5 : 1)) {
    const x = left + t * k;
    parts.push(`<line x1="${x}" y1="${top - 2}" x2="${x}" y2="${top + rows.length * rh}" stroke="#e5e7eb"/>` +
      `<text x="${x}" y="11" text-anchor="middle">${num(t)}</text>`);
  }
  rows.forEach(([d, s, w], i) => {
    const y = top + i * rh;
    const who = filler.get(d + ":" + s);  // with roles: the worker in this slot, if not its own
    parts.push(`<text x="${left - 6}" y="${y + rh - 4}" text-anchor="end">${d}:${s}` +
      (who && who !== d + "." + s ? ` (${esc(who)})` : "") + `</text>`);
    if (!w) {  // with roles a slot is empty when no worker fills it, whoever failed
      parts.push(`<rect x="${left}" y="${y + 1}" width="${width}" height="${rh - 2}" fill="#fbe3e3"/>` +
        `<text x="${left + 6}" y="${y + rh - 4}">${plan.roles ? "empty slot (no worker fills it)" : "not in the plan (failed)"}</text>`);
      return;
    }
    for (const a of w.actions) {
      const x = left + a.start * k, wd = Math.max(0.5, (a.end - a.start) * k);
      const rerouted = a.microbatch != null && Math.floor(a.microbatch / M) !== d;
      parts.push(`<rect x="${x}" y="${y + 1}" width="${wd}" height="${rh - 2}" fill="${OPS[a.op] || "#888"}"` +
        (rerouted ? ' stroke="#d33c3c" stroke-width="1.5"' : "") +
        `><title>${a.op}${a.microbatch ?? ""} on ${d}:${s}, ${a.start}–${a.end}${rerouted ? ", re-routed" : ""}</title></rect>`);
      if (wd > 16 && a.microbatch != null) {
        parts.push(`<text class="in" x="${x + wd / 2}" y="${y + rh - 5}" text-anchor="middle">${a.microbatch}</text>`);
      }
    }
  });
  document.body.dataset.planVersion = plan.version;
  svg.setAttribute("width", left + width + 10);
  svg.setAttribute("height", top + rows.length * rh + 4);
  svg.innerHTML = parts.join("");
  $("gantt-title").textContent = `v${plan.version}: replicas ${reps.join(", ")} of ${v.replicas}, ` +
    `period ${dur(plan.metrics.period)} (${esc(plan.solver.name)}); time axis in ${UNIT}`;
  $("gantt-legend").innerHTML = Object.entries(OPS).map(([op, c]) =>
    `<span><i style="background:${c}"></i>${op}</span>`).join("") +
    '<span><i style="background:#fff;border:1.5px solid #d33c3c"></i>re-routed micro-batch</span>';
}

// ---- start -------------------------------------------------------------------------------
function start() {
  takeToken();
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    $("login").hidden = true;
    route();
  });
  $("logout").addEventListener("click", () => showLogin("Signed out."));
  $("grid").addEventListener("click", (ev) => {
    const cell = ev.target.closest("rect.cell");
    if (!cell || !ui.view) return;
    const d = Number(cell.dataset.replica), cur = new Set(picked(ui.view));
    if (cur.has(d) && cur.size > 1) cur.delete(d); else cur.add(d);
    ui.picked = [...cur].sort((a, b) => a - b).slice(-8);
    renderGrid(ui.view);
    renderGantt();
  });
  route();
}

function route() {
  token = sessionStorage.getItem(KEY);
  if (!token) return showLogin();
  $("logout").hidden = false;
  const m = /^\/jobs\/([^/]+)$/.exec(location.pathname);
  if (m) follow(decodeURIComponent(m[1])); else showJobs();
}

start();
