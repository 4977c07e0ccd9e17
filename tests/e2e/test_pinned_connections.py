"""The gap N9's READY check left (issue 43): a managed llama-server bound to 127.0.0.1 only, its provider's
base_url naming `localhost` (127.0.0.1 and ::1). READY passes: nothing else listens on the port. Then someone binds
[::1] of the same port. The daemon's HTTP client resolves `localhost` to both and would connect to ::1 first, so
a victim's prompt would reach that listener. It must not: the provider's connections go only to the addresses the
READY check saw the server hold. The pool kept connections to 127.0.0.1 from before the bind, and the daemon never
opens more to this server than it has slots; a reload that gives the provider a new pool (its connect timeout
changed) makes every connection after the bind a new one, as llama-server's closing after each streamed answer
does in real use.

This machine's own resolver may give `localhost` 127.0.0.1 alone (then nothing reaches ::1 and the test could not
fail), so the daemon and its server run with tests/e2e/localhost_both/sitecustomize.py on their PYTHONPATH: it
resolves `localhost` as a machine whose /etc/hosts names both addresses does, ::1 first."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import ROOT, admin_get, free_port, running
from tests.support.wait import wait_for

SHIM = Path(__file__).parent / "localhost_both"

CONFIG = """
[server]
port = {PORT}
[providers.llama]
kind = "openai"
base_url = "http://localhost:@LP@/v1"
model = "coder"
[providers.llama.process]
command = @ARGV@
cwd = "@ROOT@"
ready_url = "http://localhost:@LP@/health"
stop_timeout_s = 2
startsecs = 0.1
[profiles.default]
providers = ["llama"]
health_action = "warn"
panic = false
[providers.llama.timeouts]
connect = @CONNECT@
"""


class Impostor(ThreadingHTTPServer):
    """Listens on [::1]:PORT, keeps whatever it is sent, and answers as an OpenAI server would."""

    address_family = socket.AF_INET6

    def __init__(self, port: int) -> None:
        self.received: list[str] = []
        super().__init__(("::1", port), _ImpostorHandler)


class _ImpostorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode(errors="replace") if length else ""
        server = self.server
        assert isinstance(server, Impostor)
        server.received.append(f"{self.command} {self.path} {body}")
        out = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "coder",
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": "the impostor's answer"}}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _ipv6_loopback() -> str | None:
    """Why [::1] cannot be bound here, or None when it can."""
    if not socket.has_ipv6:
        return "this Python has no IPv6"
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as e:
        return f"this machine has no IPv6 loopback ({e})"
    return None


def _config(tmp: Path, port: int, connect: float = 5.0) -> str:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.fakes --kind llamacpp \"$@\"\n")
    script.chmod(0o755)
    model = tmp / "coder.gguf"
    model.write_bytes(b"weights")
    argv = [str(script), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", "4"]
    return (CONFIG.replace("@LP@", str(port)).replace("@ARGV@", json.dumps(argv)).replace("@ROOT@", str(ROOT))
            .replace("@CONNECT@", str(connect)))


@pytest.mark.skipif(_ipv6_loopback() is not None, reason=str(_ipv6_loopback()))
def test_a_listener_bound_to_the_other_address_of_localhost_after_ready_never_gets_a_prompt(tmp_path):
    port = free_port()
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p)}
    with running(_config(tmp_path, port), tmp_path, env=env) as d:
        sock = d.state_dir / "coderouterd.sock"

        def ready() -> dict | None:
            proc = ((admin_get(sock, "/v1/processes") or {}).get("processes") or {}).get("llama") or {}
            return proc if proc.get("state") == "ready" else None

        before = wait_for(ready, 60)
        assert before, admin_get(sock, "/v1/processes")
        with Impostor(port) as impostor:
            threading.Thread(target=impostor.serve_forever, daemon=True).start()
            d.config_path.write_text(_config(tmp_path, port, connect=7.0).replace("{PORT}", str(d.port)))
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://coderouterd") as admin:
                reloaded = admin.post("/v1/reload", timeout=30).json()
            assert reloaded.get("ok") and reloaded.get("changed") == ["providers.llama"], reloaded

            def ask(i: int) -> httpx.Response:
                return httpx.post(d.url + "/v1/chat/completions", timeout=60, json={
                    "model": "coder", "stream": i % 2 == 1,
                    "messages": [{"role": "user", "content": f"the victim's secret prompt {i}"}]})

            # Several at once, twice: more connections than the pool kept from the probes before the bind.
            for _ in range(2):
                with ThreadPoolExecutor(6) as pool:
                    answers = list(pool.map(ask, range(6)))
                for r in answers:
                    assert r.status_code == 200, r.text
                    assert "impostor" not in r.text, r.text
            impostor.shutdown()
        assert impostor.received == [], impostor.received
        assert ready()["pid"] == before["pid"]  # the server verified at READY served them all, never restarted
