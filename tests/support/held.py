"""A turn held at a fake llama-server while a test kills the server under it (issue 44: a killed server's lane)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from tests.support.claude_sessions import Session
from tests.support.daemon import DaemonProcess
from tests.support.wait import wait_for


def held_turn(d: DaemonProcess, server_port: int | str, s: Session, *, stream: bool = False,
              at: str = "the server") -> Callable[[], httpx.Response]:
    """The session's next turn, sent in a thread and held at the fake llama-server on `server_port` (a server
    computing a long prompt) until the caller kills it: returned once the server has it, as a function that waits
    for the client's answer."""
    fake = f"http://127.0.0.1:{server_port}/_fake"
    httpx.post(fake + "/script", json={"behaviours": ["slow_first_byte;delay=600"]}, timeout=10)
    out: dict = {}

    def send() -> None:
        out["r"] = httpx.post(d.url + "/v1/messages", json={**s.main_body(), "stream": stream}, timeout=120,
                              headers={**s.headers, "anthropic-version": "2023-06-01"})

    t = threading.Thread(target=send, daemon=True)
    t.start()
    reached = wait_for(lambda: httpx.get(fake + "/stats", timeout=10).json()["queued"] == 0, 60)
    assert reached, f"the turn never reached {at}"

    def answer() -> httpx.Response:
        t.join(120)
        assert "r" in out, "no answer within 120 s"
        return out["r"]

    return answer
