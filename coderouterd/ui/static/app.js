// The dashboard's page: reads /ui/api/* (the admin API's view-models as JSON) and the live feed, draws with uPlot.
// Read-only. Every value from the daemon reaches the page as text (textContent), never as markup.
"use strict";

(function () {
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
  const LIVE_MAX = 60;
  const NOW_EVERY_MS = 2000;
  const HISTORY_EVERY_MS = 15000;

  const state = {
    colors: new Map(), charts: {}, sparks: new Map(), range: "24h", liveCount: 0,
    profiles: new Set(), providers: new Set(), refreshTimer: null, dropped: 0, events: null,
  };
  // Tests and curious users read the charts' own data from here (window.coderouterDashboard.charts.spendDaily.data).
  window.coderouterDashboard = state;

  const $ = (sel) => document.querySelector(sel);

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function color(name) {
    if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
    return state.colors.get(name);
  }

  // -- formatting ----------------------------------------------------------------------------------------------

  const fmt = {
    ms(v) {
      if (v === null || v === undefined) return "–";
      return v >= 10000 ? (v / 1000).toFixed(1) + " s" : v >= 1000 ? (v / 1000).toFixed(2) + " s" : Math.round(v) + " ms";
    },
    usd(v) {
      if (v === null || v === undefined) return "–";
      return v === 0 ? "$0" : v < 0.01 ? "$" + v.toFixed(4) : "$" + v.toFixed(2);
    },
    pct(v) { return v === null || v === undefined ? "–" : (v * 100).toFixed(0) + "%"; },
    dur(s) {
      if (s === null || s === undefined) return "–";
      if (s < 60) return Math.round(s) + " s";
      if (s < 3600) return Math.round(s / 60) + " min";
      if (s < 86400) return (s / 3600).toFixed(1) + " h";
      return (s / 86400).toFixed(1) + " d";
    },
    time(ts) {
      if (!ts) return "–";
      const d = new Date(ts * 1000);
      const today = new Date();
      const t = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
      return d.toDateString() === today.toDateString() ? t : d.toLocaleDateString() + " " + t;
    },
    int(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString(); },
  };

  function badge(text, kind) { return el("span", text, "badge " + (kind || "")); }

  function healthKind(h) {
    const v = String(h || "unknown").toLowerCase();
    return v === "healthy" ? "ok" : v === "unknown" ? "" : v === "degraded" ? "warn" : "bad";
  }
  function breakerKind(b) { return b === "closed" ? "ok" : b === "half_open" ? "warn" : "bad"; }

  async function getJSON(path) {
    const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
    if (r.status === 401) { window.location.assign("/ui"); throw new Error("login needed"); }
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) {
      if (c instanceof Node) { const td = document.createElement("td"); td.append(c); tr.append(td); continue; }
      const [text, cls] = Array.isArray(c) ? c : [c, ""];
      tr.append(el("td", text, cls));
    }
    return tr;
  }

  // -- charts --------------------------------------------------------------------------------------------------

  function chartWidth(box) { return Math.max(200, box.clientWidth - 4); }

  // One chart per box, rebuilt when its series change (new providers), else given new data.
  function draw(key, box, series, data, opts) {
    if (typeof uPlot === "undefined") return;
    const sig = series.map((s) => s.label).join("|");
    const old = state.charts[key];
    if (old && old.sig === sig) { old.setData(data); return; }
    if (old) old.destroy();
    box.replaceChildren();
    const o = Object.assign({
      width: chartWidth(box), height: 200,
      series: [{}].concat(series),
      axes: [{}, { size: 56 }],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
    }, opts || {});
    const u = new uPlot(o, data, box);
    u.sig = sig;
    state.charts[key] = u;
  }

  function resizeCharts() {
    for (const u of Object.values(state.charts)) {
      const box = u.root.parentElement;
      if (box) u.setSize({ width: chartWidth(box), height: 200 });
    }
  }

  function spark(name, xs, ys) {
    if (typeof uPlot === "undefined") return null;
    let u = state.sparks.get(name);
    const data = [xs, ys];
    if (u) { u.setData(data); return u.root; }
    const box = el("span", null, "spark");
    u = new uPlot({
      width: 120, height: 28, legend: { show: false }, cursor: { show: false }, select: { show: false },
      axes: [{ show: false }, { show: false }],
      scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(max || 1, 1)] } },
      series: [{}, { stroke: color(name), width: 1.5, spanGaps: true }],
    }, data, box);
    state.sparks.set(name, u);
    return u.root;
  }

  // -- Now -----------------------------------------------------------------------------------------------------

  let sparkData = null;

  function renderNow(now) {
    const d = now.daemon;
    $("#daemon-line").textContent = `v${d.version} · up ${fmt.dur(d.uptime_s)} · profile ${d.active_profile} · ${d.listen.url}`;
    const inFlight = Object.values(now.in_flight || {}).reduce((a, b) => a + b, 0);
    $("#in-flight").textContent = inFlight ? `(${inFlight} in flight)` : "";
    const rows = now.providers.map((p) => {
      state.providers.add(p.name);
      color(p.name);
      const name = el("span");
      name.append(el("strong", p.name), el("span", " " + p.kind + (p.model ? " · " + p.model : ""), "dim"));
      const health = badge(String(p.health || "unknown").toLowerCase(), healthKind(p.health));
      const br = (p.breaker && p.breaker.state) || "closed";
      const breaker = badge(br.replace("_", "-"), breakerKind(br));
      const s = sparkData && sparkData.providers[p.name];
      const sp = s ? spark(p.name, sparkData.t, s.total_p50) : null;
      const sparkCell = sp || el("span", "no requests", "dim");
      const p50 = p.figures && p.figures.median_s !== null && p.figures.median_s !== undefined ? p.figures.median_s * 1000 : null;
      const hit = p.cache ? p.cache.hit_ratio : null;
      const b = p.budget;
      const money = b ? fmt.usd(b.spent) + (b.cap ? " / " + fmt.usd(b.cap) : "") : "–";
      const tr = row([name, health, breaker, sparkCell, [fmt.ms(p50), "num"], [fmt.pct(hit), "num"], [money, "num"]]);
      tr.dataset.provider = p.name;
      return tr;
    });
    fill($("#providers-table tbody"), rows);
    const procs = Object.entries(now.processes || {});
    $("#processes-empty").hidden = procs.length > 0;
    $("#processes-table").hidden = procs.length === 0;
    fill($("#processes-table tbody"), procs.map(([name, p]) => row([
      el("strong", name), badge(p.state, p.state === "ready" ? "ok" : p.state === "fatal" ? "bad" : "warn"),
      [fmt.dur(p.uptime_s), "num"], [String(p.restarts_total ?? 0), "num"],
      [p.memory_mb ? `${Math.round(p.memory_mb).toLocaleString()} MB${p.pinned ? " pinned" : ""}` : "–", "num"],
      p.last_stop_reason || "–",
    ])));
    // Resident local models against [models] memory_budget_mb (README: Several local models).
    const m = now.models;
    const budget = $("#models-budget");
    budget.hidden = !m;
    if (m) {
      const held = `${Math.round(m.memory_held_mb).toLocaleString()} MB held`;
      const of = m.memory_budget_mb ? ` of ${Math.round(m.memory_budget_mb).toLocaleString()} MB budget` : " (no budget)";
      budget.textContent = `Local models: ${held}${of}; resident: ${(m.resident || []).join(", ") || "none"}`;
    }
  }

  async function refreshNow() {
    try { renderNow(await getJSON("/ui/api/now")); } catch (e) { noteError(e); }
  }

  // -- live feed -----------------------------------------------------------------------------------------------

  function addLive(item) {
    const ol = $("#live-feed");
    let li;
    if (item.kind === "request_finished") {
      li = el("li");
      const ok = item.status && item.status < 400;
      li.append(el("span", fmt.time(item.ts), "dim"), badge(String(item.status || "–"), ok ? "ok" : "bad"),
        el("span", `${item.profile} → ${item.provider || "none"}`, "grow"),
        el("span", fmt.ms(item.latency_ms)), el("span", fmt.usd(item.cost_usd), "dim"));
      li.dataset.requestId = item.request_id;
      li.title = item.request_id;
      li.addEventListener("click", () => openTrace(item.request_id));
    } else {
      li = el("li", null, "event");
      const what = item.kind === "cache_bust" ? `cache-bust on ${item.provider}: ${item.segment}`
        : item.kind === "process" ? `process ${item.process}: ${item.event}`
          : `${item.kind.replace("_", " ")} ${item.provider}: ${item.old} → ${item.new}`;
      li.append(el("span", fmt.time(item.ts), "dim"), el("span", what, "grow"));
    }
    ol.prepend(li);
    while (ol.children.length > LIVE_MAX) ol.lastElementChild.remove();
    $("#live-empty").hidden = true;
  }

  function connectLive() {
    const badgeEl = $("#live-state");
    if (state.events) state.events.close();
    const es = state.events = new EventSource("/ui/api/events");
    es.onopen = () => { badgeEl.textContent = "live"; badgeEl.className = "badge on"; };
    es.onerror = () => { badgeEl.textContent = "live: reconnecting"; badgeEl.className = "badge off"; };
    const handle = (ev) => {
      const item = JSON.parse(ev.data);
      addLive(item);
      if (item.kind === "request_finished") scheduleRefresh();
    };
    for (const k of ["request_finished", "breaker_transition", "health_transition", "cache_bust", "process"]) {
      es.addEventListener(k, handle);
    }
    es.addEventListener("dropped", (ev) => {
      state.dropped += Number(ev.data) || 0;
      const p = $("#live-dropped");
      p.hidden = false;
      p.textContent = `${state.dropped} live events skipped (this page fell behind); the tables below are complete.`;
    });
  }

  // A burst of finished requests costs one refresh of the journal's views, not one each.
  function scheduleRefresh() {
    if (state.refreshTimer) return;
    state.refreshTimer = setTimeout(() => {
      state.refreshTimer = null;
      refreshSpend(); refreshRequests(); refreshNow();
    }, 250);
  }

  // -- Spend ---------------------------------------------------------------------------------------------------

  function renderSpend(s) {
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
    const money = { axes: [{}, { size: 60, values: (u, vals) => vals.map((v) => fmt.usd(v)) }] };
    // Half a day of room on each side: the first and last days' bars are drawn whole.
    const padded = { scales: { x: { time: true, range: (u, min, max) => [min - 43200, max + 43200] } } };
    draw("spendDaily", $("#chart-spend-daily"), daily, dailyData, Object.assign({}, money, padded));
    draw("spendMonth", $("#chart-spend-month"), cumul, cumulData, money);
    const rows = names.map((n) => {
      const p = s.providers[n];
      const today = p.daily[s.today];
      const used = p.ratio === null || p.ratio === undefined ? "–" : fmt.pct(p.ratio);
      const tr = row([el("strong", n), [fmt.usd(today), "num"], [fmt.usd(p.spent), "num"], [fmt.usd(p.reserved), "num"],
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

  async function refreshSpend() {
    try { renderSpend(await getJSON("/ui/api/spend")); } catch (e) { noteError(e); }
  }

  // -- Latency and cache ---------------------------------------------------------------------------------------

  function renderTrends(t) {
    const names = Object.keys(t.providers);
    const lat = (p50, p95) => {
      const series = [], data = [t.t];
      for (const n of names) {
        series.push({ label: n + " p50", stroke: color(n), width: 2, spanGaps: true, value: (u, v) => fmt.ms(v) });
        data.push(t.providers[n][p50]);
        series.push({ label: n + " p95", stroke: color(n), width: 1, dash: [5, 4], spanGaps: true, value: (u, v) => fmt.ms(v) });
        data.push(t.providers[n][p95]);
      }
      return [series, data];
    };
    const [ts, td] = lat("ttft_p50", "ttft_p95");
    draw("ttft", $("#chart-ttft"), ts, td);
    const [tots, totd] = lat("total_p50", "total_p95");
    draw("total", $("#chart-total"), tots, totd);
    const cs = [], cd = [t.t];
    for (const n of names) {
      cs.push({ label: n, stroke: color(n), width: 2, spanGaps: true, value: (u, v) => (v === null ? "–" : v.toFixed(0) + "%") });
      cd.push(t.providers[n].cache_hit_ratio.map((v) => (v === null ? null : v * 100)));
    }
    draw("cache", $("#chart-cache"), cs, cd, { scales: { y: { range: [0, 100] } } });
    $("#busts-empty").hidden = t.busts.length > 0;
    fill($("#busts-table tbody"), t.busts.map((b) => {
      const link = el("a", b.request_id);
      link.href = "#requests";
      link.addEventListener("click", (ev) => { ev.preventDefault(); openTrace(b.request_id); });
      return row([fmt.time(b.ts), b.provider, b.segment, link]);
    }));
  }

  async function refreshTrends() {
    try {
      const [t, s1] = await Promise.all([getJSON("/ui/api/trends?range=" + encodeURIComponent(state.range)),
        getJSON("/ui/api/trends?range=1h")]);
      sparkData = s1;
      renderTrends(t);
    } catch (e) { noteError(e); }
  }

  // -- Requests ------------------------------------------------------------------------------------------------

  function addOptions(select, names) {
    const have = new Set(Array.from(select.options).map((o) => o.value));
    for (const n of Array.from(names).sort()) {
      if (!have.has(n)) select.append(new Option(n, n));
    }
  }

  async function refreshRequests() {
    const form = $("#filters");
    const q = new URLSearchParams();
    for (const k of ["profile", "provider", "outcome"]) {
      const v = form.elements[k].value;
      if (v) q.set(k, v);
    }
    q.set("limit", "50");
    try {
      const r = await getJSON("/ui/api/requests?" + q.toString());
      $("#requests-empty").hidden = r.requests.length > 0;
      fill($("#requests-table tbody"), r.requests.map((x) => {
        if (x.profile) state.profiles.add(x.profile);
        if (x.provider) state.providers.add(x.provider);
        const ok = x.status && x.status < 400;
        const tr = row([fmt.time(x.ts), [x.request_id, "dim"], x.profile || "–", x.provider || "none",
          badge(String(x.status || "–"), ok ? "ok" : "bad"), [fmt.ms(x.ttfb_ms), "num"], [fmt.ms(x.latency_ms), "num"],
          [fmt.int(x.input_tokens) + " / " + fmt.int(x.output_tokens), "num"], [fmt.usd(x.cost_usd), "num"]]);
        tr.dataset.requestId = x.request_id;
        tr.addEventListener("click", () => openTrace(x.request_id));
        return tr;
      }));
      addOptions(form.elements.profile, state.profiles);
      addOptions(form.elements.provider, state.providers);
    } catch (e) { noteError(e); }
  }

  // -- one request's trace (what `corectl explain` shows) -------------------------------------------------------

  async function openTrace(id) {
    let answer;
    try { answer = await getJSON("/ui/api/requests/" + encodeURIComponent(id)); } catch (e) { noteError(e); return; }
    const t = answer.trace;
    $("#trace-id").textContent = t.request_id;
    $("#trace-source").textContent = answer.source === "memory" ? "from coderouterd's memory"
      : "from the journal: planning notes are not recorded there";
    const kv = [];
    const add = (k, v, cls) => { const tr = document.createElement("tr"); tr.append(el("th", k), el("td", v, cls)); kv.push(tr); };
    add("time", fmt.time(t.ts));
    add("ingress", (t.ingress || "–") + (t.stream ? " (streaming)" : ""));
    let model = t.model_requested || "–";
    if (t.model_used && t.model_used !== t.model_requested) model += " → " + t.model_used;
    add("model", model);
    add("profile", (t.profile || "–") + (t.mode ? ` (${t.mode})` : ""));
    if (t.candidates) add("chain", t.candidates.join(" > ") || "–");
    if (t.effective_order) add("order", t.effective_order.join(" > ") || "none available", t.effective_order.length ? "" : "bad");
    for (const n of t.order_notes || []) {
      add("note", `${n.provider || "?"}: ${n.why || ""}` + (n.moved && n.moved !== "none" ? ` (moved ${n.moved})` : ""));
    }
    const status = t.status || 0;
    add("result", `${status} ` + (t.served_by ? `served by ${t.served_by}` : "no provider served it") +
      ` in ${fmt.ms(t.latency_ms)} (first byte ${fmt.ms(t.ttfb_ms)})` + (t.error_class ? `  error: ${t.error_class}` : ""),
    status >= 400 || !status ? "bad" : "ok");
    if (t.race_outcome) add("race", t.race_outcome);
    const u = t.usage || {};
    add("tokens", `in ${fmt.int(u.input_tokens || 0)}, out ${fmt.int(u.output_tokens || 0)}, cache read ` +
      `${fmt.int(u.cache_read_input_tokens || 0)}, cache write ${fmt.int(u.cache_creation_input_tokens || 0)}; cost ${fmt.usd(t.cost_usd)}`);
    const aff = t.affinity;
    if (aff) {
      add("affinity", `lane ${aff.lane}, session ${aff.session}` + (aff.slot !== null && aff.slot !== undefined ? `, slot ${aff.slot}` : ""));
      if (aff.cache_bust) add("cache bust", aff.cache_bust.segment, "bad");
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
    const dlg = $("#trace");
    if (!dlg.open) dlg.showModal();
  }

  // -- errors --------------------------------------------------------------------------------------------------

  function noteError(e) {
    // Shown in the header, not thrown: a daemon restarting is a normal moment for a dashboard.
    $("#daemon-line").textContent = "cannot reach coderouterd (" + (e && e.message ? e.message : e) + ")";
  }

  // -- start ---------------------------------------------------------------------------------------------------

  function every(ms, fn) {
    // Nothing is asked while the tab is hidden: an open but unseen dashboard costs the daemon nothing.
    setInterval(() => { if (document.visibilityState === "visible") fn(); }, ms);
  }

  function start() {
    $("#trace-close").addEventListener("click", () => $("#trace").close());
    $("#range").addEventListener("change", (ev) => { state.range = ev.target.value; refreshTrends(); });
    $("#filters").addEventListener("change", refreshRequests);
    $("#filters").addEventListener("submit", (ev) => ev.preventDefault());
    let resizeTimer = null;
    window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(resizeCharts, 100); });
    refreshTrends().then(refreshNow);
    refreshSpend();
    refreshRequests();
    connectLive();
    every(NOW_EVERY_MS, refreshNow);
    every(HISTORY_EVERY_MS, () => { refreshTrends(); refreshSpend(); });
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") {
        connectLive(); refreshNow(); refreshTrends(); refreshSpend(); refreshRequests();
      } else if (state.events) {
        // A hidden tab leaves the live feed: the daemon does nothing for a page nobody looks at.
        state.events.close();
        state.events = null;
        const badgeEl = $("#live-state");
        badgeEl.textContent = "live: paused";
        badgeEl.className = "badge off";
      }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
