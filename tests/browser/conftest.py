"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against the real daemon and
fake upstreams on loopback.

`make test` runs scripts/browser.sh first, which installs Chromium with apt-get when it is missing; when it
cannot, it writes why to tests/browser/.unavailable and these tests skip with that reason. Playwright's own
browser download is never used: the browser is the system's (`executable_path`)."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, anthropic_at, daemon_config, ollama_at, openai_at, warn
from tests.support.daemon import ROOT, DaemonProcess, free_port
from tests.support.ports import dead_port

HERE = Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts"
UNAVAILABLE = HERE / ".unavailable"

# A name the browser resolves to 127.0.0.1 (--host-resolver-rules): what a DNS-rebinding page looks like to us.
REBOUND_HOST = "rebound.test"

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--host-resolver-rules=MAP {REBOUND_HOST} 127.0.0.1"]

CLOUD_COST = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}


def spending(local: FakeServer, cloud: FakeServer) -> dict[str, dict]:
    """The two providers every dashboard scene has: a free local model and a paid cloud one with a monthly cap."""
    return {"local": openai_at(local.url, model="qwen3-coder"),
            "cloud": anthropic_at(cloud.url, model="claude-sonnet-5", paid=True, monthly_budget_usd=25, cost=CLOUD_COST)}


def managed_backend(port: int, *flags: str, **process: object) -> dict:
    """An ollama-kind provider whose server is a real child process the daemon supervises
    (tests/support/fake_backend.py), for the processes panel."""
    ready = f"http://127.0.0.1:{port}"
    command = [sys.executable, str(ROOT / "tests" / "support" / "fake_backend.py"), "--port", str(port), *flags]
    return ollama_at(ready, process={"command": command, "cwd": str(ROOT), "ready_url": ready + "/api/tags",
                                     **process})


def config(local: FakeServer, cloud: FakeServer, keys: list[str]) -> str:
    return daemon_config(
        server={"api_keys": keys} if keys else {}, breaker=NO_BREAKER, budget={"global_monthly_usd": 50},
        providers={**spending(local, cloud), "box": managed_backend(free_port(), stop_timeout_s=2, startsecs=0.2)},
        profiles={"default": warn("local", "cloud"), "cloud": warn("cloud")})


def chromium_path() -> str | None:
    for c in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if c and os.access(c, os.X_OK):
            return c
    return None


# Module scope, not session: Playwright's sync API keeps an event loop running in this thread while it is
# started, and every later test that calls asyncio.run() would fail with "cannot be called from a running
# event loop". Stopped at the end of this module, the suite's other tests never see it.
@pytest.fixture(scope="module")
def browser():
    if UNAVAILABLE.is_file():
        pytest.skip(f"no browser: {UNAVAILABLE.read_text().strip()}")
    exe = chromium_path()
    if exe is None:
        pytest.skip("no browser: chromium is not installed (run `make browser`, or `make test`, which installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test extra: make .venv/.installed-test")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


def seed_history(state_dir: Path, now: float) -> float:
    """Twenty hours of finished requests written through the store's own journal sink, as the daemon writes
    them: latency, cache and cost trends to draw. Returns the seeded cost of this month (also booked in the
    budget ledger, as the daemon would have)."""
    from coderouterd.guards.budget import GLOBAL, NAMESPACE, month_bounds
    from coderouterd.state import RequestFinished, Store

    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    month, start, _end = month_bounds(now)
    events = []
    cost_this_month = 0.0
    for i in range(120):
        ts = now - 20 * 3600 + i * 600
        wave = 1 + 0.4 * math.sin(i / 9)
        events.append(RequestFinished(
            request_id=f"seed-local-{i}", ingress="anthropic", profile="default", provider="local",
            model_requested="qwen3-coder", model_used="qwen3-coder", latency_ms=900 * wave + (i % 7) * 40,
            ttfb_ms=180 * wave, input_tokens=1200, output_tokens=300, cache_read_tokens=int(9000 * (0.55 + 0.4 * math.cos(i / 15))),
            streaming=True, lane="main", session="s1", cache_bust="system[0] changed" if i in (30, 95) else None, ts=ts))
        cost = 0.004 + 0.002 * (i % 5)
        if ts >= start:
            cost_this_month += cost
        events.append(RequestFinished(
            request_id=f"seed-cloud-{i}", ingress="anthropic", profile="cloud", provider="cloud",
            model_requested="claude-sonnet-5", model_used="claude-sonnet-5", latency_ms=2400 * wave + (i % 5) * 90,
            ttfb_ms=650 * wave, input_tokens=900, output_tokens=450, cache_read_tokens=int(14000 * (0.7 + 0.25 * math.sin(i / 11))),
            cache_write_tokens=600, cost_usd=cost, status=529 if i % 41 == 0 else 200,
            error_class="overloaded" if i % 41 == 0 else None, streaming=True, ts=ts))
    store = Store(state_dir / "state.db")
    store.open()
    store.journal_sink()(events)
    store.set(NAMESPACE, f"{month}:cloud", cost_this_month)
    store.set(NAMESPACE, f"{month}:{GLOBAL}", cost_this_month)
    store.close()
    return cost_this_month


