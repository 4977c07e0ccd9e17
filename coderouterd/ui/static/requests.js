// Requests: the live feed (requests and events), the journal's list (paged, filtered, searched by id), and one
// request's decision trace, as `corectl explain` shows it, at its own address (/ui#/requests/ID).
import { $, badge, el, fill, fmt, getJSON, opensTrace, row, state } from "./core.js";

const LIVE_MAX = 60;
const PAGE = 50;
export const FEED_KINDS = ["request_finished", "breaker_transition", "health_transition", "cache_bust", "process",
  "guard_fired", "drift_detected", "drift_action", "drift_recovered", "budget_warning", "budget_blocked"];

// -- the live feed ---------------------------------------------------------------------------------------------

function describe(e) {
  const d = e.detail || {};
  switch (e.kind) {
    case "guard_fired":
      return [`tool loop ${e.action === "break" ? "stopped" : e.action === "inject" ? "told the model" : "warned"}: ` +
        `${d.tool || "?"} repeated ${d.repeat_count || "?"} times`, e.action === "break" ? "bad" : "warn"];
    case "drift_detected": return [`drift detected on ${e.provider} (${e.model}, score ${fmt.num(e.score, 2)})`, "warn"];
    case "drift_action": return [`drift on ${e.provider}: ${e.action}${e.ok ? "" : " failed"}`, "warn"];
    case "drift_recovered": return [`drift over on ${e.provider} (${e.model})`, "ok"];
    case "cache_bust": return [`cache-bust on ${e.provider}: ${e.segment}`, "warn"];
    case "process": {
      const what = typeof e.detail === "string" && e.detail ? ` (${e.detail})` : "";
      // A provider without a process of ours (self-healing's exclusions) is named as the provider it is (E8).
      const who = e.managed === false ? `provider ${e.process || e.provider}` : `process ${e.process || e.provider}`;
      return [`${who}: ${e.event}${what}`, e.tone || ""];
    }
    case "breaker_transition":
      return [`breaker ${e.provider}: ${e.old} → ${e.new}${e.reason ? " (" + e.reason + ")" : ""}`, e.tone || ""];
    case "health_transition":
      return [`health ${e.provider}: ${e.old} → ${e.new}${e.reason ? " (" + e.reason + ")" : ""}`, e.tone || ""];
    case "budget_warning": return [`${e.provider} at ${fmt.pct(e.ratio)} of its cap`, "warn"];
    case "budget_blocked": return [`${e.provider} blocked: ${fmt.usd(e.spent_usd)} of ${fmt.usd(e.cap_usd)}`, "bad"];
    default: return [e.kind.replace(/_/g, " "), ""];
  }
}

export function addLive(item, atEnd) {
  const key = item.kind === "request_finished" ? "r:" + item.request_id : `${item.kind}:${item.ts}:${item.provider || item.process || item.request_id || ""}`;
  const ol = $("#live-feed");
  // The backfill and the live stream can overlap: an item already shown is not shown twice. The list holds at
  // most LIVE_MAX items, so this looks at no more than that, and nothing grows while the page stays open.
  for (const li of ol.children) if (li.dataset.key === key) return;
  let li;
  if (item.kind === "request_finished") {
    li = el("li");
    const ok = item.status && item.status < 400;
    li.append(el("span", fmt.time(item.ts), "dim"), badge(String(item.status || "–"), ok ? "ok" : "bad"),
      el("span", `${item.profile} → ${item.provider || "none"}`, "grow"),
      el("span", fmt.ms(item.latency_ms)), el("span", fmt.usd(item.cost_usd), "dim"));
    opensTrace(li, item.request_id);
  } else {
    li = el("li", null, "event");
    const [what, kind] = describe(item);
    li.dataset.kind = item.kind;
    li.append(el("span", fmt.time(item.ts), "dim"), el("span", what, "grow " + kind));
    if (item.request_id) opensTrace(li, item.request_id);
  }
  li.dataset.ts = String(item.ts);
  li.dataset.key = key;
  if (atEnd) ol.append(li); else ol.prepend(li);
  while (ol.children.length > LIVE_MAX) ol.lastElementChild.remove();
  $("#live-empty").hidden = true;
}

// On load the feed is not empty until the next request: the journal's last requests and the daemon's last
// events, newest first.
export function backfill(requests, events) {
  const items = [...requests.map((r) => Object.assign({ kind: "request_finished" }, r)), ...(events || [])];
  items.sort((a, b) => b.ts - a.ts);
  for (const it of items.slice(0, LIVE_MAX)) addLive(it, true);
}

