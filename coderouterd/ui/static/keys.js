// "Keys": each team key's spend against its cap, requests and refusals over time, its rate now against its limits,
// last use and expiry (GET /ui/api/keys, admin/key_usage.py). Read-only: keys are managed with `corectl keys`.
// What needs attention (near the cap, blocked, expiring) goes to the strip at the top (now.js renders it).
import { $, badge, color, draw, el, fill, fmt, getJSON, row, state } from "./core.js";
import { renderAttention } from "./now.js";

function limitText(now, limit) {
  return limit ? `${fmt.int(now)} / ${fmt.int(limit)}` : `${fmt.int(now)}`;
}

function spendCell(k) {
  const box = el("span");
  box.append(fmt.usd(k.spend_usd));
  if (k.cap_usd) {
    box.append(" of " + fmt.usd(k.cap_usd) + " ");
    const bar = el("meter");
    bar.min = 0; bar.max = 1; bar.low = 0.8; bar.high = 0.99; bar.optimum = 0;
    bar.value = Math.min(1, k.ratio || 0);
    bar.title = fmt.pct(k.ratio);
    bar.setAttribute("aria-label", `${k.name}: share of its monthly cap spent`);
    box.append(bar, " " + fmt.pct(k.ratio));
  } else box.append(el("span", " (no cap)", "dim"));
  return box;
}

function expiryCell(k) {
  if (k.revoked_at) return el("span", "revoked " + fmt.time(k.revoked_at), "dim");
  if (!k.expires_at) return el("span", "never", "dim");
  const left = k.expires_at - Date.now() / 1000;
  const text = fmt.time(k.expires_at) + (left > 0 ? ` (in ${fmt.dur(left)})` : " (expired)");
  return el("span", text, left <= 0 ? "bad" : left <= 7 * 86400 ? "warn" : "");
}

export function renderKeys(a) {
  state.keys = a;
  const keys = a.keys;
  $("#keys-empty").hidden = keys.length > 0;
  $("#keys-registry").hidden = a.registry;
  fill($("#keys-table tbody"), keys.map((k) => {
    const name = el("span");
    name.append(el("strong", k.name));
    if (k.state !== "active") name.append(" ", badge(k.state, k.state === "unknown" ? "" : "warn"));
    if (k.blocked) name.append(" ", badge("blocked", "bad"));
    const refusals = Object.entries(k.refusals).map(([r, n]) => `${r} ${n}`).join(", ");
    const rate = el("span");
    rate.append(limitText(k.rate.rpm, k.rate.rpm_limit) + " rpm");
    rate.append(el("br"), limitText(k.rate.tpm, k.rate.tpm_limit) + " tpm");
    if (k.rate.concurrency_limit) rate.append(el("br"), el("span", `${k.rate.concurrency_limit} at once`, "dim"));
    const tr = row([name, spendCell(k), [fmt.int(k.requests), "num"],
      [refusals || "–", refusals ? "bad" : "dim"], rate,
      k.last_used ? fmt.time(k.last_used) : el("span", "never", "dim"), expiryCell(k)]);
    tr.dataset.key = k.name;
    // A key's row opens its requests: the Requests list, filtered by it.
    tr.tabIndex = 0;
    tr.classList.add("opens");
    const open = () => {
      const sel = $("#filters").elements.key;
      if (![...sel.options].some((o) => o.value === k.name)) sel.append(new Option(k.name, k.name));
      sel.value = k.name;
      sel.dispatchEvent(new Event("change", { bubbles: true }));
      $("#requests").scrollIntoView();
    };
    tr.addEventListener("click", open);
    tr.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); open(); } });
    if (k.blocked) tr.classList.add("blocked");
    return tr;
  }));
  // Requests solid and refusals dashed, per key, per bucket of the window.
  const series = [], data = [a.t];
  for (const k of keys) {
    series.push({ label: k.name, stroke: color(k.name), width: 2, spanGaps: true, value: (u, v) => fmt.int(v) });
    data.push(k.series.requests);
    series.push({ label: k.name + " refused", stroke: color(k.name), width: 1, dash: [5, 4], spanGaps: true,
      value: (u, v) => fmt.int(v) });
    data.push(k.series.refusals);
  }
  if (keys.length) draw("keys", $("#chart-keys"), series, data);
  state.keyAttention = a.attention;
  renderAttention();
}

export async function refreshKeys() {
  try { renderKeys(await getJSON("/ui/api/keys?range=" + encodeURIComponent(state.range))); } catch (_) {
    /* the attention strip says why */
  }
}
