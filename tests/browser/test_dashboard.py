"""The dashboard as a person sees it: the real daemon, fake upstreams, headless Chromium (see conftest.py)."""

from __future__ import annotations

import httpx
import orjson

from tests.support import cli
from tests.support.wait import wait_for

from .conftest import REBOUND_HOST, save

PROVIDER_ROW = '#providers-table tbody tr[data-provider="{}"]'


def open_dashboard(page, dash):
    answer = page.goto(dash.url)
    assert answer.status == 200
    for name in ("local", "cloud"):
        page.wait_for_selector(PROVIDER_ROW.format(name), timeout=10_000)
    page.wait_for_selector("#live-state.on", timeout=10_000)  # the live feed is connected
    return answer


def chart_today(page, chart: str, provider: str) -> float:
    """Today's value of one provider's series in one of the page's uPlot charts (its own data, as drawn)."""
    return page.evaluate("""([chart, provider]) => {
        const u = window.coderouterDashboard.charts[chart];
        if (!u) return -1;
        const i = u.series.findIndex((s) => s.label === provider);
        if (i < 0) return 0;
        const day = Math.floor((Date.now() / 1000 - u.data[0][0]) / 86400);
        return u.data[i][day] || 0;
    }""", [chart, provider])


def test_page_loads_clean_and_shows_the_configured_providers(page, dash):
    answer = open_dashboard(page, dash)
    headers = answer.headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "unsafe-inline" not in headers["content-security-policy"]
    assert not any(h.startswith("access-control-") for h in headers)
    rows = page.locator("#providers-table tbody tr")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.provider)")) == ["box", "cloud", "local"]
    assert "anthropic" in page.locator(PROVIDER_ROW.format("cloud")).inner_text()
    # The managed backend: its state, uptime and restarts, as `corectl status` shows them.
    box = page.locator("#processes-table tbody tr", has_text="box")
    box.filter(has_text="ready").wait_for(timeout=20_000)
    assert box.locator("td").nth(3).inner_text() == "0"
    # The trends were drawn from the journal (seeded history): both providers in the latency chart.
    page.wait_for_function("() => window.coderouterDashboard.charts.ttft !== undefined")
    labels = page.evaluate("() => window.coderouterDashboard.charts.ttft.series.map(s => s.label)")
    assert {"local p50", "local p95", "cloud p50", "cloud p95"} <= set(labels)
    # Spend: the cloud's month against its cap, and every paid provider against the global cap.
    spend = page.locator("#spend-table").inner_text()
    assert "$25.00" in spend and "all paid providers" in spend and "$50.00" in spend
    # The seeded cache-busts are listed with the segment that changed.
    assert "system[0] changed" in page.locator("#busts-table").inner_text()
    page.wait_for_timeout(500)  # a late console error (a chart, the feed) still counts
    assert page.errors == []


def test_a_request_shows_live_with_its_cost_in_the_spend_chart(page, dash):
    open_dashboard(page, dash)
    page.wait_for_function("() => window.coderouterDashboard.charts.spendDaily !== undefined")
    before = chart_today(page, "spendDaily", "cloud")
    # It arrives by the live feed (server-sent events), not by a reload or a poll of the journal: the event is
    # waited for with a generous ceiling, never timed (a shared CI machine makes any time limit flaky).
    page.evaluate("""() => window.coderouterDashboard.events.addEventListener("request_finished", (ev) => {
        if (JSON.parse(ev.data).request_id === "ui-live-1") window.__liveSeen = true; })""")
    dash.request("cloud", "ui-live-1")
    page.wait_for_function("() => window.__liveSeen === true", timeout=20_000)
    page.wait_for_selector('#live-feed li[data-request-id="ui-live-1"]', timeout=20_000)
    item = page.locator('#live-feed li[data-request-id="ui-live-1"]').inner_text()
    assert "cloud" in item and "200" in item
    # Its cost, as the journal recorded it, is added to today's bar for its provider.
    cost = httpx.get(dash.url + "/api/requests/ui-live-1").json()["trace"]["cost_usd"]
    assert cost > 0
    page.wait_for_function("""([before, cost]) => {
        const u = window.coderouterDashboard.charts.spendDaily;
        const i = u.series.findIndex((s) => s.label === "cloud");
        const day = Math.floor((Date.now() / 1000 - u.data[0][0]) / 86400);
        return i > 0 && Math.abs(u.data[i][day] - (before + cost)) < 1e-9;
    }""", arg=[before, cost], timeout=20_000)
    assert page.errors == []


