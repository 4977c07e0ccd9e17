"""Issue 23 item 7: a spent monthly budget, met by the real clients. Claude Code (`claude -p`) and Codex
(`codex exec`, its default retries left on) talk to a daemon whose only provider is paid and over its cap; each
must print the message naming the budget and exit at once after exactly one request (a retryable answer made
Claude Code retry for minutes, printing nothing). The upstream must never be called."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from coderouterd.state.store import Store
from tests.e2e.test_claude_code import CLAUDE
from tests.e2e.test_codex_cli import CODEX
from tests.fakes.runner import FakeServer
from tests.support.clients import skip_reason
from tests.support.daemon import DaemonProcess
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

CONFIG = """
[server]
port = {PORT}

[providers.paid]
kind = "openai"
base_url = "@URL@/v1"
model = "qwen3"
paid = true
cost = { input = 3.0, output = 15.0 }
monthly_budget_usd = 0.5

[profiles.default]
providers = ["paid"]
health_action = "warn"
"""


@pytest.fixture
def spent(tmp_path):
    reason = skip_reason(CLAUDE, "Claude Code") or skip_reason(CODEX, "Codex CLI")
    if reason:
        pytest.skip(reason)
    with FakeServer("openai", name="paid", models=["qwen3"]) as up:
        d = DaemonProcess(CONFIG.replace("@URL@", up.url), tmp_path)
        # This month's spend is already past the cap, as a daemon that spent it would have left it.
        store = Store(d.state_dir / "state.db")
        store.open()
        store.set("budget", time.strftime("%Y-%m:paid", time.gmtime()), 0.75)
        store.close()
        d.start()
        try:
            yield d, up
        finally:
            d.stop()


def _requests(d: DaemonProcess) -> float:
    return total(scrape(d), "coderouter_requests_total")


def _served(d: DaemonProcess, before: float) -> float:
    assert wait_for(lambda: _requests(d) - before >= 1, 30)  # the record is written just after the answer
    # The client has exited, so any retry it made was already answered; this pause only lets its record land.
    # A slower machine can only let a retry's record miss the count (a weaker check), never fail a good run.
    time.sleep(0.3)
    return _requests(d) - before


def _base_env(tmp) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "NO_COLOR": "1",
            "NO_PROXY": "127.0.0.1,localhost"}


def test_claude_code_shows_the_spent_budget_and_stops_at_once(spent, tmp_path):
    d, up = spent
    (tmp_path / "work").mkdir()
    env = {**_base_env(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"), "ANTHROPIC_BASE_URL": d.url,
           "ANTHROPIC_AUTH_TOKEN": "t", "ANTHROPIC_MODEL": "qwen3", "ANTHROPIC_SMALL_FAST_MODEL": "qwen3",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_ERROR_REPORTING": "1"}
    before = _requests(d)
    r = subprocess.run([str(CLAUDE), "-p", "say hi"], cwd=tmp_path / "work", env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "'paid' monthly budget is spent (0.75 of 0.50 USD); it resets " in out, out
    assert _served(d, before) == 1  # stopped at once: the client did not retry (its retries are not timed)
    assert [r for r in up.requests if r["method"] == "POST"] == []  # health probes (GET) aside


def test_codex_shows_the_spent_budget_and_stops_at_once(spent, tmp_path):
    d, up = spent
    home = tmp_path / "codex-home"
    home.mkdir()
    # The README's Codex setup with Codex's own retries left at their default (5): the answer must stop it.
    (home / "config.toml").write_text(f'''model = "qwen3"
model_provider = "coderouter"

[model_providers.coderouter]
name = "coderouter"
base_url = "{d.url}/v1"
wire_api = "responses"
env_key = "CODEROUTER_KEY"
''')
    (tmp_path / "work").mkdir()
    env = {**_base_env(tmp_path), "CODEX_HOME": str(home), "CODEROUTER_KEY": "k"}
    before = _requests(d)
    r = subprocess.run([str(CODEX), "exec", "--skip-git-repo-check", "say hi"], cwd=tmp_path / "work", env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "'paid' monthly budget is spent (0.75 of 0.50 USD); it resets " in out, out
    assert "Reconnecting" not in out, out
    assert _served(d, before) == 1  # stopped at once: the client did not retry (its retries are not timed)
    assert [r for r in up.requests if r["method"] == "POST"] == []  # health probes (GET) aside
