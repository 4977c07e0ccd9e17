// "Now": the attention strip, providers (their state and why), managed processes, profiles' effective order.
import { $, badge, color, el, fill, fmt, getJSON, row, spark, state } from "./core.js";

const TOOL_LOOP_RECENT_S = 3600;  // a tool loop stopped within the last hour needs a look

// -- a provider's state, and why ---------------------------------------------------------------------------------

// One state per provider, computed once by the daemon (admin/words.py) from its availability verdict and the
// process's lifecycle: printed here as it is, never derived again from breaker, health and budget fields.
export function providerState(p) {
  const s = p.state || { word: "unknown", kind: "", problem: null };
  return { text: s.word, kind: s.kind, problem: s.problem };
}

// When a retry is due, counted down each second from the daemon's "retry in" (no clock shared with it).
function countdown(secondsFromNow, retryAt, prefix) {
  const span = el("span", null, "countdown");
  span.dataset.deadline = String(Date.now() / 1000 + secondsFromNow);
  if (retryAt) span.dataset.retryAt = String(retryAt);
  span.dataset.prefix = prefix;
  tick(span);
  return span;
}
function tick(span) {
  const left = Number(span.dataset.deadline) - Date.now() / 1000;
  span.textContent = left > 0.5 ? span.dataset.prefix + " " + fmt.dur(left) : span.dataset.prefix + " now";
}
setInterval(() => document.querySelectorAll(".countdown").forEach(tick), 1000);

function why(p, procs) {
  const box = el("div", null, "why");
  const line = (text, cls) => { const d = el("div", text, cls); box.append(d); return d; };
  const b = p.budget;
  if (b && b.blocked) {
    line(`spent ${fmt.usd(b.spent)} of its ${fmt.usd(b.cap)} monthly cap: skipped until the month ends`, "bad");
  }
  if (p.key_problem) line(p.key_problem, "bad");
  const a = p.availability;
  if (b && b.skipped && !(a && a.code === "budget_skipped")) {
    // Some requests skipped for their estimate, others served: said, not a state of its own.
    line("budget: " + b.skipped.words, "warn").classList.add("budget-skips");
  }
  const probe = p.health_detail && p.health_detail.last_probe;
  if (probe && !probe.ok) {
    const n = p.health_detail.consecutive_failures;
    line(`probe failed${n > 1 ? ` ${n} times` : ""}: ${probe.detail || "no detail"} (${fmt.time(probe.at)})`, "bad");
  }
  if (a && a.code !== "ok") {
    // The daemon's words for why it gets no traffic (or why it still does); the retry counts down live.
    const takes = p.state ? p.state.takes_traffic : a.available;
    const d = line((takes ? "" : "no traffic: ") + a.why, takes && (!p.state || p.state.kind !== "bad") ? "warn" : "bad");
    d.classList.add("availability");
    d.dataset.code = a.code;
    if (a.retry_in_s !== null && a.retry_in_s !== undefined) {
      d.append(" · ", countdown(a.retry_in_s, (p.breaker || {}).retry_at, "next try in"));
    }
  }
  const proc = p.process && procs[p.process];
  if (proc && proc.state !== "ready") {
    line(`process ${p.process}: ${proc.state}` + (proc.fatal_reason ? ` (${proc.fatal_reason})` : "") +
      (proc.last_exit ? `, ${proc.last_exit}` : ""), proc.state === "fatal" ? "bad" : "warn");
    if (proc.next_probe_at && !box.querySelector(".countdown")) {  // one countdown per provider (E12)
      const d = line("");
      d.append(countdown(proc.next_probe_at - state.nowFetchedAt.daemon, null, "recovery probe in"));
    }
  }
  const drift = p.drift;
  if (drift && drift.signals && Object.keys(drift.signals).length) {
    line(`drift on ${drift.model}: ${Object.keys(drift.signals).join(", ")} (score ${fmt.num(drift.score, 2)})`, "warn");
  }
  return box;
}

// -- render ----------------------------------------------------------------------------------------------------

// What a process holds now: a stopped one holds nothing, whatever its configured size (issue 43, E13).
function memoryOf(p) {
  const stopped = ["stopped", "fatal", "exited"].includes(p.state) || (p.resident === false && p.state !== "ready");
  if (!p.memory_mb || stopped) return "–";
  return `${Math.round(p.memory_mb).toLocaleString()} MB${p.pinned ? " pinned" : ""}`;
}

let sparkData = null;
export function setSparkData(s) { sparkData = s; }