def test_opening_a_request_shows_its_trace_as_corectl_explain_does(page, dash):
    open_dashboard(page, dash)
    dash.request("default", "ui-trace-1")
    page.locator('#live-feed li[data-request-id="ui-trace-1"]').click(timeout=20_000)
    page.wait_for_selector("#trace[open]")
    assert page.locator("#trace-id").inner_text() == "ui-trace-1"
    shown = page.locator("#trace-attempts tbody tr").all_inner_texts()
    kv = page.locator("#trace-kv").inner_text()
    env = {"CODEROUTER_SOCKET": dash.socket, "PATH": "/usr/bin:/bin", "COLUMNS": "200",
           "XDG_CONFIG_HOME": str(dash.daemon.tmp / "xdg-config")}
    out = cli.corectl(["explain", "ui-trace-1", "--json"], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    explained = orjson.loads(out.stdout)
    trace = explained["trace"]
    assert explained["source"] == "memory"
    assert len(shown) == len(trace["attempts"]) >= 1
    for row, attempt in zip(shown, trace["attempts"], strict=True):
        assert attempt["provider"] in row and attempt["outcome"] in row
    assert f"served by {trace['served_by']}" in kv
    assert " > ".join(trace["candidates"]) in kv  # the profile's chain, from the planning notes kept in memory
    # The same request from the requests table opens the same trace.
    page.locator("#trace-close").click()
    page.locator("#requests-table tbody tr", has_text="ui-trace-1").first.click(timeout=20_000)
    page.wait_for_selector("#trace[open]")
    assert page.locator("#trace-id").inner_text() == "ui-trace-1"
    assert page.errors == []


def test_a_hidden_tab_leaves_the_live_feed_and_rejoins_when_shown(page, dash):
    open_dashboard(page, dash)

    def viewers() -> int:  # browsers the daemon's live feed is serving now
        return httpx.get(dash.url + "/api/now").json()["viewers"]

    assert viewers() >= 1
    before = viewers()
    page.evaluate("""() => {
        Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "hidden"});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    page.wait_for_selector("#live-state.off")
    assert wait_for(lambda: viewers() == before - 1, 30)  # the daemon saw the stream close
    page.evaluate("""() => {
        Object.defineProperty(document, "visibilityState", {configurable: true, get: () => "visible"});
        document.dispatchEvent(new Event("visibilitychange"));
    }""")
    page.wait_for_selector("#live-state.on")
    dash.request("default", "ui-rejoined-1")
    page.wait_for_selector('#live-feed li[data-request-id="ui-rejoined-1"]', timeout=20_000)
    assert page.errors == []


def test_requests_filter_by_outcome_and_provider(page, dash):
    open_dashboard(page, dash)
    page.select_option('#filters select[name="outcome"]', "error")
    page.wait_for_function("""() => {
        const rows = Array.from(document.querySelectorAll('#requests-table tbody tr'));
        return rows.length > 0 && rows.every(r => r.innerText.includes('529'));
    }""")
    page.select_option('#filters select[name="outcome"]', "")
    page.select_option('#filters select[name="provider"]', "local")
    page.wait_for_function("""() => {
        const rows = Array.from(document.querySelectorAll('#requests-table tbody tr'));
        return rows.length > 0 && rows.every(r => r.cells[3].innerText === 'local');
    }""")
    assert page.errors == []


def test_screenshots_wide_and_narrow(browser, dash):
    for width, height in ((1280, 800), (390, 844)):
        ctx = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
        page = ctx.new_page()
        try:
            open_dashboard(page, dash)
            for i, profile in enumerate(("default", "cloud", "default")):
                dash.request(profile, f"ui-shot-{width}-{i}")
            page.wait_for_selector(f'#live-feed li[data-request-id="ui-shot-{width}-2"]', timeout=20_000)
            page.wait_for_function("() => ['ttft', 'total', 'cache', 'spendDaily', 'spendMonth']"
                                   ".every(k => window.coderouterDashboard.charts[k] !== undefined)")
            # Two frames rendered after the charts exist: the layout the checks below read is the drawn one.
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            # Nothing wider than the screen: a phone scrolls down, not sideways (tables scroll in their card).
            overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{width}px: the page is {overflow}px wider than the viewport"
            path = save(f"dashboard-{width}x{height}.png", page.screenshot())
            save(f"dashboard-{width}x{height}-full.png", page.screenshot(full_page=True))
            assert path.stat().st_size > 10_000
        finally:
            ctx.close()


# -- with api_keys ---------------------------------------------------------------------------------------------

def test_with_keys_no_key_is_refused_and_the_login_form_lets_the_browser_in(page, keyed):
    answer = page.goto(keyed.url)
    assert answer.status == 401
    assert page.locator('input[name="key"]').count() == 1
    assert page.locator("#providers-table").count() == 0  # none of the page, none of its data
    for path in ("/api/now", "/api/spend", "/api/trends", "/api/requests", "/api/events"):
        r = httpx.get(keyed.url + path, timeout=5)
        assert r.status_code == 401, path
        assert "qwen3-coder" not in r.text and "providers" not in r.text
    page.fill('input[name="key"]', "not-the-key")
    page.click('button[type="submit"]')
    assert "not valid for this coderouterd" in page.locator("#message").inner_text()
    page.fill('input[name="key"]', keyed.keys[0])
    page.click('button[type="submit"]')
    page.wait_for_selector(PROVIDER_ROW.format("cloud"), timeout=10_000)
    page.wait_for_selector("#live-state.on", timeout=10_000)
    cookie = next(c for c in page.context.cookies() if c["name"] == "coderouter_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert keyed.keys[0] not in cookie["value"]
    keyed.request("cloud", "ui-keyed-1")
    page.wait_for_selector('#live-feed li[data-request-id="ui-keyed-1"]', timeout=20_000)


def test_with_keys_a_foreign_host_is_refused_even_with_the_key(page, keyed):
    # A page served under another name that resolves to 127.0.0.1 (DNS rebinding): the browser sends that name.
    answer = page.goto(f"http://{REBOUND_HOST}:{keyed.daemon.port}/ui")
    assert answer.status == 403
    assert page.locator("#providers-table").count() == 0
    r = httpx.get(keyed.url + "/api/now", headers={"host": f"{REBOUND_HOST}:{keyed.daemon.port}",
                                                  "authorization": f"Bearer {keyed.keys[0]}"})
    assert r.status_code == 403 and "providers" not in r.text
    assert httpx.get(keyed.url + "/api/now", headers={"authorization": f"Bearer {keyed.keys[0]}"}).status_code == 200
