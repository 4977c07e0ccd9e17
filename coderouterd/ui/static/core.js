// What every view of the dashboard shares: its state, element helpers, formatting, the JSON reader, colours and
// charts. Every value from the daemon reaches the page as text (textContent), never as markup.

export const state = {
  charts: {}, sparks: new Map(), range: "24h", profiles: new Set(), providers: new Set(), dropped: 0,
  events: null, now: null, spend: null, reachable: true, unreachableSince: null, lastOk: null,
  keys: null, keyAttention: [], rangeChosen: false,
};
// Tests and curious users read the charts' own data from here (window.coderouterDashboard.charts.spendDaily.data).
window.coderouterDashboard = state;

export const $ = (sel) => document.querySelector(sel);

export function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

// A provider's colour comes from its name (FNV-1a, then murmur3's finaliser so similar names spread): the same on
// every reload and every machine. The hue is the hash's; one bit picks a darker or lighter shade, so two names
// of close hues still differ.
export function color(name) {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b) >>> 0; h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35) >>> 0; h ^= h >>> 16;
  h >>>= 0;
  const hue = h % 360, s = 0.7, l = (h >>> 9) & 1 ? 0.38 : 0.5;
  const f = (n) => {
    const k = (n + hue / 30) % 12;
    const c = l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k - 3, 9 - k, 1));
    return Math.round(c * 255).toString(16).padStart(2, "0");
  };
  return "#" + f(0) + f(8) + f(4);
}

export const fmt = {
  ms(v) {
    if (v === null || v === undefined) return "–";
    return v >= 10000 ? (v / 1000).toFixed(1) + " s" : v >= 1000 ? (v / 1000).toFixed(2) + " s" : Math.round(v) + " ms";
  },
  usd(v) {
    if (v === null || v === undefined) return "–";
    return v === 0 ? "$0" : v < 0.01 ? "$" + v.toFixed(4) : "$" + v.toFixed(2);
  },
  bytes(v) {
    if (!v) return "0 MB";
    return v >= 1 << 30 ? (v / (1 << 30)).toFixed(1) + " GB" : (v / (1 << 20)).toFixed(v >= 10 << 20 ? 0 : 1) + " MB";
  },
  pct(v) { return v === null || v === undefined ? "–" : (v * 100).toFixed(0) + "%"; },
  dur(s) {
    if (s === null || s === undefined) return "–";
    if (s < 120) return Math.round(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + String(Math.round(s % 60)).padStart(2, "0") + " s";
    if (s < 86400) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  },
  time(ts) {
    if (!ts) return "–";
    const d = new Date(ts * 1000);
    const t = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
    return d.toDateString() === new Date().toDateString() ? t : d.toLocaleDateString() + " " + t;
  },
  int(v) { return v === null || v === undefined ? "–" : Math.round(Number(v)).toLocaleString("en-US"); },
  num(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); },
};

export function badge(text, kind) { return el("span", text, "badge " + (kind || "")); }

// How long one read may take. A daemon that takes the connection and never answers would otherwise hold the
// poll that asked forever, and the page would keep showing the last answer as if it were current.
const READ_TIMEOUT_MS = 10000;

// Reads one answer; any failure to reach the daemon marks the page stale (the attention strip says so).
export async function getJSON(path) {
  let r;
  try {
    r = await fetch(path, { credentials: "same-origin", cache: "no-store",
                            signal: AbortSignal.timeout(READ_TIMEOUT_MS) });
  } catch (e) {
    unreachable(e);
    throw e;
  }
  if (r.status === 401) { window.location.assign("/ui"); throw new Error("login needed"); }
  if (!r.ok) {
    let msg = path + ": HTTP " + r.status;
    try { msg = (await r.json()).error || msg; } catch (_) { /* not JSON: keep the status */ }
    const e = new Error(msg);
    e.status = r.status;
    if (r.status >= 500) unreachable(e);
    throw e;
  }
  reached();
  return r.json();
}

const listeners = [];
export function onReachability(fn) { listeners.push(fn); }
function unreachable(e) {
  if (state.reachable) { state.reachable = false; state.unreachableSince = Date.now() / 1000; }
  state.unreachableWhy = e && e.message ? e.message : String(e);
  document.body.classList.add("stale");
  listeners.forEach((fn) => fn());
}
function reached() {
  state.lastOk = Date.now() / 1000;
  if (state.reachable) return;
  state.reachable = true;
  state.unreachableSince = null;
  document.body.classList.remove("stale");
  listeners.forEach((fn) => fn());
}