export function renderNow(now) {
  state.now = now;
  const d = now.daemon;
  state.nowFetchedAt = { daemon: now.daemon.started_at + now.daemon.uptime_s };
  $("#daemon-line").textContent = `v${d.version} · up ${fmt.dur(d.uptime_s)} · profile ${d.active_profile} · ${d.listen.url}`;
  const win = d.stats_window_s || 60;
  $("#p50-head").textContent = `p50, last ${fmt.dur(win)}`;
  const inFlight = Object.values(now.in_flight || {}).reduce((a, b) => a + b, 0);
  $("#in-flight").textContent = inFlight ? `(${inFlight} in flight)` : "";
  const procs = now.processes || {};
  fill($("#providers-table tbody"), now.providers.map((p) => {
    state.providers.add(p.name);
    const name = el("span");
    const dot = el("span", null, "dot");
    dot.style.background = color(p.name);
    name.append(dot, el("strong", p.name), el("span", " " + p.kind + (p.model ? " · " + p.model : ""), "dim"));
    const st = providerState(p);
    const s = sparkData && sparkData.providers[p.name];
    const sp = s ? spark(p.name, sparkData.t, s.total_p50, `${p.name}: total time p50 over the last hour`) : null;
    const p50 = p.figures && p.figures.median_s !== null && p.figures.median_s !== undefined ? p.figures.median_s * 1000 : null;
    const hit = p.cache ? p.cache.hit_ratio : null;
    const b = p.budget;
    const money = b ? fmt.usd(b.spent) + (b.cap ? " / " + fmt.usd(b.cap) : "") : "–";
    const tr = row([name, badge(st.text, st.kind), why(p, procs), sp || el("span", "no requests", "dim"),
      [fmt.ms(p50), "num"], [fmt.pct(hit), "num"], [money, b && b.blocked ? "num bad" : "num"]]);
    tr.dataset.provider = p.name;
    tr.dataset.state = st.text;
    tr.dataset.kind = st.kind;
    if (p.availability) tr.dataset.traffic = p.availability.code;
    tr.id = "provider-" + p.name;
    return tr;
  }));
  const names = Object.keys(procs);
  $("#processes-empty").hidden = names.length > 0;
  $("#processes-table").hidden = names.length === 0;
  fill($("#processes-table tbody"), names.map((n) => {
    const p = procs[n];
    const tr = row([el("strong", n), badge(p.state, p.state === "ready" ? "ok" : p.state === "fatal" ? "bad" : p.state === "stopped" ? "idle" : "warn"),
      [fmt.dur(p.uptime_s), "num"], [String(p.restarts_total ?? 0), "num"],
      [memoryOf(p), "num"],
      p.idle_stop_in_s !== null && p.idle_stop_in_s !== undefined ? "in " + fmt.dur(p.idle_stop_in_s) : "–",
      p.last_stop_reason || "–",
      [(p.last_exit || "–") + (p.fatal_reason ? ` · ${p.fatal_reason}` : ""), p.state === "fatal" ? "bad" : ""],
      [p.last_log_line || "–", "log"]]);
    tr.id = "process-" + n;
    tr.dataset.process = n;
    return tr;
  }));
  // Resident local models against [models] memory_budget_mb (README: Several local models).
  const m = now.models;
  const budget = $("#models-budget");
  budget.hidden = !m;
  if (m) {
    const held = `${Math.round(m.memory_held_mb).toLocaleString()} MB held`;
    const of = m.memory_budget_mb ? ` of ${Math.round(m.memory_budget_mb).toLocaleString()} MB budget` : " (no budget)";
    const lanes = Object.values(m.saved_lanes || {}).reduce((a, b) => a + b, 0);
    const saved = lanes ? `; saved caches: ${lanes} lane${lanes === 1 ? "" : "s"} (${fmt.bytes(m.saved_bytes || 0)})` : "";
    budget.textContent = `Local models: ${held}${of}; resident: ${(m.resident || []).join(", ") || "none"}${saved}`;
  }
  renderAttention();
}

// -- needs attention -------------------------------------------------------------------------------------------