class Dashboard:
    def __init__(self, daemon: DaemonProcess, local: FakeServer, cloud: FakeServer, keys: list[str]) -> None:
        self.daemon = daemon
        self.local = local
        self.cloud = cloud
        self.keys = keys

    @property
    def url(self) -> str:
        return self.daemon.url + "/ui"

    @property
    def socket(self) -> str:
        return str(self.daemon.state_dir / "coderouterd.sock")

    def request(self, profile: str, request_id: str, **headers: str) -> httpx.Response:
        """One chat request through the proxy (the OpenAI wire), answered by the profile's fake upstream."""
        hs = {"x-coderouter-profile": profile, "x-request-id": request_id, **headers}
        if self.keys:
            hs["authorization"] = f"Bearer {self.keys[0]}"
        r = httpx.post(self.daemon.url + "/v1/chat/completions", headers=hs, timeout=20,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        return r


def _start(tmp: Path, keys: list[str]):
    local = FakeServer("openai", name="local", models=["qwen3-coder"]).start()
    cloud = FakeServer("anthropic", name="cloud").start()
    d = DaemonProcess(config(local, cloud, keys), tmp)
    seed_history(d.state_dir, time.time())
    d.start()
    return Dashboard(d, local, cloud, keys)


def _stop(dash: Dashboard) -> None:
    dash.daemon.stop()
    dash.local.stop()
    dash.cloud.stop()


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    d = _start(tmp_path_factory.mktemp("ui"), [])
    try:
        yield d
    finally:
        _stop(d)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    d = _start(tmp_path_factory.mktemp("ui_keys"), ["ui-test-key-1"])
    try:
        yield d
    finally:
        _stop(d)


@pytest.fixture
def page(browser, request):
    """A fresh browser context (no cookies) and page; console errors and page errors are collected."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
    yield pg
    ctx.close()


def save(name: str, data: bytes) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    path.write_bytes(data)
    return path


# -- the scene: a dead provider, a capped budget, a tool loop, a restarted process, a FATAL one, an idle one -----

def scene_config(local: FakeServer, cloud: FakeServer) -> str:
    return daemon_config(
        breaker={"failures": 1, "recovery_s": 900}, health={"probe_interval_s": 0.5},
        budget={"global_monthly_usd": 50}, models={"memory_budget_mb": 1000},
        providers={
            **spending(local, cloud),
            # Spent past its cap (seeded in the ledger): blocked for the rest of the month.
            "capped": anthropic_at(cloud.url, model="claude-opus-5", paid=True, monthly_budget_usd=1,
                                   cost={"input": 15.0, "output": 75.0}),
            # Nothing listens on its port.
            "dead": openai_at(f"http://127.0.0.1:{dead_port()}", model="gone"),
            "box": managed_backend(free_port(), stop_timeout_s=2, startsecs=0.2, memory_mb=400),
            # Exits at start with code 3 and no restart left: FATAL.
            "broken": managed_backend(free_port(), "--exit-at-start", "3", startsecs=0.5, max_restarts=0),
            # On demand and never asked for: stopped, as on-demand setups rest (no profile routes to it).
            "lazy": managed_backend(free_port(), start="on_demand", memory_mb=100, stop_timeout_s=2)},
        profiles={"default": warn("dead", "local"), "cloud": warn("capped", "cloud"), "deadonly": warn("dead"),
                  "loop": {"providers": ["local"], "tool_loop": {"action": "break", "threshold": 3, "window": 5}}})


class Scene(Dashboard):
    def tool_loop(self, request_id: str) -> httpx.Response:
        """A request whose agent called the same tool with the same input three times: the guard stops it."""
        msgs: list[dict] = [{"role": "user", "content": "list the files"}]
        for i in range(3):
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd": "ls"}'}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "a.txt"})
        return httpx.post(self.daemon.url + "/v1/chat/completions", timeout=20,
                          headers={"x-coderouter-profile": "loop", "x-request-id": request_id},
                          json={"model": "m", "messages": msgs})


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    from coderouterd.guards.budget import GLOBAL, NAMESPACE, month_bounds
    from coderouterd.state import Store

    tmp = tmp_path_factory.mktemp("scene")
    local = FakeServer("openai", name="local", models=["qwen3-coder"]).start()
    cloud = FakeServer("anthropic", name="cloud").start()
    d = DaemonProcess(scene_config(local, cloud), tmp)
    now = time.time()
    spent = seed_history(d.state_dir, now)
    month, _start, _end = month_bounds(now)
    store = Store(d.state_dir / "state.db")
    store.open()
    store.set(NAMESPACE, f"{month}:capped", 1.5)
    store.set(NAMESPACE, f"{month}:{GLOBAL}", spent + 1.5)
    store.close()
    d.start()
    s = Scene(d, local, cloud, [])
    try:
        yield s
    finally:
        _stop(s)


AXE = ROOT / "tests" / "clients" / "node_modules" / "axe-core" / "axe.min.js"


def axe_violations(page) -> list[dict]:
    """axe-core's serious and critical violations on the page as it is now (injected from tests/clients)."""
    if not AXE.is_file():
        pytest.skip("axe-core is not installed: `make test` installs it with npm ci in tests/clients")
    # Evaluated through the DevTools protocol, not as an inline <script>: the page's CSP (rightly) forbids those.
    page.evaluate(AXE.read_text() + "\n;undefined")
    assert page.evaluate("() => typeof axe.run") == "function"
    found = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations")
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "nodes": [n["target"] for n in v["nodes"]][:5]}
            for v in found if v["impact"] in ("serious", "critical")]
