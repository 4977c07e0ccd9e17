"""The dashboard's Keys view in a real browser (issue 41): each team key's spend, requests and refusals as the
journal has them, drawn over time; and the "needs attention" strip naming a key near its cap, one that is
blocked and one about to expire. Read-only: nothing on the page changes a key."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.daemon import DaemonProcess

from .conftest import axe_violations, config, seed_history

LONG = 30_000  # ms: a ceiling for what the page waits for, never a measure of it
KEY_ROW = '#keys-table tbody tr[data-key="{}"]'


def seed_keys(state_dir, now: float) -> None:
    """Rows of three team keys, written by the store's own journal sink as the daemon writes them."""
    from coderouterd.state import RequestFinished, Store
    from coderouterd.state.refusals import KEY_SCOPE, refusal_event

    ok = [{"provider": "cloud", "outcome": "ok", "reason": "ok"}]
    events = [RequestFinished(f"alice-{i}", "anthropic", "cloud", "cloud", ts=now - 3600 + i * 60, key_name="alice",
                              cost_usd=0.5, input_tokens=1000, output_tokens=200, attempts=ok) for i in range(6)]
    events += [RequestFinished(f"bob-{i}", "openai", "default", "cloud", ts=now - 7200 + i * 60, key_name="bob",
                               cost_usd=0.1, input_tokens=100, output_tokens=20, attempts=ok) for i in range(2)]
    events += [refusal_event(request_id=f"bob-no-{i}", ingress="openai", status=403, reason=KEY_SCOPE,
                             key_name="bob", ts=now - 1800 + i) for i in range(3)]
    store = Store(state_dir / "state.db")
    store.open()
    store.journal_sink()(events)
    store.close()


OPERATOR = "ui-team-lead-operator-key"


def corectl(d: DaemonProcess, *args: str) -> None:
    env = {**os.environ, "CODEROUTER_SOCKET": str(d.state_dir / "coderouterd.sock")}
    r = cli.corectl(list(args), env=env)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def keys_dash(tmp_path_factory):
    """The seeded journal's keys, created for real: alice at 86% of her cap, bob's cap spent, carol expiring in
    three days (and an operator key for the page, since keys are now required)."""
    tmp = tmp_path_factory.mktemp("ui_team_keys")
    local = FakeServer("openai", name="local", models=["qwen3-coder"]).start()
    cloud = FakeServer("anthropic", name="cloud").start()
    d = DaemonProcess(config(local, cloud, [OPERATOR]), tmp)
    now = time.time()
    seed_history(d.state_dir, now)
    seed_keys(d.state_dir, now)
    d.start()
    try:
        expires = datetime.fromtimestamp(now + 3 * 86_400 + 3600, UTC).isoformat(timespec="seconds")
        corectl(d, "keys", "create", "alice", "--monthly-usd", "3.5")
        corectl(d, "keys", "create", "bob", "--monthly-usd", "0.2")
        corectl(d, "keys", "create", "carol", "--expires", expires)
        yield d
    finally:
        d.stop()
        local.stop()
        cloud.stop()


@pytest.fixture
def kpage(browser):
    """A page that sends the operator key as a script would (Authorization: Bearer); errors collected."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800},
                              extra_http_headers={"authorization": f"Bearer {OPERATOR}"})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
    yield pg
    ctx.close()


def test_the_keys_view_shows_each_key_from_the_journal(kpage, keys_dash):
    page = kpage
    assert page.goto(keys_dash.url + "/ui#keys").status == 200
    page.wait_for_selector(KEY_ROW.format("alice"), timeout=LONG)
    alice = page.locator(KEY_ROW.format("alice")).inner_text()
    assert "$3.00 of $3.50" in alice and "86%" in alice
    assert page.locator(KEY_ROW.format("alice") + " meter").get_attribute("value") == str(3.0 / 3.5)
    bob = page.locator(KEY_ROW.format("bob"))
    assert "key_scope 3" in bob.inner_text() and "$0.20" in bob.inner_text() and "blocked" in bob.inner_text()
    assert "in 3.0 d" in page.locator(KEY_ROW.format("carol")).inner_text()
    # the chart draws each key's requests and refusals, the same numbers the endpoint answered
    page.wait_for_function("() => window.coderouterDashboard.charts.keys !== undefined", timeout=LONG)
    labels = page.evaluate("() => window.coderouterDashboard.charts.keys.series.map(s => s.label)")
    assert {"alice", "alice refused", "bob", "bob refused"} <= set(labels)
    drawn = page.evaluate("""() => { const u = window.coderouterDashboard.charts.keys;
        const i = u.series.findIndex((s) => s.label === "bob refused");
        return u.data[i].reduce((a, v) => a + (v || 0), 0); }""")
    answered = httpx.get(keys_dash.url + "/ui/api/keys", headers={"authorization": f"Bearer {OPERATOR}"}).json()
    bob_answer = next(k for k in answered["keys"] if k["name"] == "bob")
    assert drawn == sum(bob_answer["series"]["refusals"]) == 3
    # a key's row opens its requests: the list filtered by the key
    page.locator(KEY_ROW.format("alice")).click()
    page.wait_for_function("""() => { const ids = [...document.querySelectorAll('#requests-table tbody tr')]
        .map((r) => r.dataset.requestId); return ids.length === 6 && ids.every((i) => i.startsWith('alice-')); }""",
                           timeout=LONG)
    assert page.locator("#filters select[name=key]").input_value() == "alice"
    # a refused request's trace names its key, as `corectl explain` does
    page.goto(keys_dash.url + "/ui#/requests/bob-no-1")
    page.wait_for_selector("#trace[open]", timeout=LONG)
    assert "key\tbob" in page.locator("#trace-kv").inner_text()
    page.goto(keys_dash.url + "/ui#keys")
    # the page changes nothing: no form, no button on a key's row
    assert page.locator("#keys form, #keys-table button").count() == 0
    assert page.errors == []


def test_the_strip_names_a_key_near_its_cap_a_blocked_key_and_one_expiring(kpage, keys_dash):
    page = kpage
    assert page.goto(keys_dash.url + "/ui").status == 200
    page.wait_for_selector("#attention-list li[data-kind=key_expiring]", timeout=LONG)
    strip = {li.get_attribute("data-kind"): li for li in page.locator("#attention-list li").all()}
    assert strip["key_cap"].inner_text() == "key alice has used 86% of its monthly cap (3.00 of 3.50 USD)"
    assert strip["key_cap"].get_attribute("class") == "warn"
    assert strip["key_blocked"].inner_text() == "key bob is blocked by its monthly cap (0.20 of 0.20 USD)"
    assert strip["key_blocked"].get_attribute("class") == "bad"
    assert strip["key_expiring"].inner_text() == "key carol expires in 3 days"
    assert strip["key_expiring"].locator("a").get_attribute("href") == "#keys"
    page.locator("#keys").scroll_into_view_if_needed()
    assert axe_violations(page) == []
    assert page.errors == []
