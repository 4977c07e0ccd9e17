"""The dashboard on a bad night (issue 35): a dead provider, a capped budget, a tool loop stopped, a process that
was killed and restarted, one that is FATAL. Every figure the page shows is checked against what the daemon
says elsewhere: the admin API (as corectl reads it), /metrics, the journal, the process's own log."""

from __future__ import annotations

import os
import signal
import time

import httpx
import orjson
import pytest

from coderouterd.state.journal_reader import journal_rows
from tests.support import cli
from tests.support.daemon import admin_get
from tests.support.metrics import scrape, series

from .conftest import axe_violations, save

ROW = '#providers-table tbody tr[data-provider="{}"]'
LONG = 30_000  # ms: a ceiling for what the page waits for, never a measure of it


def _admin(scene) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=scene.socket), base_url="http://coderouterd", timeout=10)


def _wait(cond, what: str, ceiling_s: float = 30.0):
    deadline = time.monotonic() + ceiling_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"waited {ceiling_s} s for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def night(scene):
    """The scene's events, made once: the dead provider's breaker opened by a request, the box killed and
    restarted, a tool loop stopped, a request no provider could serve."""
    now = lambda: httpx.get(scene.url + "/api/now").json()  # noqa: E731
    _wait(lambda: now()["processes"]["box"]["state"] == "ready", "box ready")
    _wait(lambda: now()["processes"]["broken"]["state"] == "fatal", "broken FATAL")
    scene.request("default", "night-fallback-1")  # dead refuses the connection: its breaker opens, local serves
    pid = now()["processes"]["box"]["pid"]
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: (p := now()["processes"]["box"])["restarts_total"] >= 1 and p["state"] == "ready",
          "box restarted")
    loop = scene.tool_loop("night-loop-1")
    assert loop.status_code == 400 and "tool loop" in loop.text
    failed = httpx.post(scene.daemon.url + "/v1/chat/completions", timeout=20,
                        headers={"x-coderouter-profile": "deadonly", "x-request-id": "night-failed-1"},
                        json={"model": "asked-model", "messages": [{"role": "user", "content": "hi"}]})
    assert failed.status_code >= 500
    _wait(lambda: any(r["request_id"] == "night-failed-1"
                      for r in httpx.get(scene.url + "/api/requests?limit=5").json()["requests"]), "journal")
    return scene


def open_page(page, scene, hash_: str = ""):
    answer = page.goto(scene.url + hash_)
    if answer is None:  # only the #fragment changed: the same document; load it anew
        answer = page.reload()
    assert answer.status == 200
    page.wait_for_selector(ROW.format("dead"), timeout=LONG)
    page.wait_for_selector("#live-state.on", timeout=LONG)


def test_the_attention_strip_names_each_problem_and_links_to_it(page, night):
    open_page(page, night)
    page.wait_for_function("""() => {
        const kinds = new Set(Array.from(document.querySelectorAll('#attention-list li')).map(li => li.dataset.kind));
        return ['down', 'budget', 'loop', 'fatal'].every(k => kinds.has(k));
    }""", timeout=LONG)
    items = page.locator("#attention-list li")
    texts = items.all_inner_texts()
    assert any("dead is down" in t for t in texts)
    assert any("capped: blocked by its monthly cap" in t for t in texts)
    assert any("broken is FATAL" in t for t in texts)
    assert not page.locator("#attention").evaluate("e => e.classList.contains('calm')")
    # Each entry's link leads to its detail: a row on the page, or a request's trace.
    for href in items.locator("a").evaluate_all("as => as.map(a => a.getAttribute('href'))"):
        if href.startswith("#/requests/"):
            continue
        assert page.locator(f"[id='{href[1:]}']").count() == 1, href
    # Blocked by its cap is a state, not a green "healthy".
    capped = page.locator(ROW.format("capped"))
    assert capped.get_attribute("data-state") == "blocked: monthly cap"
    assert "healthy" not in capped.locator("td").nth(1).inner_text()
    # The tool loop's entry opens its request's trace, where the guard says what it did.
    page.locator("#attention-list li[data-kind=loop] a").click()
    page.wait_for_selector("#trace[open]", timeout=LONG)
    assert page.locator("#trace-id").inner_text() == "night-loop-1"
    kv = page.locator("#trace-kv").inner_text()
    assert "tool loop stopped the request" in kv
    assert "none available" not in kv  # it was never planned: no claim that no provider was available
    assert page.errors == []


