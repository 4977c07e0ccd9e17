"""Issue 43's dashboard QA scene, in a real browser: a budget-capped provider every request is too dear for (E1), a
500ing provider whose breaker goes half-open (E4), and an on-demand local model killed once. The page prints the
daemon's one state word (admin/words.py); here it must say what the QA found it did not:

- E1: a provider skipped for budget on every request is not "near its cap" with an empty reason, not in the
  effective order, and not said by `corectl status` to take traffic; the Profiles view lists the same skip as
  `corectl explain`, with the skips counted.
- E4: a half-open provider the daemon will route a trial to is a warning ("half-open"), not "down: unhealthy" in
  red, and the attention strip does not list it as down."""

from __future__ import annotations

import os
import signal
import sys
import time

import httpx
import orjson
import pytest

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.config import anthropic_at, daemon_config, openai_at, upstream
from tests.support.daemon import ROOT, DaemonProcess, free_port
from tests.support.wait import wait_for

ROW = '#providers-table tbody tr[data-provider="{}"]'
LONG = 30_000  # ms: a ceiling for what the page waits for, never a measure of it
RECOVERY_S = 3


def _wait(cond, what: str, ceiling_s: float = 30.0):
    got = wait_for(cond, ceiling_s, step=0.1)
    assert got, f"waited {ceiling_s} s for {what}"
    return got


def _on_demand_model(port: int) -> dict:
    cmd = [sys.executable, "-m", "tests.fakes", "--kind", "openai", "--port", str(port), "--models", "m"]
    proc = {"command": cmd, "cwd": str(ROOT), "ready_url": f"http://127.0.0.1:{port}/v1/models", "start": "on_demand",
            "stop_timeout_s": 3, "startsecs": 0.2, "max_restarts": 3, "restart_window_s": 60, "memory_mb": 100}
    return upstream(f"http://127.0.0.1:{port}", kind="openai", process=proc)


class Qa:
    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon

    @property
    def url(self) -> str:
        return self.daemon.url + "/ui"

    @property
    def socket(self) -> str:
        return str(self.daemon.state_dir / "coderouterd.sock")

    @property
    def env(self) -> dict[str, str]:
        return {"CODEROUTER_SOCKET": self.socket, "PATH": "/usr/bin:/bin", "COLUMNS": "300",
                "XDG_CONFIG_HOME": str(self.daemon.tmp / "xdg-config")}

    def ask(self, profile: str, request_id: str) -> httpx.Response:
        r = httpx.post(self.daemon.url + "/v1/chat/completions", timeout=60,
                       headers={"x-coderouter-profile": profile, "x-request-id": request_id},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        return r

    def now(self) -> dict:
        return httpx.get(self.url + "/api/now", timeout=10).json()

    def provider(self, name: str) -> dict:
        return next(p for p in self.now()["providers"] if p["name"] == name)


@pytest.fixture(scope="module")
def qa(tmp_path_factory):
    from coderouterd.guards.budget import NAMESPACE, month_bounds
    from coderouterd.state import Store

    tmp = tmp_path_factory.mktemp("qa")
    local = FakeServer("openai", name="local", models=["qwen3-coder"]).start()
    cloud = FakeServer("anthropic", name="cloud").start()
    failing = FakeServer("openai", name="flaky", behaviour="500").start()
    cfg = daemon_config(
        breaker={"failures": 1, "recovery_s": RECOVERY_S},
        # Self-healing probes once and then leaves the half-open trial to a request: the state the page must show.
        health={"probe_interval_s": 600, "recovery_backoff_s": [600]},
        providers={
            "local": openai_at(local.url, model="qwen3-coder"),
            # $0.992 of its $1 cap spent: every request's worst case ($0.30 for 4096 tokens out) is over the rest.
            "pricey": anthropic_at(cloud.url, model="claude-opus-5", paid=True, monthly_budget_usd=1,
                                   cost={"input": 15.0, "output": 75.0}),
            "flaky": openai_at(failing.url, model="m"),
            "lazy": _on_demand_model(free_port())},
        profiles={"default": ["local"], "pricey": ["pricey", "local"], "flaky": ["flaky", "local"],
                  "lazy": ["lazy"]})
    d = DaemonProcess(cfg, tmp)
    month, _start, _end = month_bounds(time.time())
    d.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    store = Store(d.state_dir / "state.db")
    store.open()
    store.set(NAMESPACE, f"{month}:pricey", 0.992)
    store.close()
    d.start()
    try:
        yield Qa(d)
    finally:
        d.stop()
        for f in (local, cloud, failing):
            f.stop()


def open_page(page, qa: Qa) -> None:
    assert page.goto(qa.url).status == 200
    page.wait_for_selector(ROW.format("pricey"), timeout=LONG)


def test_e1_a_provider_skipped_for_budget_on_every_request_says_so_everywhere(page, qa):
    for i in range(3):
        r = qa.ask("pricey", f"e1-{i}")
        assert r.headers["x-coderouter-provider"] == "local"  # pricey was skipped: its estimate is over the rest
    answer = qa.provider("pricey")
    words = "requests estimated over $0.0080 are skipped (3 in the last 10 min)"
    assert answer["availability"]["code"] == "budget_skipped" and answer["availability"]["why"] == words
    assert answer["state"]["word"] == "skipped: over its budget" and answer["state"]["takes_traffic"] is False
    assert answer["budget"]["skipped"]["count"] == 3

    open_page(page, qa)
    row = page.locator(ROW.format("pricey"))
    page.wait_for_function(f"""() => document.querySelector('{ROW.format("pricey")}').dataset.traffic
                                     === 'budget_skipped'""", timeout=LONG)
    assert row.get_attribute("data-state") == "skipped: over its budget"  # not "near its cap"
    assert row.locator(".badge").first.get_attribute("class").split() == ["badge", "bad"]
    assert row.locator(".why .availability").inner_text() == "no traffic: " + words  # not an empty reason
    strip = page.locator("#attention-list li[data-kind=budget]").all_inner_texts()
    assert f"pricey: skipped: {words}" in strip, strip

    # The Profiles view: pricey is out of the effective order, with the skip `corectl explain` shows.
    prof = page.locator('#profiles-table tbody tr[data-profile="pricey"]')
    prof.wait_for(timeout=LONG)
    assert prof.locator(".chip").all_inner_texts() == ["local"]
    skipped = prof.locator("td").nth(3).inner_text()
    assert f"pricey: budget (pricey: {words})" in skipped, skipped
    explained = cli.corectl(["explain", "e1-2", "--json"], env=qa.env)
    assert explained.returncode == 0, explained.stderr
    trace_skips = {(s["provider"], s["reason"]) for s in orjson.loads(explained.stdout)["trace"]["skips"]}
    assert ("pricey", "budget") in trace_skips, trace_skips

    # corectl status: not said to take traffic, not in the order.
    status = cli.corectl(["status"], env=qa.env)
    assert status.returncode == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if "│ pricey " in x)
    assert "skipped: over its budget" in line, line
    assert f"pricey: no traffic: {words}" in [x.strip() for x in status.stdout.splitlines()]
    profile_row = next(x for x in status.stdout.splitlines() if "│ pricey " in x and "fallback" in x)
    effective = [c.strip() for c in profile_row.split("│")][-2]  # the last column: the effective order
    assert effective == "local  skipped: pricey (budget)", profile_row
    assert page.errors == []


