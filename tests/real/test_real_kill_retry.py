"""A real llama-server killed -9 under a request (issue 44 section 2, "a killed server's lane"): coderouterd waits
for the supervisor's restart and sends the request again, once, and the fresh server's slot is first restored
from the lane's saved file, so the retry computes the turn's new tokens, not the conversation again (the QA saw
that turn reprocess 6.75x its new tokens). The request is non-streaming, so a kill at any moment before its end
is one the daemon can still retry; it is killed while the server computes it (its /slots says so)."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from tests.real.test_real_llama import CONFIG, MODEL
from tests.support.daemon import DaemonProcess, admin_get, free_port
from tests.support.real_llama import paths, server_argv
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(900)

SYSTEM = ("You are a careful assistant for a software team. Answer plainly and keep to the question. " * 12).strip()


def _config(port: int) -> str:
    p = paths()
    argv = server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], port, slots=2, ctx_per_slot=4096, extra=("--temp", "0"))
    return (CONFIG.replace("@LP@", str(port)).replace("@ARGV@", json.dumps(argv)).replace("@MODEL@", MODEL)
            .replace("@BIG@", "http://127.0.0.1:9") + "\n[affinity]\nsave_idle_after_s = 0.5\n")


def _warm(d: DaemonProcess) -> dict:
    st = admin_get(d.state_dir / "coderouterd.sock") or {}
    p = next(p for p in st.get("providers", []) if p["name"] == "llama")
    return ((p.get("cache") or {}).get("slots") or {}).get("warm") or {}


def test_a_request_whose_real_server_is_killed_under_it_is_retried_on_the_restart_with_its_lane_restored(tmp_path):
    port = free_port()
    d = DaemonProcess(_config(port), tmp_path)
    d.start()
    try:
        session = {"x-claude-code-session-id": "0b5e55ed-0000-4000-8000-0000000000a4",
                   "anthropic-version": "2023-06-01"}
        messages: list[dict] = []

        def turn(text: str, max_tokens: int) -> httpx.Response:
            messages.append({"role": "user", "content": text})
            r = httpx.post(d.url + "/v1/messages", headers=session, timeout=600,
                           json={"model": "claude-sonnet-5", "max_tokens": max_tokens, "system": SYSTEM,
                                 "messages": messages})
            assert r.status_code == 200, r.text
            messages.append({"role": "assistant", "content": r.json()["content"][0]["text"] or "ok"})
            return r

        def record(r: httpx.Response) -> dict:
            got = admin_get(d.state_dir / "coderouterd.sock", "/v1/requests/" + r.headers["x-request-id"])
            assert got is not None
            return got

        turn("Name three colours.", 16)
        second = record(turn("Now name three animals.", 16))
        before = second["usage"]["input_tokens"] + second["usage"]["cache_read_input_tokens"]
        # The pause a person takes to read the answer: the lane is saved in the background.
        assert wait_for(lambda: _warm(d).get("unsaved_lanes") == 0 and _warm(d).get("saves", 0) >= 1, 120), _warm(d)
        procs = admin_get(d.state_dir / "coderouterd.sock", "/v1/processes")["processes"]
        pid = (procs[0] if isinstance(procs, list) else next(iter(procs.values())))["pid"]
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", _try(turn)))
        t.start()

        def processing() -> bool:
            try:
                slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=5).json()
            except httpx.HTTPError:
                return False
            return any(s.get("is_processing") for s in slots)

        assert wait_for(processing, 120, step=0.01), "the server never computed the turn"
        os.kill(pid, signal.SIGKILL)
        t.join(600)
        r = out["r"]
        assert isinstance(r, httpx.Response), r
        attempts = r.headers["x-coderouter-attempts"].split(",")
        assert len(attempts) == 2 and attempts[1] == "llama:ok", attempts
        third = record(r)
        usage = third["usage"]
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        print(json.dumps({"before": before, "prompt": prompt, "usage": usage, "affinity": third["affinity"],
                          "warm": _warm(d)}))
        # The saved lane held the second turn's prompt and its answer: the retry reads at least that prompt from
        # the file (the template may end the match within the answer), and computes only what is new.
        assert usage["cache_read_input_tokens"] >= 0.9 * before, usage
        assert usage["input_tokens"] <= prompt - 0.9 * before, usage
        assert _warm(d)["restores"] >= 1, _warm(d)
    finally:
        d.stop()


def _try(turn) -> object:
    try:
        return turn("Write a long story about a lighthouse keeper and the sea, in many paragraphs.", 400)
    except AssertionError as e:  # the request failed: the test's assertion says how
        return e
