"""The Requests table and the Live card under a keyboard and a running daemon (issue 43: E2, E10, E15, E17), on the
bad-night scene (conftest.scene): a dead provider first in the default profile, so requests fall back and say why."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, openai_at
from tests.support.daemon import DaemonProcess

ROWS = "#requests-table tbody tr"
LONG = 30_000  # ms: a ceiling for what the page waits for, never a measure of it


def open_page(page, scene) -> None:
    assert page.goto(scene.url).status == 200
    page.wait_for_selector('#providers-table tbody tr[data-provider="local"]', timeout=LONG)
    page.wait_for_selector("#live-state.on", timeout=LONG)
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length === 50", timeout=LONG)


def row_ids(page) -> list[str]:
    return page.locator(ROWS).evaluate_all("rs => rs.map(r => r.dataset.requestId)")


def focused_id(page) -> str | None:
    return page.evaluate("() => document.activeElement && document.activeElement.dataset.requestId || null")


def test_a_finished_request_keeps_the_focused_row_and_the_rows_paged_in(page, scene):
    """E2: a finished request used to re-render the table: focus fell to the top of the page and the rows loaded
    with "Older requests" were thrown away (100 back to 50)."""
    open_page(page, scene)
    page.locator("#requests-more").click()
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length === 100", timeout=LONG)
    target = row_ids(page)[60]
    page.locator(f'{ROWS}[data-request-id="{target}"]').focus()
    assert focused_id(page) == target
    scene.request("default", "e2-finished-1")
    page.wait_for_selector(f'{ROWS}[data-request-id="e2-finished-1"]', timeout=LONG)
    ids = row_ids(page)
    assert ids[0] == "e2-finished-1" and len(ids) == 101  # added on top; the paged rows stay
    assert focused_id(page) == target  # the same row still has the keyboard
    # And the keyboard goes on from there: Enter opens that row's trace.
    page.keyboard.press("Enter")
    page.wait_for_selector("#trace[open]")
    assert page.locator("#trace-id").inner_text() == target
    assert page.errors == []


def test_the_focused_row_keeps_focus_without_paging_too(page, scene):
    open_page(page, scene)
    target = row_ids(page)[2]
    page.locator(f'{ROWS}[data-request-id="{target}"]').focus()
    scene.request("default", "e2-finished-2")
    page.wait_for_selector(f'{ROWS}[data-request-id="e2-finished-2"]', timeout=LONG)
    assert focused_id(page) == target
    assert len(row_ids(page)) == 51  # the user is on a row: nothing is taken from under them
    assert page.errors == []


def test_each_request_says_why_and_the_list_filters_by_time(page, scene):
    """E10: a reason column built from the attempts, and a time filter."""
    scene.request("default", "e10-why-1")  # dead first: skipped (its breaker is open) or failed, local serves
    open_page(page, scene)
    row = page.locator(f'{ROWS}[data-request-id="e10-why-1"]')
    why = row.locator("td.reason").inner_text()
    assert why.startswith("dead ") and ("skipped" in why or "connect_error" in why), why
    trace = httpx.get(scene.url + "/api/requests/e10-why-1").json()["trace"]
    failed = [a for a in trace["attempts"] if a["outcome"] != "ok"]
    for step in [*trace["skips"], *failed]:
        assert step["provider"] in why
    # The time filter: the last 15 minutes hold this request and none of the seeded ones from hours ago.
    page.select_option('#filters select[name="since"]', "900")
    page.wait_for_function(f"""() => {{
        const rows = Array.from(document.querySelectorAll('{ROWS}'));
        return rows.length > 0 && rows.length < 50 && rows.every(r => Number(r.dataset.ts) >= Date.now() / 1000 - 960);
    }}""", timeout=LONG)
    assert "e10-why-1" in row_ids(page)
    assert page.errors == []


def test_requests_in_flight_are_listed_with_their_provider_and_elapsed_time(page, scene):
    """E15: not only a count: each request being served, the provider it is on, how long it has run."""
    open_page(page, scene)
    scene.local.script(["slow_first_byte;delay=8"])
    done = threading.Event()

    def send() -> None:
        try:
            httpx.post(scene.daemon.url + "/v1/chat/completions", timeout=60,
                       headers={"x-coderouter-profile": "default", "x-request-id": "e15-slow-1"},
                       json={"model": "m", "messages": [{"role": "user", "content": "take your time"}]})
        finally:
            done.set()

    threading.Thread(target=send, daemon=True).start()
    item = page.locator('#inflight-list li[data-request-id="e15-slow-1"]')
    item.wait_for(timeout=LONG)
    assert "on local" in item.inner_text()
    first = item.locator(".elapsed").inner_text()
    page.wait_for_function("""(first) => {
        const e = document.querySelector('#inflight-list li[data-request-id="e15-slow-1"] .elapsed');
        return e && e.textContent !== first;
    }""", arg=first, timeout=LONG)  # it counts on while the request runs
    assert done.wait(60)
    item.wait_for(state="detached", timeout=LONG)  # gone once answered
    assert page.errors == []


def test_a_skip_link_is_the_first_tab_stop_and_attention_links_move_focus(page, scene):
    """E17: 47 Tab stops came before the first request row; an attention link moved the view, not the focus."""
    open_page(page, scene)
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.className") == "skip"
    first = row_ids(page)[0]
    page.keyboard.press("Enter")
    page.wait_for_function("(id) => document.activeElement.dataset.requestId === id", arg=first, timeout=LONG)
    # The attention strip's budget line links to the capped provider's row: the keyboard lands there.
    link = page.locator('#attention-list li[data-kind="budget"] a').first
    link.wait_for(timeout=LONG)
    link.focus()
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement.id === 'provider-capped'", timeout=LONG)
    # The providers table is drawn anew every poll: the row keeps the keyboard across it.
    for _ in range(2):
        with page.expect_response(lambda r: r.url.endswith("/ui/api/now"), timeout=LONG):
            pass
    page.wait_for_timeout(100)  # the answer drawn
    assert page.evaluate("() => document.activeElement.id") == "provider-capped"
    assert page.errors == []


def test_a_stopped_process_holds_no_memory_and_a_provider_counts_down_once(page, scene):
    """E13: a stopped process still showed its memory. E12: two countdowns side by side."""
    open_page(page, scene)
    lazy = page.locator('#processes-table tbody tr[data-process="lazy"]')
    lazy.wait_for(timeout=LONG)
    answer = httpx.get(scene.url + "/api/now", timeout=10).json()["processes"]["lazy"]
    assert answer["memory_mb"] == 100 and not answer["resident"]  # configured, not held
    heads = page.locator("#processes-table thead th").all_inner_texts()
    assert lazy.locator("td").nth(heads.index("Memory")).inner_text() == "–"
    box = page.locator('#processes-table tbody tr[data-process="box"]')
    box.filter(has_text="ready").wait_for(timeout=LONG)
    assert box.locator("td").nth(heads.index("Memory")).inner_text().startswith("400 MB")  # a running one does
    # E12: a provider whose breaker counts down to its next try while self-healing has a probe of its process
    # due. That moment is short on a real daemon, so the page's own renderer draws the daemon's answer with it.
    now = httpx.get(scene.url + "/api/now", timeout=10).json()
    counted = page.evaluate("""async (now) => {
        const view = await import("/ui/static/now.js");
        const p = now.providers.find((x) => x.name === "box");
        p.availability = { available: false, code: "breaker_open", why: "breaker open after 1 failure", retry_in_s: 30 };
        const proc = now.processes.box;
        proc.state = "starting";
        proc.next_probe_at = now.daemon.started_at + now.daemon.uptime_s + 20;
        view.renderNow(now);
        const row = document.querySelector('#providers-table tbody tr[data-provider="box"]');
        return [row.querySelectorAll('.countdown').length, row.querySelector('.countdown').textContent];
    }""", now)
    assert counted[0] == 1 and counted[1].startswith("next try in"), counted
    assert page.errors == []


@pytest.fixture(scope="module")
def young(tmp_path_factory):
    """A daemon whose journal is minutes old: one request."""
    local = FakeServer("openai", name="local", models=["qwen3-coder"]).start()
    d = DaemonProcess(daemon_config(providers={"local": openai_at(local.url, model="qwen3-coder")},
                                    profiles={"default": {"providers": ["local"]}}), tmp_path_factory.mktemp("young"))
    d.start()
    try:
        r = httpx.post(d.url + "/v1/chat/completions", timeout=20, headers={"x-request-id": "young-1"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        yield d
    finally:
        d.stop()
        local.stop()


def test_a_young_journal_opens_at_the_last_hour_and_its_lone_bucket_is_a_point(page, young):
    """E9: at the default 24 hours a young journal looked empty, and a lone bucket was not drawn at all."""
    assert page.goto(young.url + "/ui").status == 200
    page.wait_for_function("() => document.querySelector('#range').value === '1h'", timeout=LONG)
    page.wait_for_function("() => (window.coderouterDashboard.charts.total || {}).data", timeout=LONG)
    assert page.locator(".range-label").first.inner_text() == "last hour"
    drawn = page.evaluate("""() => {
        const u = window.coderouterDashboard.charts.total;
        const i = u.series.findIndex((s) => s.label === "local p50");
        return [u.data[i].filter((v) => v !== null && v !== undefined).length,
                u.series[i].points.filter(u, i, false, null)];
    }""")
    assert drawn[0] == 1 and drawn[1] is not None and len(drawn[1]) == 1, drawn  # one bucket, drawn as a point
    # The user's own choice stays.
    with page.expect_response(lambda r: "/ui/api/trends?range=24h" in r.url, timeout=LONG):
        page.select_option("#range", "24h")
    page.wait_for_function("() => document.querySelector('.range-label').textContent === 'last 24 hours'",
                           timeout=LONG)
    assert page.locator("#range").input_value() == "24h"
    assert page.errors == []