def test_why_a_provider_is_down_and_when_it_is_tried_again(page, night):
    open_page(page, night)
    dead = page.locator(ROW.format("dead"))
    dead.locator(".countdown").wait_for(timeout=LONG)
    with _admin(night) as admin:
        status = admin.get("/v1/status").json()
    provider = next(p for p in status["providers"] if p["name"] == "dead")
    probe = status["health"]["dead"]["last_probe"]
    why = dead.locator(".why").inner_text()
    assert probe["ok"] is False and probe["detail"] in why  # the probe's own error, as the admin API has it
    assert "next try in" in why
    # Why it gets no traffic is the daemon's one answer, in the admin API's words (the retry counted down live).
    answer = provider["availability"]
    assert answer["available"] is False and dead.get_attribute("data-traffic") == answer["code"]
    shown_why = dead.locator(".why .availability").inner_text()
    assert shown_why.startswith("no traffic: " + answer["why"].split(", retry in")[0]), shown_why
    # The countdown counts to the breaker's retry time, as the admin API (and `corectl status`) reports it.
    shown = float(dead.locator(".countdown").get_attribute("data-retry-at"))
    assert shown == pytest.approx(provider["breaker"]["retry_at"], abs=1.0)
    deadline = float(dead.locator(".countdown").get_attribute("data-deadline"))
    # Counted from "retry in" when the page read it: the same instant give or take that answer's way here.
    assert deadline == pytest.approx(provider["breaker"]["retry_at"], abs=30.0)


def test_processes_show_their_last_exit_last_log_line_and_restarts(page, night):
    open_page(page, night)
    broken = page.locator("#processes-table tbody tr[data-process=broken]")
    broken.filter(has_text="fatal").wait_for(timeout=LONG)
    now = httpx.get(night.url + "/api/now").json()["processes"]
    assert "exited with code 3" in process_cell(page, broken, "Last exit").inner_text()

    def file_last_line() -> str:
        lines = [ln for ln in open(now["broken"]["log"], encoding="utf-8").read().splitlines() if ln.strip()]
        return lines[-1].strip()[:300]

    # The last log line is the log file's own last line (read again while waiting: the page polls every 2 s).
    _wait(lambda: process_cell(page, broken, "Last log line").inner_text() == file_last_line(),
          "the log's last line on the page")
    box = page.locator("#processes-table tbody tr[data-process=box]")
    box.filter(has_text="ready").wait_for(timeout=LONG)
    (_labels, restarts), = series(scrape(night.daemon), "coderouter_process_restarts_total", process="box")
    assert int(process_cell(page, box, "Restarts").inner_text()) == int(restarts) >= 1
    assert "killed by SIGKILL" in process_cell(page, box, "Last exit").inner_text()


def process_cell(page, row, header: str):
    """A processes-table cell by its column's heading (columns grow: memory, idle stop, last stop)."""
    heads = page.locator("#processes-table thead th").all_inner_texts()
    return row.locator("td").nth(heads.index(header))


def test_local_models_show_memory_against_the_budget_and_each_process_its_share(page, night):
    """Issue 35 item 5: what is resident, the memory held against [models] memory_budget_mb, each process's
    memory, idle stop and last stop, as the admin API's status says (the same view corectl status renders)."""
    open_page(page, night)
    box = page.locator("#processes-table tbody tr[data-process=box]")
    box.filter(has_text="ready").wait_for(timeout=LONG)
    line = page.locator("#models-budget")
    line.filter(has_text="resident: box").wait_for(timeout=LONG)
    models = admin_get(night.daemon.state_dir / "coderouterd.sock")["models"]
    assert models["resident"] == ["box"] and models["memory_budget_mb"] == 1000
    text = line.inner_text()
    assert f"{round(models['memory_held_mb']):,} MB held of 1,000 MB budget" in text, text
    assert process_cell(page, box, "Memory").inner_text().startswith("400 MB")
    assert process_cell(page, box, "Idle stop").inner_text() == "–"  # idle_stop_s = 0: never stopped for idling


