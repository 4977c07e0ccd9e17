"""The context window a server reports gates requests: with no context_window configured, a prompt larger
than the small llama-server's slot context goes to the next provider without touching the small one."""

from __future__ import annotations

import re

import httpx
import orjson

from corectl.render import context_cell
from tests.e2e.test_control_plane import corectl
from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config
from tests.support.daemon import DaemonProcess, admin_get, running
from tests.support.wait import wait_for


def providers_status(d: DaemonProcess) -> dict[str, dict]:
    r = corectl("status", "--json", socket=str(d.state_dir / "coderouterd.sock"))
    assert r.returncode == 0, r.stderr
    return {p["name"]: p for p in orjson.loads(r.stdout)["providers"]}


def wait_for_server_context(d: DaemonProcess, name: str) -> None:
    """Until the daemon has read the server's context window (polled over the admin socket from this process:
    a corectl per poll costs ~0.7 s of CPU)."""
    def window():
        status = admin_get(d.state_dir / "coderouterd.sock") or {"providers": []}
        return next((p.get("context_window") for p in status["providers"] if p["name"] == name), None)
    assert wait_for(window, 30), f"{name}'s context window never read"


def test_oversize_prompt_skips_the_small_server_before_trying_it(tmp_path):
    with FakeServer("llamacpp", name="small", n_ctx=1000, n_slots=1) as small, \
            FakeServer("llamacpp", name="big", n_ctx=100_000, n_slots=1) as big:
        cfg = daemon_config(providers={"small": small.url, "big": big.url},
                            profiles={"default": ["small", "big"], "solo": ["small"]})
        with running(cfg, tmp_path) as d:
            wait_for_server_context(d, "small")
            shown = providers_status(d)
            assert shown["small"]["context_window"] == 1000 and shown["small"]["configured_context_window"] is None
            assert shown["small"]["server"]["kind"] == "llama.cpp" and shown["big"]["context_window"] == 100_000

            small_prompt = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(d.url + "/v1/messages", json=small_prompt, timeout=20)
            assert r.headers["x-coderouter-provider"] == "small"
            before = small.count("/v1/chat/completions")

            big_prompt = {**small_prompt, "messages": [{"role": "user", "content": "x" * 20_000}]}
            r = httpx.post(d.url + "/v1/messages", json=big_prompt, timeout=20)
            assert r.status_code == 200, r.text
            assert r.headers["x-coderouter-provider"] == "big"
            assert "small:skipped:context" in r.headers["x-coderouter-attempts"]
            assert small.count("/v1/chat/completions") == before  # never tried

            assert context_cell(shown["small"]).plain == "1,000 srv"  # corectl status: the server's figure

            # Alone in its chain, the small server is still asked: its own refusal would carry the real numbers
            # (Claude Code compacts by them), where ours could only say "no provider" from an estimate.
            r = httpx.post(d.url + "/v1/messages", json=big_prompt, headers={"x-coderouter-profile": "solo"},
                           timeout=20)
            assert small.count("/v1/chat/completions") == before + 1
            err = r.json()["error"]
            assert r.status_code == 400 and err["type"] == "invalid_request_error"
            assert re.fullmatch(r"prompt is too long: \d+ tokens > 1000 maximum", err["message"]), err


# Forty tool schemas of ~1 KB each: ~10,000 tokens by the estimate, none of them by a template that never renders
# tool schemas (SmolLM2's does not; the fake server is told to do the same).
TOOLS = [{"name": f"tool_{i}", "description": "does one thing " * 60,
          "input_schema": {"type": "object", "properties": {"arg": {"type": "string", "description": "x" * 100}}}}
         for i in range(40)]


def test_the_servers_own_count_decides_not_the_estimate(tmp_path):
    """A prompt the estimate puts over the small server's window but its chat template renders small is served
    there (the server counted it: /apply-template + /tokenize); one over by the server's count still is not."""
    with FakeServer("llamacpp", name="small", n_ctx=4000, n_slots=1, apply_template=True,
                    tools_rendered=False) as small, \
            FakeServer("llamacpp", name="big", n_ctx=100_000, n_slots=1) as big:
        cfg = daemon_config(providers={"small": small.url, "big": big.url}, profiles={"default": ["small", "big"]})
        with running(cfg, tmp_path) as d:
            wait_for_server_context(d, "small")
            with_tools = {"model": "m", "max_tokens": 5, "tools": TOOLS,
                          "messages": [{"role": "user", "content": "list the files"}]}
            assert len(orjson.dumps(with_tools)) / 4 > 4000  # over the window by the estimate
            r = httpx.post(d.url + "/v1/messages", json=with_tools, timeout=20)
            assert r.status_code == 200, r.text
            assert r.headers["x-coderouter-provider"] == "small", r.headers["x-coderouter-attempts"]
            assert small.count("/apply-template") == 1 and small.count("/tokenize") == 1

            too_long = {**with_tools, "messages": [{"role": "user", "content": "y" * 20_000}]}
            before = small.count("/v1/chat/completions")
            r = httpx.post(d.url + "/v1/messages", json=too_long, timeout=20)
            assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "big"
            assert "small:skipped:context" in r.headers["x-coderouter-attempts"]
            assert small.count("/v1/chat/completions") == before  # by its own count, never tried