export function connectLive(onItem) {
  const badgeEl = $("#live-state");
  if (state.events) state.events.close();
  const es = state.events = new EventSource("/ui/api/events");
  es.onopen = () => { badgeEl.textContent = "live"; badgeEl.className = "badge on"; };
  es.onerror = () => { badgeEl.textContent = "live: reconnecting"; badgeEl.className = "badge off"; };
  const handle = (ev) => {
    const item = JSON.parse(ev.data);
    addLive(item);
    onItem(item);
  };
  for (const k of FEED_KINDS) es.addEventListener(k, handle);
  es.addEventListener("dropped", (ev) => {
    state.dropped += Number(ev.data) || 0;
    const p = $("#live-dropped");
    p.hidden = false;
    p.textContent = `${state.dropped} live events skipped (this page fell behind); the tables below are complete.`;
  });
}

// -- the list --------------------------------------------------------------------------------------------------

function addOptions(select, names) {
  const have = new Set(Array.from(select.options).map((o) => o.value));
  for (const n of Array.from(names).sort()) if (!have.has(n)) select.append(new Option(n, n));
}

function requestRow(x) {
  if (x.profile) state.profiles.add(x.profile);
  if (x.provider) state.providers.add(x.provider);
  const ok = x.status && x.status < 400;
  const tr = row([fmt.time(x.ts), [x.request_id, "dim"], x.profile || "–", x.provider || "none",
    badge(String(x.status || "–") + (x.error_class ? " " + x.error_class : ""), ok ? "ok" : "bad"),
    [x.reason || "", "reason"],
    [fmt.ms(x.ttfb_ms), "num"], [fmt.ms(x.latency_ms), "num"],
    [fmt.int(x.input_tokens) + " / " + fmt.int(x.output_tokens), "num"], [fmt.usd(x.cost_usd), "num"]]);
  tr.dataset.ts = String(x.ts);
  opensTrace(tr, x.request_id);
  return tr;
}

let oldest = null;  // the oldest listed request's time: the next page starts before it
let paged = false;  // the user loaded older requests: the list is theirs, never cut back to one page

// The filters as the query: profile, provider, key, outcome, and the time filter (`since`, seconds back from now).
function query(form) {
  const q = new URLSearchParams();
  for (const k of ["profile", "provider", "outcome", "key"]) {
    const v = form.elements[k].value;
    if (v) q.set(k, v);
  }
  const back = Number(form.elements.since.value);
  if (back) q.set("since", String(Date.now() / 1000 - back));
  q.set("limit", String(PAGE));
  return q;
}

// The request row that has the keyboard focus, by its id (rows are matched by id, never by position).
function focusedId(tbody) {
  const a = document.activeElement;
  return a && tbody.contains(a) && a.dataset ? a.dataset.requestId || null : null;
}

// `mode`: "replace" (the first load, a filter changed: a new list), "more" (the next page, appended), or "merge"
// (a request finished, the tab came back): the newest are added on top and nothing the user sees moves away.
// Existing rows stay the same nodes, so a focused row keeps its focus and rows paged in stay (issue 43, E2).
export async function refreshRequests(mode) {
  const form = $("#filters");
  const more = mode === "more" || mode === true;
  const merge = mode === "merge";
  const q = query(form);
  if (more && oldest !== null) q.set("before", String(oldest));
  let r;
  try { r = await getJSON("/ui/api/requests?" + q.toString()); } catch (_) { return null; }
  const tbody = $("#requests-table tbody");
  const keep = focusedId(tbody);
  if (merge && tbody.rows.length) {
    const have = new Set(Array.from(tbody.rows, (tr) => tr.dataset.requestId));
    const newest = Number(tbody.rows[0].dataset.ts) || 0;
    const fresh = r.requests.filter((x) => !have.has(x.request_id) && (x.ts || 0) >= newest).map(requestRow);
    label(tbody, fresh);
    tbody.prepend(...fresh);
    // One page, as a fresh load would show, unless the user paged or is on a row: then nothing is taken away.
    if (!paged && keep === null) {
      while (tbody.rows.length > PAGE) tbody.lastElementChild.remove();
      if (tbody.rows.length) oldest = Number(tbody.rows[tbody.rows.length - 1].dataset.ts);
    }
  } else if (more) {
    const rows = r.requests.map(requestRow);
    label(tbody, rows);
    tbody.append(...rows);
    if (rows.length) paged = true;
    if (r.requests.length) oldest = r.requests[r.requests.length - 1].ts;
  } else {
    paged = false;
    fill(tbody, r.requests.map(requestRow));
    oldest = r.requests.length ? r.requests[r.requests.length - 1].ts : null;
  }
  if (keep !== null && focusedId(tbody) !== keep) {
    const again = Array.from(tbody.rows).find((tr) => tr.dataset.requestId === keep);
    if (again) again.focus({ preventScroll: true });
  }
  $("#requests-empty").hidden = tbody.rows.length > 0;
  if (!merge) $("#requests-more").hidden = r.requests.length < PAGE;
  $("#requests-count").textContent = `${tbody.rows.length} shown, newest first`;
  addOptions(form.elements.profile, state.profiles);
  addOptions(form.elements.provider, state.providers);
  addOptions(form.elements.key, new Set((state.keys ? state.keys.keys : []).map((k) => k.name)));
  return r;
}

