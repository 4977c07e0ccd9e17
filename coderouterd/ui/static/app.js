// The dashboard's page: reads /ui/api/* (the admin API's view-models as JSON) and the live feed, draws with uPlot.
// Read-only. One module per view: now.js (attention, providers, processes, profiles), trends.js (spend,
// latency, cache, tokens), keys.js (team keys), requests.js (live feed, list, trace); core.js holds what they share.
import { $, onReachability, resizeCharts, state } from "./core.js";
import { refreshNow, refreshProfiles, renderAttention } from "./now.js";
import { refreshKeys } from "./keys.js";
import { backfill, closeTrace, connectLive, refreshInFlight, refreshRequests, route } from "./requests.js";
import { refreshSpend, refreshTrends } from "./trends.js";

const NOW_EVERY_MS = 2000;
const PROFILES_EVERY_MS = 5000;
const HISTORY_EVERY_MS = 15000;

let refreshTimer = null;
// A burst of finished requests costs one refresh of the journal's views, not one each.
function scheduleRefresh() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => {
    refreshTimer = null;
    refreshSpend(); refreshRequests("merge"); refreshNow(); refreshKeys(); refreshInFlight();
  }, 250);
}

function onItem(item) {
  if (item.kind === "request_finished") scheduleRefresh();
  else { refreshNow(); refreshProfiles(); }  // a breaker, a process, a guard: the state it changed, at once
}

// An in-page link (the skip link, the attention strip's, the section links) moves the keyboard focus where it
// points, not only the view: the next Tab goes on from there (issue 43, E17). The skip link lands on the first
// request row. Trace links (#/requests/ID) are the router's.
function moveFocus(ev) {
  const a = ev.target.closest && ev.target.closest("a[href^='#']");
  if (!a || a.getAttribute("href").startsWith("#/") || ev.defaultPrevented) return;
  const id = decodeURIComponent(a.getAttribute("href").slice(1));
  if (!document.getElementById(id)) return;
  // After the browser's own jump to the anchor, so the focus does not scroll the page a second time; the target
  // is looked up again then (a poll may have drawn its table anew meanwhile).
  setTimeout(() => {
    let target = document.getElementById(id);
    if (!target) return;
    if (target.id === "requests-table") target = target.querySelector("tbody tr") || target;
    if (!target.matches("a[href], button, input, select, textarea, [tabindex]")) target.tabIndex = -1;
    target.focus({ preventScroll: true });
  }, 0);
}

function every(ms, fn) {
  // Nothing is asked while the tab is hidden: an open but unseen dashboard costs the daemon nothing.
  setInterval(() => { if (document.visibilityState === "visible") fn(); }, ms);
}

async function start() {
  $("#trace-close").addEventListener("click", closeTrace);
  $("#trace").addEventListener("close", closeTrace);
  $("#range").addEventListener("change", (ev) => {
    state.range = ev.target.value; state.rangeChosen = true; refreshTrends(); refreshKeys();
  });
  $("#filters").addEventListener("change", (ev) => { if (ev.target.name !== "id") refreshRequests("replace"); });
  $("#filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = $("#filters").elements.id.value.trim();
    if (id) window.location.hash = "#/requests/" + encodeURIComponent(id);
  });
  $("#requests-more").addEventListener("click", () => refreshRequests("more"));
  document.addEventListener("click", moveFocus);
  window.addEventListener("hashchange", route);
  onReachability(renderAttention);
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(resizeCharts, 100); });
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => { refreshTrends(); refreshSpend(); });
  refreshSpend();
  refreshProfiles();
  refreshKeys();
  connectLive(onItem);
  const [, , listed] = await Promise.all([refreshTrends(), refreshNow(), refreshRequests("replace"), refreshInFlight()]);
  backfill(listed ? listed.requests.slice(0, 30) : [], state.now ? state.now.events : []);
  route();
  every(NOW_EVERY_MS, refreshNow);
  every(NOW_EVERY_MS, refreshInFlight);
  every(PROFILES_EVERY_MS, refreshProfiles);
  every(HISTORY_EVERY_MS, () => { refreshTrends(); refreshSpend(); refreshKeys(); });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") {
      connectLive(onItem); refreshNow(); refreshProfiles(); refreshTrends(); refreshSpend(); refreshRequests("merge");
      refreshInFlight();
      refreshKeys();
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

start();
