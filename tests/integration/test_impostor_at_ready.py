"""The race of issue 43, N9: another process binds a managed server's port after the supervisor spawned its child
and before the child binds it, and answers the readiness probe. The supervisor must not take that answer for its
server's: the start is refused as an impostor (FATAL, naming the port's holder), our child is stopped, and the
impostor is left alone. Real processes: the child is the fake server held before its bind by --start-when, the
impostor a separate Python listener."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coderouterd.supervise import ProcessSpec, ProcessState
from tests.integration.test_adopt import IMPOSTOR, SYSTEM_PY, impostor, until_answers
from tests.integration.test_supervise import Harness, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def h(tmp_path: Path):
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def held_server(port: int, gate: Path) -> ProcessSpec:
    """A server that binds its port only once `gate` exists: the window of the race, held open by the test."""
    cmd = [sys.executable, "-m", "tests.fakes", "--kind", "openai", "--port", str(port), "--models", "m",
           "--start-when", str(gate)]
    return ProcessSpec(name="llm", command=cmd, cwd=str(ROOT), ready_url=f"http://127.0.0.1:{port}/v1/models",
                       stop_timeout_s=3.0, start_timeout_s=60.0, max_restarts=3)


def as_nobody() -> None:
    os.setgid(65534)
    os.setuid(65534)


def another_users_impostor(h: Harness, port: int) -> subprocess.Popen:
    return h.popen([SYSTEM_PY, "-c", IMPOSTOR, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   start_new_session=True, preexec_fn=as_nobody, cwd="/")


@pytest.mark.parametrize("who", [
    "another process",
    pytest.param("another user", marks=pytest.mark.skipif(
        os.getuid() != 0 or not os.access(SYSTEM_PY, os.X_OK),
        reason="starting a listener as another user needs root (and a python anyone can run)")),
])
def test_a_listener_that_took_the_port_after_our_spawn_is_refused_as_an_impostor(h: Harness, tmp_path: Path, who):
    port = free_port()
    gate = tmp_path / "bind-now"

    async def scenario() -> tuple[int, str, int]:
        sup = h.supervisor()
        mp = sup.add(held_server(port, gate))
        await sup.start_all()
        assert mp.state is ProcessState.STARTING and mp.pid is not None
        child = mp.pid
        h.track(child)
        # Binds the port our child has not bound yet, and answers every probe.
        other = impostor(h, port) if who == "another process" else another_users_impostor(h, port)
        await until_answers(port)
        assert not await mp.wait_ready(60)  # settles, and not in READY
        assert mp.state is ProcessState.FATAL and mp.pid is None, mp.snapshot()
        gate.touch()  # too late for the child either way: it must be gone already
        await wait_until(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie", 10,
                         "our child stopped")
        reason = str(mp.snapshot()["fatal_reason"])
        await sup.shutdown()
        return other.pid, reason, child

    other_pid, reason, child = asyncio.run(scenario())
    assert reason.startswith("refused as an impostor: "), reason
    assert f"port {port} is held by pid {other_pid}" in reason and "http.server" in reason, reason
    if who == "another user":
        assert "user nobody (uid 65534)" in reason or "uid 65534" in reason, reason
    assert f"not by the server we started (pid {child})" in reason, reason
    events = [e.event for e in h.events]
    assert "ready" not in events and "fatal" in events, h.events
    [fatal] = h.of("fatal")
    assert fatal.detail == reason  # what the audit log keeps (the daemon publishes each event there)
    assert psutil.pid_exists(other_pid)  # nothing of someone else's is stopped


def test_our_own_listener_deep_in_the_tree_is_ready(h: Harness, tmp_path: Path):
    """The control: the same held server, with nobody on its port, is ready once it binds; through a wrapper shell
    (the listener is a child of the process we started) as well."""
    port = free_port()
    gate = tmp_path / "bind-now"
    spec = held_server(port, gate)
    spec.command = ["/bin/sh", "-c", '"$@"', "sh", *spec.command]  # no exec: the listener is the shell's child

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(spec)
        await sup.start_all()
        h.track(mp.pid)
        gate.touch()
        assert await mp.wait_ready(60), mp.snapshot()
        h.track(mp.pid)
        await sup.shutdown()

    asyncio.run(scenario())
    assert [e.event for e in h.events] == ["started", "ready", "stopped"], h.events