def test_events_are_in_the_feed_and_corectl_explain_shows_the_tool_loop(page, night):
    open_page(page, night)
    feed = page.locator("#live-feed")
    for kind, text in (("guard_fired", "tool loop stopped"), ("breaker_transition", "open"),
                       ("process", "process box")):
        feed.locator(f"li[data-kind={kind}]", has_text=text).first.wait_for(timeout=LONG)
    # Backfilled from the journal on load: the requests made before the page was opened are listed.
    feed.locator('li[data-request-id="night-fallback-1"]').wait_for(timeout=LONG)
    env = {"CODEROUTER_SOCKET": night.socket, "PATH": "/usr/bin:/bin", "COLUMNS": "200",
           "XDG_CONFIG_HOME": str(night.daemon.tmp / "xdg-config")}
    out = cli.corectl(["explain", "night-loop-1"], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tool loop stopped the request" in out.stdout
    link = f"{night.daemon.url}/ui#/requests/night-loop-1"
    assert link in out.stdout  # the deep link to the same trace on the dashboard
    explained = orjson.loads(cli.corectl(["explain", "night-loop-1", "--json"], env=env).stdout)["trace"]
    assert explained["guards"][0]["action"] == "break" and explained["dashboard_url"] == link
    page.goto(link)
    page.wait_for_selector("#trace[open]", timeout=LONG)
    assert page.locator("#trace-id").inner_text() == "night-loop-1"
    # The request whose failure opened the dead provider's breaker says so in its trace.
    page.locator("#trace-close").click()
    page.goto(f"{night.url}#/requests/night-fallback-1")
    page.wait_for_function("() => document.querySelector('#trace-id').textContent === 'night-fallback-1'",
                           timeout=LONG)
    page.locator("#trace-kv tr", has_text="breaker dead").filter(has_text="open").wait_for(timeout=LONG)


def test_a_failed_request_names_no_model_it_did_not_use_and_is_no_provider(page, night):
    open_page(page, night, "#/requests/night-failed-1")
    page.wait_for_selector("#trace[open]", timeout=LONG)
    kv = page.locator("#trace-kv").inner_text()
    assert "no provider served it" in kv
    model_row = page.locator("#trace-kv tr", has_text="model").first.inner_text()
    assert "asked-model" in model_row and "→" not in model_row and "gone" not in model_row
    page.locator("#trace-close").click()
    page.wait_for_function("() => ['tokens', 'rpm', 'speed', 'spendDaily'].every(k => window.coderouterDashboard.charts[k])",
                           timeout=LONG)
    for chart in ("tokens", "rpm", "speed", "ttft", "spendDaily"):
        labels = page.evaluate(f"() => window.coderouterDashboard.charts.{chart}.series.map(s => s.label)")
        assert not any(lbl and lbl.split(" ")[0] == "-" for lbl in labels), (chart, labels)


def test_tokens_and_requests_over_time_agree_with_the_journal(page, night):
    open_page(page, night)
    page.select_option("#range", "30d")
    page.wait_for_function("() => document.querySelector('.range-label').textContent === 'last 30 days'", timeout=LONG)
    page.wait_for_function("() => document.querySelectorAll('#totals-table tbody tr').length >= 2", timeout=LONG)
    rows = journal_rows(night.daemon.state_dir / "state.db", since=time.time() - 30 * 86_400)
    # The trends read the journal as of their answer; the page's table and the journal must agree then.
    api = httpx.get(night.url + "/api/trends?range=30d").json()
    for name in ("local", "cloud"):
        mine = [r for r in rows if r["provider"] == name]
        tr = page.locator(f'#totals-table tbody tr[data-provider="{name}"]')
        cells = [c.replace(",", "") for c in tr.locator("td").all_inner_texts()]
        assert int(cells[1]) == len(mine) == sum(v or 0 for v in api["providers"][name]["requests"])
        assert int(cells[2]) == sum(r["input_tokens"] or 0 for r in mine)
        assert int(cells[3]) == sum(r["output_tokens"] or 0 for r in mine)
        assert int(cells[4]) == sum(r["cache_read_tokens"] or 0 for r in mine)
    # What the charts draw is that answer: requests per minute is the count over the bucket's minutes.
    rpm = page.evaluate("""() => { const u = window.coderouterDashboard.charts.rpm;
        return u.series.map((s, i) => [s.label, u.data[i]]).slice(1); }""")
    step_min = api["step_s"] / 60
    for label, ys in rpm:
        counts = api["providers"][label]["requests"]
        assert ys == pytest.approx([None if c is None else c / step_min for c in counts])
    speed = page.evaluate("""() => { const u = window.coderouterDashboard.charts.speed;
        return Object.fromEntries(u.series.slice(1).map((s, i) => [s.label, u.data[i + 1]])); }""")
    assert speed["local"] == api["providers"]["local"]["tokens_per_s"]


def test_profiles_show_the_effective_order_and_who_is_skipped(page, night):
    open_page(page, night)
    row = page.locator('#profiles-table tbody tr[data-profile="cloud"]')
    row.filter(has_text="capped").wait_for(timeout=LONG)
    with _admin(night) as admin:
        profiles = {p["name"]: p for p in admin.get("/v1/profiles").json()["profiles"]}
    cloud = profiles["cloud"]
    cells = row.locator("td")
    assert cells.nth(2).inner_text().replace("\n", " ").split(" > ") == cloud["effective_order"]
    for skip in cloud["skips"]:
        assert f"{skip['provider']}: {skip['reason']}" in cells.nth(3).inner_text()
    assert "capped" in {s["provider"] for s in cloud["skips"]}
    active = page.locator("#profiles-table tbody tr.active")
    assert active.count() == 1 and active.get_attribute("data-profile") == "default"


def test_requests_page_search_and_keyboard(page, night):
    open_page(page, night)
    table = page.locator("#requests-table tbody tr")
    page.wait_for_function("() => document.querySelectorAll('#requests-table tbody tr').length === 50", timeout=LONG)
    page.locator("#requests-more").click()
    page.wait_for_function("() => document.querySelectorAll('#requests-table tbody tr').length > 50", timeout=LONG)
    ids = table.evaluate_all("rs => rs.map(r => r.dataset.requestId)")
    assert len(ids) == len(set(ids))  # the next page starts where the first ended
    # Search by id opens the trace; an unknown id says so.
    page.fill('#filters input[name="id"]', "seed-cloud-7")
    page.locator('#filters button[type="submit"]').click()
    page.wait_for_selector("#trace[open]", timeout=LONG)
    assert page.locator("#trace-id").inner_text() == "seed-cloud-7"
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.querySelector('#trace').open", timeout=LONG)
    page.fill('#filters input[name="id"]', "no-such-request")
    page.locator('#filters button[type="submit"]').click()
    page.wait_for_function("() => document.querySelector('#search-message').textContent.includes('No request')",
                           timeout=LONG)
    # Keyboard: a row is focusable and Enter opens its trace.
    first = table.first
    first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#trace[open]", timeout=LONG)
    assert page.locator("#trace-id").inner_text() == first.get_attribute("data-request-id")
    # The unknown id's 404 is the browser's own console line; nothing else went wrong.
    assert [e for e in page.errors if "status of 404" not in e] == []


def test_the_strip_says_when_the_daemon_is_unreachable_drift_and_the_shared_database(page, night):
    def doctored(route):
        data = route.fetch().json()
        local = next(p for p in data["providers"] if p["name"] == "local")
        local["drift"] = {"score": 1.4, "signals": {"tool_silence": 1.0}, "model": "qwen3-coder", "samples": 40}
        data["shared"] = {"backend": "postgres", "up": False, "problem": "connection refused"}
        cloud = next(p for p in data["providers"] if p["name"] == "cloud")
        cloud["budget"] = {**cloud["budget"], "spent": 22.5, "ratio": 0.9}  # past warn_ratio (0.8), not blocked
        # The daemon's word for it then (admin/words.py; tests/unit/test_state_word.py): the page prints it.
        cloud["state"] = {**cloud["state"], "word": "near its cap", "kind": "warn", "problem": "budget"}
        data["budget_global"] = {"spent": 50.0, "cap": 50.0, "ratio": 1.0, "reserved": 0.0, "blocked": True}
        route.fulfill(json=data)

    page.route("**/ui/api/now", doctored)
    open_page(page, night)
    page.wait_for_selector("#attention-list li[data-kind=drift]", timeout=LONG)
    page.wait_for_selector("#attention-list li[data-kind=shared]", timeout=LONG)
    assert "connection refused" in page.locator("#attention-list li[data-kind=shared]").inner_text()
    budget = page.locator("#attention-list li[data-kind=budget]").all_inner_texts()
    assert "cloud: near its monthly cap ($22.50 of $25.00)" in budget
    assert any("global cap ($50.00)" in t for t in budget)
    assert page.locator(ROW.format("cloud")).get_attribute("data-state") == "near its cap"
    # Waits for a doctored answer still in flight: removed mid-fetch, its route was left unanswered and the page's
    # poll with it (a flake in one of ten runs).
    page.unroute_all(behavior="wait")
    # The daemon stops answering: the page says so at the top and greys out what it shows, no longer green.
    page.route("**/ui/api/**", lambda route: route.abort("connectionrefused"))
    page.wait_for_selector("#attention-list li[data-kind=daemon]", timeout=LONG)
    assert page.evaluate("() => document.body.classList.contains('stale')")
    page.unroute("**/ui/api/**")
    page.wait_for_function("() => !document.body.classList.contains('stale')", timeout=LONG)
    assert page.locator("#attention-list li[data-kind=daemon]").count() == 0


VIEWS = {"page": None, "trace": "#/requests/night-loop-1"}


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", [(1440, 900), (390, 844)], ids=["1440x900", "390x844"])
def test_screenshots_and_no_serious_accessibility_violations(browser, night, size, scheme):
    width, height = size
    ctx = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1,
                              color_scheme=scheme)
    page = ctx.new_page()
    try:
        for view, hash_ in VIEWS.items():
            open_page(page, night, hash_ or "")
            page.wait_for_function("() => ['ttft', 'tokens', 'spendDaily'].every(k => window.coderouterDashboard.charts[k])",
                                   timeout=LONG)
            if hash_:
                page.wait_for_selector("#trace[open]", timeout=LONG)
            else:
                page.wait_for_selector("#attention-list li", timeout=LONG)
                # Nothing wider than the screen: a phone scrolls down, not sideways.
                overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"{width}px: the page is {overflow}px wider than the viewport"
                if width < 500:  # every provider column is there on a phone, labelled
                    # The providers table fills from its own answer, after the attention list: wait for the row
                    # (a read right after the list found it not yet drawn: no cells at all).
                    row = ROW.format("capped")
                    page.wait_for_function(
                        "sel => [...document.querySelectorAll(sel + ' td')].some(td => td.offsetWidth > 0)", arg=row,
                        timeout=LONG)
                    labels = page.locator(row).locator("td").evaluate_all(
                        "tds => tds.filter(td => td.offsetWidth > 0).map(td => td.dataset.label)")
                    assert "Spent / cap" in labels and "State" in labels, labels
            name = f"scene-{view}-{width}x{height}-{scheme}"
            save(name + ".png", page.screenshot())
            if view == "page":  # the whole page too (the trace is a dialog: the viewport is all of it)
                save(name + "-full.png", page.screenshot(full_page=True))
            if view == "page" and width == 1440 and scheme == "light":  # README's picture (docs/dashboard.png)
                save("dashboard-overview.png", page.screenshot(full_page=True,
                                                               clip={"x": 0, "y": 0, "width": 1440, "height": 1500}))
            bad = axe_violations(page)
            assert bad == [], f"{name}: {bad}"
    finally:
        ctx.close()