// Each cell labelled with its column's name (a phone shows a row as a labelled card), as fill() does.
function label(tbody, rows) {
  const heads = Array.from(tbody.closest("table").querySelectorAll("thead th")).map((th) => th.textContent);
  for (const tr of rows) Array.from(tr.cells).forEach((td, i) => { if (heads[i]) td.dataset.label = heads[i]; });
}

// -- in flight -------------------------------------------------------------------------------------------------

let clockSkew = 0;  // the daemon's clock minus ours: elapsed times count on from its answer

// Each request being served now, with the provider it is on and how long it has run (issue 43, E15).
export function renderInFlight(a) {
  clockSkew = a.now - Date.now() / 1000;
  const ul = $("#inflight-list");
  ul.replaceChildren(...a.requests.map((x) => {
    const li = el("li");
    li.dataset.requestId = x.request_id;
    li.dataset.started = String(x.started);
    const where = x.provider ? `on ${x.provider}` + (x.attempts ? ` (after ${x.attempts} failed)` : "") : "choosing a provider";
    li.append(el("span", x.request_id, "dim"), el("span", `${x.profile || "–"} · ${x.model || "–"}`, "grow"),
      el("span", where, "provider"), el("span", fmt.dur(x.elapsed_s), "elapsed num"));
    return li;
  }));
  const more = a.total - a.requests.length;
  $("#inflight-more").hidden = more <= 0;
  $("#inflight-more").textContent = more > 0 ? `and ${more} more` : "";
}

export async function refreshInFlight() {
  try { renderInFlight(await getJSON("/ui/api/inflight")); } catch (_) { /* the attention strip says why */ }
}

setInterval(() => {
  const now = Date.now() / 1000 + clockSkew;
  document.querySelectorAll("#inflight-list li").forEach((li) => {
    li.querySelector(".elapsed").textContent = fmt.dur(Math.max(0, now - Number(li.dataset.started)));
  });
}, 1000);

// -- one request's trace ---------------------------------------------------------------------------------------