// Everything wrong now, one line each with a link to its detail; empty (and says so) when all is well.
export function renderAttention() {
  const now = state.now;
  const items = [];
  const add = (kind, text, href, tone) => items.push({ kind, text, href, tone });
  if (!state.reachable) {
    add("daemon", `coderouterd is not answering since ${fmt.time(state.unreachableSince)} (${state.unreachableWhy}): ` +
      "everything below is as it was then", "#now");
  }
  if (now) {
    for (const p of now.providers) {
      const st = providerState(p);
      const b = p.budget;
      const spent = b ? ` (${fmt.usd(b.spent)} of ${fmt.usd(b.cap)})` : "";
      // A FATAL process has its own entry below: its provider is not listed twice.
      if (st.problem === "down" && p.process_state !== "fatal") {
        add("down", st.text.startsWith("down: ") ? `${p.name} is down (${st.text.slice(6)})` : `${p.name}: ${st.text}`,
          "#provider-" + p.name, st.kind);
      } else if (st.problem === "budget") {
        const what = p.availability && p.availability.code === "budget_skipped" ? `skipped: ${p.availability.why}`
          : st.text === "near its cap" ? "near its monthly cap" + spent : "blocked by its monthly cap" + spent;
        add("budget", `${p.name}: ${what}`, "#provider-" + p.name, st.kind);
      } else if (st.problem === "key") add("key", `${p.name}: ${p.key_problem || st.text}`, "#provider-" + p.name, st.kind);
      const drift = p.drift;
      if (drift && drift.signals && Object.keys(drift.signals).length) {
        add("drift", `drift detected on ${p.name} (${drift.model})`, "#provider-" + p.name);
      }
    }
    const g = now.budget_global;
    if (g && g.cap && g.blocked) add("budget", `every paid provider is blocked by the global cap (${fmt.usd(g.cap)})`, "#spend");
    for (const [n, p] of Object.entries(now.processes || {})) {
      if (p.state === "fatal") add("fatal", `process ${n} is FATAL` + (p.fatal_reason ? `: ${p.fatal_reason}` : ""), "#process-" + n);
    }
    const since = Date.now() / 1000 - TOOL_LOOP_RECENT_S;
    for (const e of now.events || []) {
      if (e.kind === "guard_fired" && e.guard === "tool_loop" && e.action === "break" && e.ts >= since) {
        const det = e.detail || {};
        add("loop", `tool loop stopped at ${fmt.time(e.ts)}: ${det.tool || "?"} repeated ${det.repeat_count || "?"} times`,
          "#/requests/" + encodeURIComponent(e.request_id || ""));
      }
    }
    if (now.shared && now.shared.up === false) {
      const why = now.shared.meaning || now.shared.problem;  // the daemon's words for the driver's text (E16)
      add("shared", `the shared database is unreachable` + (why ? `: ${why}` : ""), "#now");
    }
    if (now.store && now.store.healthy === false) add("store", `state: ${now.store.problem}`, "#now");
  }
  // Team keys (keys.js): near their cap, blocked, expiring soon.
  for (const a of state.keyAttention || []) add(a.kind, a.text, "#keys");
  const ul = $("#attention-list");
  ul.replaceChildren(...items.map((it) => {
    const warn = it.tone === "warn" || it.kind === "key_cap" || it.kind === "key_expiring";
    const li = el("li", null, warn ? "warn" : "bad");
    li.dataset.kind = it.kind;
    const a = el("a", it.text);
    a.href = it.href;
    li.append(a);
    return li;
  }));
  $("#attention").classList.toggle("calm", items.length === 0);
  $("#attention-ok").hidden = items.length > 0;
}

export async function refreshNow() {
  try { renderNow(await getJSON("/ui/api/now")); } catch (e) { renderAttention(); }
}

// -- profiles --------------------------------------------------------------------------------------------------

export async function refreshProfiles() {
  let answer;
  try { answer = await getJSON("/ui/api/profiles"); } catch (_) { return; }
  fill($("#profiles-table tbody"), answer.profiles.map((p) => {
    const name = el("span");
    name.append(el("strong", p.name));
    if (p.active) name.append(" ", badge("active", "ok"));
    const order = el("span");
    // The order in the daemon's words when nothing takes traffic now ("none available", "x ... starts on demand").
    if (!p.effective_order.length) order.append(el("span", p.order_words || "none available", p.order_words && p.order_words !== "none available" ? "warn" : "bad"));
    p.effective_order.forEach((n, i) => { if (i) order.append(" > "); order.append(el("span", n, "chip")); });
    const skips = el("div");
    for (const s of p.skips || []) skips.append(el("div", `${s.provider}: ${s.reason}${s.message ? " (" + s.message + ")" : ""}`, "warn"));
    for (const n of p.order_notes || []) {
      if (n.moved && n.moved !== "none") skips.append(el("div", `${n.provider}: ${n.why} (moved ${n.moved})`, "dim"));
    }
    if (!skips.childNodes.length) skips.append(el("span", "–", "dim"));
    const tr = row([name, p.mode, order, skips]);
    tr.dataset.profile = p.name;
    if (p.active) tr.classList.add("active");
    return tr;
  }));
}