def test_the_page_weighs_under_150_kb(night):
    page = httpx.get(night.url)
    names = ["app.js", "core.js", "now.js", "trends.js", "requests.js", "ui.css", "uPlot.iife.min.js", "uPlot.min.css"]
    total = len(page.content) + sum(len(httpx.get(f"{night.url}/static/{n}").content) for n in names)
    assert total < 150 * 1024, f"{total} bytes"
    # Every file the page loads is one of these: nothing it imports is left out of the count.
    for src in ("core.js", "now.js", "trends.js", "requests.js"):
        assert f"./{src}" in "".join(httpx.get(f"{night.url}/static/{n}").text for n in ("app.js", "now.js",
                                                                                          "trends.js", "requests.js"))


def test_an_idle_on_demand_model_is_stopped_not_down(page, night):
    """Stopped until a request needs it is how an on-demand setup rests: a warning that says so, not an alarm."""
    open_page(page, night)
    lazy = page.locator(ROW.format("lazy"))
    lazy.wait_for(timeout=LONG)
    with _admin(night) as admin:
        status = admin.get("/v1/status").json()
    answer = next(p for p in status["providers"] if p["name"] == "lazy")["availability"]
    assert answer["available"] is False and answer["code"] == "on_demand"
    assert lazy.get_attribute("data-traffic") == "on_demand"
    assert lazy.get_attribute("data-state") == "stopped: starts on demand"
    assert lazy.locator(".badge").first.get_attribute("class").split() == ["badge", "idle"]  # at rest, no alarm
    page.wait_for_selector("#attention-list li[data-kind=down]", timeout=LONG)  # the strip has been drawn
    assert not any("lazy" in t for t in page.locator("#attention-list li").all_inner_texts())
    assert page.errors == []