export async function openTrace(id) {
  let answer;
  const dlg = $("#trace");
  try { answer = await getJSON("/ui/api/requests/" + encodeURIComponent(id)); } catch (e) {
    $("#search-message").textContent = e.status === 404 ? `No request ${id} in coderouterd's memory or the journal.` : String(e.message);
    return;
  }
  $("#search-message").textContent = "";
  const t = answer.trace;
  $("#trace-id").textContent = t.request_id;
  $("#trace-source").textContent = answer.source === "memory" ? "from coderouterd's memory"
    : "from the journal: planning notes are not recorded there";
  const kv = [];
  const add = (k, v, cls) => { const tr = document.createElement("tr"); tr.append(el("th", k), el("td", v, cls)); kv.push(tr); };
  add("time", fmt.time(t.ts));
  add("ingress", (t.ingress || "–") + (t.stream ? " (streaming)" : ""));
  add("key", t.key || "– (no team key)", t.key ? "" : "dim");
  let model = t.model_requested || "–";
  if (t.served_by && t.model_used && t.model_used !== t.model_requested) model += " → " + t.model_used;
  add("model", model);
  add("profile", (t.profile || "–") + (t.mode ? ` (${t.mode})` : ""));
  if (t.candidates) add("chain", t.candidates.join(" > ") || "–");
  if (t.effective_order) add("order", t.effective_order.join(" > ") || "none available", t.effective_order.length ? "" : "bad");
  // The plan listed more than ran: who was skipped at its turn is in the Skipped table, with why (E11).
  if (t.planned_order) add("planned", t.planned_order.join(" > "), "dim");
  for (const n of t.order_notes || []) {
    add("note", `${n.provider || "?"}: ${n.why || ""}` + (n.moved && n.moved !== "none" ? ` (moved ${n.moved})` : ""));
  }
  const status = t.status || 0;
  add("result", `${status} ` + (t.served_by ? `served by ${t.served_by}` : "no provider served it") +
    ` in ${fmt.ms(t.latency_ms)} (first byte ${fmt.ms(t.ttfb_ms)})` + (t.error_class ? `  error: ${t.error_class}` : ""),
  status >= 400 || !status ? "bad" : "ok");
  for (const g of t.guards || []) {
    const what = { break: "stopped the request", warn: "warned", inject: "told the model", default: "set" }[g.action] || g.action;
    add("guard", `${String(g.guard).replace(/_/g, " ")} ${what}` + (g.message ? `: ${g.message}` : ""), g.action === "break" ? "bad" : "warn");
  }
  if (t.race_outcome) add("race", t.race_outcome);
  const u = t.usage || {};
  add("tokens", `in ${fmt.int(u.input_tokens || 0)}, out ${fmt.int(u.output_tokens || 0)}, cache read ` +
    `${fmt.int(u.cache_read_input_tokens || 0)}, cache write ${fmt.int(u.cache_creation_input_tokens || 0)}; cost ${fmt.usd(t.cost_usd)}`);
  const aff = t.affinity;
  if (aff) {
    // Only what is known: a request without a lane is not "lane null" (E11).
    const parts = [];
    if (aff.lane !== null && aff.lane !== undefined && aff.lane !== "") parts.push(`lane ${aff.lane}`);
    if (aff.session) parts.push(`session ${aff.session}`);
    if (aff.slot !== null && aff.slot !== undefined) parts.push(`slot ${aff.slot}`);
    add("affinity", parts.join(", ") || "no lane, no session", parts.length ? "" : "dim");
    if (aff.cache_bust) add("cache bust", aff.cache_bust.segment, "bad");
  }
  // What else happened to it: the daemon's recent events that name this request, and a breaker its failure
  // opened (a provider it tried, opened while it ran).
  const tried = new Set((t.attempts || []).filter((a) => a.outcome !== "ok").map((a) => a.provider));
  const end = (t.ts || 0) + (t.latency_ms || 0) / 1000 + 1;
  for (const e of (state.now && state.now.events) || []) {
    const opened = e.kind === "breaker_transition" && e.new === "open" && tried.has(e.provider) && e.ts >= t.ts && e.ts <= end;
    if ((e.request_id === t.request_id && e.kind !== "guard_fired") || opened) add("event", describe(e)[0], "warn");
  }
  fill($("#trace-kv tbody"), kv);
  const skips = t.skips || [];
  $("#trace-skips-title").hidden = $("#trace-skips").hidden = skips.length === 0;
  fill($("#trace-skips tbody"), skips.map((s) => row([s.provider, [s.reason || "", "warn"], s.message || ""])));
  fill($("#trace-attempts tbody"), (t.attempts || []).map((a, i) => {
    const ok = a.outcome === "ok";
    return row([String(i + 1), [a.provider || "?", ok && a.provider === t.served_by ? "ok" : ""],
      [(a.outcome || "?") + (a.panic ? " (panic)" : ""), ok ? "ok" : "bad"], ok ? "" : a.reason || "",
      [a.status ? String(a.status) : "–", "num"], [fmt.ms(a.ms), "num"], a.message || ""]);
  }));
  $("#trace-attempts-empty").hidden = (t.attempts || []).length > 0;
  if (!dlg.open) dlg.showModal();
}

// The address is the state: /ui#/requests/ID opens that request's trace (a link `corectl explain` prints).
export function route() {
  const m = /^#\/requests\/(.+)$/.exec(window.location.hash);
  if (m) openTrace(decodeURIComponent(m[1]));
  else if ($("#trace").open) $("#trace").close();
}

export function closeTrace() {
  const dlg = $("#trace");
  if (dlg.open) dlg.close();
  if (/^#\/requests\//.test(window.location.hash)) history.replaceState(null, "", "#requests");
}
