// Over time, from the journal: spend this month, latency, cache hit ratio, tokens, requests per minute and
// generation speed per provider, and the window's totals.
import { $, color, draw, el, fill, fmt, getJSON, opensTrace, row, state } from "./core.js";
import { refreshKeys } from "./keys.js";
import { setSparkData } from "./now.js";

const RANGE_LABEL = { "1h": "last hour", "6h": "last 6 hours", "24h": "last 24 hours", "7d": "last 7 days", "30d": "last 30 days" };

// -- spend -----------------------------------------------------------------------------------------------------

export function renderSpend(s) {
  state.spend = s;
  if (typeof uPlot === "undefined") return;
  $("#spend-month").textContent = s.month + " (UTC)";
  const names = Object.keys(s.providers);
  $("#spend-empty").hidden = names.length > 0;
  const xs = s.days;
  const daily = [], cumul = [], dailyData = [xs], cumulData = [xs];
  for (const n of names) {
    const p = s.providers[n];
    // Bars, see-through so a provider's bar never hides another's on the same day.
    daily.push({ label: n, stroke: color(n), fill: color(n) + "55", width: 1, points: { show: false },
      paths: uPlot.paths.bars({ size: [0.7, 28] }), value: (u, v) => fmt.usd(v) });
    dailyData.push(p.daily);
    let acc = 0;
    cumul.push({ label: n, stroke: color(n), width: 2, points: { show: true, size: 5 }, value: (u, v) => fmt.usd(v) });
    cumulData.push(p.daily.map((v) => (v === null ? null : (acc += v))));
    if (p.cap) {
      cumul.push({ label: n + " cap", stroke: color(n), width: 1, dash: [6, 4], points: { show: false }, value: (u, v) => fmt.usd(v) });
      cumulData.push(xs.map(() => p.cap));
    }
  }
  const money = { yAxis: { values: (u, vals) => vals.map((v) => fmt.usd(v)) } };
  // Half a day of room on each side: the first and last days' bars are drawn whole.
  const padded = { scales: { x: { time: true, range: (u, min, max) => [min - 43200, max + 43200] } } };
  draw("spendDaily", $("#chart-spend-daily"), daily, dailyData, Object.assign({}, money, padded));
  draw("spendMonth", $("#chart-spend-month"), cumul, cumulData, money);
  const rows = names.map((n) => {
    const p = s.providers[n];
    const used = p.ratio === null || p.ratio === undefined ? "–" : fmt.pct(p.ratio) + (p.blocked ? " · blocked" : "");
    const tr = row([el("strong", n), [fmt.usd(p.daily[s.today]), "num"], [fmt.usd(p.spent), "num"], [fmt.usd(p.reserved), "num"],
      [p.cap ? fmt.usd(p.cap) : "no cap", "num"], [used, p.blocked ? "num bad" : "num"]]);
    tr.dataset.provider = n;
    return tr;
  });
  const g = s.global;
  if (g && g.cap) {  // the cap over every paid provider together ([budget] global_monthly_usd)
    const today = names.reduce((a, n) => a + (s.providers[n].daily[s.today] || 0), 0);
    rows.push(row([el("strong", "all paid providers"), [fmt.usd(today), "num"], [fmt.usd(g.spent), "num"],
      [fmt.usd(g.reserved), "num"], [fmt.usd(g.cap), "num"], [fmt.pct(g.ratio), g.blocked ? "num bad" : "num"]]));
  }
  fill($("#spend-table tbody"), rows);
}

export async function refreshSpend() {
  try { renderSpend(await getJSON("/ui/api/spend")); } catch (_) { /* the attention strip says why */ }
}

// -- latency, cache, tokens ------------------------------------------------------------------------------------

// A bucket with no neighbour on either side is a point, or a line chart would not draw it at all (E9).
export function lonePoints(u, si) {
  const ys = u.data[si];
  const out = [];
  for (let i = 0; i < ys.length; i++) {
    if (ys[i] === null || ys[i] === undefined) continue;
    const before = i > 0 ? ys[i - 1] : null, after = i < ys.length - 1 ? ys[i + 1] : null;
    if ((before === null || before === undefined) && (after === null || after === undefined)) out.push(i);
  }
  return out.length ? out : null;
}
const POINTS = { size: 6, filter: lonePoints };

function lines(t, names, pick, label, dash, value) {
  return names.map((n) => ({ label: n + label, stroke: color(n), width: dash ? 1 : 2, dash, spanGaps: true, value,
    points: POINTS }));
}

function total(xs) { return xs.reduce((a, v) => a + (v || 0), 0); }