def test_e4_a_half_open_provider_is_a_trial_not_down(page, qa):
    r = qa.ask("flaky", "e4-1")  # flaky answers 500: its breaker opens (1 failure), local serves
    assert r.headers["x-coderouter-provider"] == "local"
    open_page(page, qa)
    # The moment the page shows flaky half-open, everything it shows about flaky, read at once.
    snap = page.wait_for_function(f"""() => {{
        const tr = document.querySelector('{ROW.format("flaky")}');
        if (!tr || tr.dataset.traffic !== 'half_open') return null;
        return {{ state: tr.dataset.state, kind: tr.dataset.kind, badge: tr.querySelector('.badge').className,
                 strip: Array.from(document.querySelectorAll('#attention-list li')).map(li => li.innerText) }};
    }}""", timeout=(RECOVERY_S + 30) * 1000).json_value()
    assert snap["state"] == "half-open: next request is its trial", snap
    assert snap["kind"] == "warn" and snap["badge"].split() == ["badge", "warn"], snap
    assert not any(t.startswith("flaky") for t in snap["strip"]), snap["strip"]  # not listed as down
    assert qa.provider("flaky")["health"] == "UNHEALTHY"  # what the page used to draw it by, in red

    # The on-demand model of the scene, killed once: back, and shown in the daemon's word, never left "down".
    qa.ask("lazy", "e4-lazy-1")
    pid = _wait(lambda: qa.now()["processes"]["lazy"].get("pid"), "lazy running")
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: (p := qa.now()["processes"]["lazy"])["restarts_total"] >= 1 or p["state"] == "stopped",
          "lazy restarted or stopped after its kill")
    qa.ask("lazy", "e4-lazy-2")

    def lazy_agrees() -> str | None:
        word = qa.provider("lazy")["state"]["word"]
        shown = page.locator(ROW.format("lazy")).get_attribute("data-state")
        return word if shown == word else None

    word = _wait(lazy_agrees, "the page showing lazy in the daemon's word")
    assert not word.startswith("down"), word
    assert page.errors == []
