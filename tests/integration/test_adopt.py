"""Adopting a server already on a managed process's port: only the configured command run by this user is
adopted; an impostor (another program, another user, or any listener under adopt = "never") is refused and the
process goes FATAL with a message naming the port's owner. Real listeners on free loopback ports."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coderouterd.supervise import ProcessState, http_ready
from tests.integration.test_supervise import Harness, free_port

# A listener that answers 200 to anything: what an impostor needs to pass the readiness probe.
IMPOSTOR = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
    "        self.wfile.write(b'{}')\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


@pytest.fixture
def h(tmp_path: Path):
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def impostor(h: Harness, port: int, **kw) -> subprocess.Popen:
    return h.popen([sys.executable, "-c", IMPOSTOR, str(port)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, start_new_session=True, **kw)


async def until_answers(port: int) -> None:
    deadline = time.monotonic() + 30  # a ceiling, not a measure
    while not await http_ready(f"http://127.0.0.1:{port}/api/tags", 0.5):
        assert time.monotonic() < deadline, "listener never answered"
        await asyncio.sleep(0.05)


def refused(h: Harness, port: int, command: list[str] | None = None, **spec_kw) -> str:
    """Start a supervised process whose port is already taken; returns its fatal reason."""
    async def scenario() -> str:
        await until_answers(port)
        sup = h.supervisor()
        spec = h.spec("llm", port, **spec_kw)
        if command is not None:
            spec.command = command
        mp = sup.add(spec)
        await sup.start_all()
        assert mp.state is ProcessState.FATAL and not mp.external and mp.pid is None
        snap = mp.snapshot()
        await sup.shutdown()
        return str(snap["fatal_reason"])

    return asyncio.run(scenario())


def test_another_program_on_the_port_is_not_adopted(h: Harness) -> None:
    port = free_port()
    other = impostor(h, port)
    reason = refused(h, port)
    assert f"pid {other.pid}" in reason and "not the configured command" in reason, reason
    assert "http.server" in reason  # the owner's command, as far as it is visible
    events = [e.event for e in h.events]
    assert events[0] == "fatal" and "started" not in events  # nothing spawned to fight it for the port
    assert other.poll() is None  # and nothing of someone else's is stopped


SYSTEM_PY = "/usr/bin/python3"  # runnable by any user, unlike a venv under /root


@pytest.mark.skipif(os.getuid() != 0 or not os.access(SYSTEM_PY, os.X_OK),
                    reason="starting a listener as another user needs root (and a python anyone can run)")
def test_another_users_listener_is_not_adopted_even_with_the_configured_command(h: Harness) -> None:
    port = free_port()
    command = [SYSTEM_PY, "-c", IMPOSTOR, str(port)]

    def as_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    # The very command the process is configured with, but run by another user.
    theirs = h.popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                     preexec_fn=as_nobody, cwd="/")
    reason = refused(h, port, command=command)
    assert f"pid {theirs.pid}" in reason and "uid 65534" in reason and "not root (uid 0)" in reason, reason


def test_adopt_never_refuses_even_the_configured_command(h: Harness) -> None:
    port = free_port()
    mine = h.backend(port)
    reason = refused(h, port, adopt="never")
    assert 'adopt = "never"' in reason and f"pid {mine.pid}" in reason, reason
    assert mine.poll() is None


def test_the_configured_command_through_a_wrapper_script_is_adopted(h: Harness, tmp_path: Path) -> None:
    """A command that is a script starting the real server: the listener's parent runs the configured command."""
    port = free_port()
    script = tmp_path / "run-server.sh"
    script.write_text(f"#!/bin/sh\n{sys.executable} -c \"$IMPOSTOR\" \"$1\"\n")
    script.chmod(0o755)
    command = [str(script), str(port)]
    h.popen(command, env={**os.environ, "IMPOSTOR": IMPOSTOR}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)

    async def scenario() -> None:
        await until_answers(port)
        sup = h.supervisor()
        mp = sup.add(h.spec("llm", port))
        mp.spec.command = command
        await sup.start_all()
        assert mp.state is ProcessState.READY and mp.external, mp.snapshot()
        await sup.shutdown()

    asyncio.run(scenario())
    [adopted] = [e for e in h.events if e.event == "adopted"]
    assert "runs the configured command" in adopted.detail