export function renderTrends(t) {
  const names = Object.keys(t.providers);
  const label = RANGE_LABEL[t.range] || t.range;
  document.querySelectorAll(".range-label").forEach((e) => { e.textContent = label; });
  const col = (k, f) => names.map((n) => (f ? t.providers[n][k].map(f) : t.providers[n][k]));
  const lat = (p50, p95) => {
    const series = [], data = [t.t];
    for (const n of names) {
      series.push({ label: n + " p50", stroke: color(n), width: 2, spanGaps: true, value: (u, v) => fmt.ms(v), points: POINTS });
      data.push(t.providers[n][p50]);
      series.push({ label: n + " p95", stroke: color(n), width: 1, dash: [5, 4], spanGaps: true, value: (u, v) => fmt.ms(v), points: POINTS });
      data.push(t.providers[n][p95]);
    }
    return [series, data];
  };
  draw("ttft", $("#chart-ttft"), ...lat("ttft_p50", "ttft_p95"));
  draw("total", $("#chart-total"), ...lat("total_p50", "total_p95"));
  const pctv = (u, v) => (v === null ? "–" : v.toFixed(0) + "%");
  draw("cache", $("#chart-cache"), lines(t, names, null, "", null, pctv), [t.t, ...col("cache_hit_ratio", (v) => (v === null ? null : v * 100))],
    { scales: { y: { range: [0, 100] } } });
  // Tokens: input solid, output dashed, cached (read from the prefix cache) dotted.
  const tokSeries = [], tokData = [t.t];
  const tokv = (u, v) => fmt.int(v);
  for (const n of names) {
    for (const [k, lbl, dash] of [["input_tokens", " in", null], ["output_tokens", " out", [5, 4]], ["cached_tokens", " cached", [1, 3]]]) {
      tokSeries.push({ label: n + lbl, stroke: color(n), width: dash ? 1.5 : 2, dash, spanGaps: true, value: tokv, points: POINTS });
      tokData.push(t.providers[n][k]);
    }
  }
  draw("tokens", $("#chart-tokens"), tokSeries, tokData, { yAxis: { values: (u, vals) => vals.map((v) => fmt.int(v)) } });
  const perMin = 60 / t.step_s;
  draw("rpm", $("#chart-rpm"), lines(t, names, null, "", null, (u, v) => fmt.num(v, 2)),
    [t.t, ...col("requests", (v) => (v === null ? null : v * perMin))]);
  draw("speed", $("#chart-speed"), lines(t, names, null, "", null, (u, v) => fmt.num(v, 1)), [t.t, ...col("tokens_per_s")]);
  // The window's totals: the sums of the buckets drawn above.
  const rows = names.map((n) => {
    const p = t.providers[n];
    const req = total(p.requests);
    const tr = row([el("strong", n), [fmt.int(req), "num"], [fmt.int(total(p.input_tokens)), "num"],
      [fmt.int(total(p.output_tokens)), "num"], [fmt.int(total(p.cached_tokens)), "num"]]);
    tr.dataset.provider = n;
    return tr;
  });
  const unserved = total(t.unserved || []);
  if (unserved) rows.push(row([el("span", "no provider served", "dim"), [fmt.int(unserved), "num"], "", "", ""]));
  fill($("#totals-table tbody"), rows);
  $("#busts-empty").hidden = t.busts.length > 0;
  fill($("#busts-table tbody"), t.busts.map((b) => {
    const tr = row([fmt.time(b.ts), b.provider, b.segment, [b.request_id, "dim"]]);
    opensTrace(tr, b.request_id);
    return tr;
  }));
}

// The window the page opens with: 24 hours, unless the journal's window holds nothing older than an hour (a
// young journal, or one idle until just now): then the last hour, where its requests are more than a sliver at
// the right edge (E9). The user's own choice is never overridden.
const YOUNG_S = 3600;

export async function refreshTrends() {
  try {
    const [t, s1] = await Promise.all([getJSON("/ui/api/trends?range=" + encodeURIComponent(state.range)),
      getJSON("/ui/api/trends?range=1h")]);
    setSparkData(s1);
    if (!state.rangeChosen && state.range !== "1h" && (t.first_ts === null || t.first_ts === undefined ||
        t.first_ts >= t.t[t.t.length - 1] + t.step_s - YOUNG_S)) {
      state.range = "1h";
      $("#range").value = "1h";
      renderTrends(s1);
      refreshKeys();  // the Keys view shares the window
      return;
    }
    renderTrends(t);
  } catch (_) { /* the attention strip says why */ }
}