// Rows are filled with their column's name on each cell: a phone shows each row as a labelled card. A row that
// had the keyboard focus keeps it across the redraw, found again by what it shows (its id or its request's id),
// never by its position: a poll never throws the user back to the top of the page (issue 43, E2, E17).
const rowKey = (tr) => tr.id || (tr.dataset && tr.dataset.requestId) || "";
export function fill(tbody, rows) {
  const heads = Array.from(tbody.closest("table").querySelectorAll("thead th")).map((th) => th.textContent);
  for (const tr of rows) Array.from(tr.cells).forEach((td, i) => { if (heads[i]) td.dataset.label = heads[i]; });
  const a = document.activeElement;
  const key = a && a.parentElement === tbody ? rowKey(a) : "";
  tbody.replaceChildren(...rows);
  if (!key) return;
  const again = rows.find((tr) => rowKey(tr) === key);
  if (!again) return;
  if (!again.hasAttribute("tabindex")) again.tabIndex = -1;
  again.focus({ preventScroll: true });
}

export function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) { const td = document.createElement("td"); td.append(c); tr.append(td); continue; }
    const [text, cls] = Array.isArray(c) ? c : [c, ""];
    tr.append(el("td", text, cls));
  }
  return tr;
}

// A row (or list item) that opens a request's trace: a link target by click, and by keyboard (Tab, Enter).
export function opensTrace(node, id) {
  node.dataset.requestId = id;
  node.tabIndex = 0;
  node.classList.add("opens");
  const go = () => { window.location.hash = "#/requests/" + encodeURIComponent(id); };
  node.addEventListener("click", go);
  node.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); go(); } });
}

// -- charts --------------------------------------------------------------------------------------------------

function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
function chartWidth(box) { return Math.max(200, box.clientWidth - 4); }

// A y axis as wide as its longest label (the money axis was clipped at a fixed width).
function axisSize(u, values) {
  if (!values) return 40;
  const longest = Math.max(...values.map((v) => String(v).length));
  return 18 + longest * 7.5;
}

// One chart per box, rebuilt when its series change (new providers) or the colour scheme does, else new data.
export function draw(key, box, series, data, opts) {
  if (typeof uPlot === "undefined") return;
  const scheme = matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  const sig = series.map((s) => s.label).join("|") + "|" + scheme;
  const old = state.charts[key];
  if (old && old.sig === sig) { old.setData(data); return; }
  if (old) old.destroy();
  box.replaceChildren();
  const fg = cssVar("--dim"), grid = cssVar("--line");
  const o = Object.assign({
    width: chartWidth(box), height: 200,
    series: [{}].concat(series),
    legend: { live: true },
    cursor: { drag: { x: false, y: false } },
  }, opts || {});
  const y = Object.assign({ size: axisSize }, (opts && opts.yAxis) || {});
  o.axes = [{ stroke: fg, grid: { stroke: grid }, ticks: { stroke: grid } },
    Object.assign({ stroke: fg, grid: { stroke: grid }, ticks: { stroke: grid } }, y)];
  const u = new uPlot(o, data, box);
  u.sig = sig;
  state.charts[key] = u;
}

export function resizeCharts() {
  for (const u of Object.values(state.charts)) {
    const box = u.root.parentElement;
    if (box) u.setSize({ width: chartWidth(box), height: 200 });
  }
}

// A sparkline over the buckets that have data (a provider seen for 10 minutes is not drawn as 50 empty ones),
// its y range that data's own, so a steady provider's small changes show.
export function spark(name, xs, ys, label) {
  if (typeof uPlot === "undefined") return null;
  let first = ys.findIndex((v) => v !== null && v !== undefined);
  if (first < 0) return null;
  first = Math.min(first, Math.max(0, ys.length - 2));
  const data = [xs.slice(first), ys.slice(first)];
  const had = state.sparks.get(name);
  if (had) { had.u.setData(data); had.box.setAttribute("aria-label", label); return had.box; }
  const box = el("span", null, "spark");
  box.setAttribute("role", "img");
  box.setAttribute("aria-label", label);
  const u = new uPlot({
    width: 120, height: 28, legend: { show: false }, cursor: { show: false }, select: { show: false },
    axes: [{ show: false }, { show: false }],
    scales: {
      x: { time: false },
      y: {
        range: (u, min, max) => {
          const pad = Math.max((max - min) * 0.15, Math.abs(max) * 0.05, 1);
          return [Math.max(0, min - pad), max + pad];
        },
      },
    },
    series: [{}, { stroke: color(name), width: 1.5, spanGaps: true }],
  }, data, box);
  state.sparks.set(name, { u, box });
  return box;
}