def test_each_provider_shows_the_daemons_own_word_in_its_kind(page, night):
    """The state word is the daemon's (admin/words.py: every availability code's word and kind is unit-tested in
    tests/unit/test_state_word.py): the page prints it and its kind, and lists it in the strip by its problem,
    deriving nothing of its own."""
    open_page(page, night)
    page.wait_for_selector("#attention-list li[data-kind=down]", timeout=LONG)

    def shown() -> dict:
        return page.evaluate("""() => Object.fromEntries(Array.from(
            document.querySelectorAll('#providers-table tbody tr')).map(tr => [tr.dataset.provider,
            { word: tr.dataset.state, kind: tr.dataset.kind,
              badge: tr.querySelector('.badge').className, traffic: tr.dataset.traffic }]))""")

    def agree() -> dict | None:
        daemon = {p["name"]: p for p in httpx.get(night.url + "/api/now").json()["providers"]}
        page_now = shown()
        for name, p in daemon.items():
            row = page_now.get(name)
            if row is None or row["word"] != p["state"]["word"]:
                return None  # the page has not polled since the daemon's word moved
        return {"daemon": daemon, "page": page_now}

    got = _wait(agree, "every row showing the daemon's word")
    for name, p in got["daemon"].items():
        row = got["page"][name]
        assert row["kind"] == p["state"]["kind"] and row["badge"].split() == ["badge", p["state"]["kind"]], \
            (name, row, p["state"])
        assert row["traffic"] == p["state"]["code"] == p["availability"]["code"], (name, row)
    strip = page.locator("#attention-list li").all_inner_texts()
    for name, p in got["daemon"].items():
        listed = any(t.startswith((f"{name} is ", f"{name}: ")) for t in strip)
        if p["state"]["problem"] in ("down", "budget") and p.get("process_state") != "fatal":
            assert listed, (name, p["state"], strip)
        elif p["state"]["problem"] is None:
            assert not listed, (name, p["state"], strip)
    assert page.errors == []
