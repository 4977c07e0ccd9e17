"""A planned stop signals a server once (issue 43, D1). llama-server takes a second SIGTERM for "stop now": it exits
1 after "Received second interrupt" (or aborts), and every swap used to look like a crash. The child here
(tests/support/interruptible.py) behaves the same, with worker processes in its group, and logs every SIGTERM each
process receives: each gets exactly one, the server exits 0, and the event says a planned stop, never an exit."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from coderouterd.supervise import ProcessSpec, ProcessState
from tests.integration.test_supervise import Harness, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def h(tmp_path: Path):
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def spec(port: int, log: Path, *, grace: float = 0.3, stop_timeout_s: float = 10.0, children: int = 2) -> ProcessSpec:
    return ProcessSpec(name="llm", command=[sys.executable, "-m", "tests.support.interruptible", "--port", str(port),
                                            "--log", str(log), "--grace", str(grace), "--children", str(children)],
                       cwd=str(ROOT), ready_url=f"http://127.0.0.1:{port}/health", stop_timeout_s=stop_timeout_s,
                       start_timeout_s=30.0)


def signals(log: Path) -> dict[str, list[str]]:
    """pid -> what it logged after it was up ("sigterm N", "exit CODE"), in order."""
    out: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        pid, _role, what = line.split(" ", 2)
        out.setdefault(pid, [])
        if what != "up":
            out[pid].append(what)
    return out


async def all_up(log: Path, count: int) -> None:
    """Every process counts its signals (a worker still importing would die of a SIGTERM without a word)."""
    await wait_until(lambda: log.exists() and log.read_text().count(" up\n") >= count, 30, f"{count} up")


@pytest.mark.parametrize("how", ["idle", "room for small", "manual", "restart", "shutdown"])
def test_every_planned_stop_signals_each_process_once_and_is_audited_as_planned(h: Harness, tmp_path: Path, how):
    port = free_port()
    log = tmp_path / "signals.log"

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(spec(port, log))
        await sup.start_all()
        assert await mp.wait_ready(60), mp.snapshot()
        h.track(mp.pid)
        await all_up(log, 3)
        if how == "restart":
            assert await mp.restart("corectl restart")
            assert await mp.wait_ready(60)
            h.track(mp.pid)
            await all_up(log, 6)
            await sup.shutdown()
        elif how == "shutdown":
            await sup.shutdown()
        else:
            await mp.stop(how)
            assert mp.state is ProcessState.STOPPED
            await sup.shutdown()
        # The server's own exit: the graceful one, not "second interrupt".
        assert mp.last_exit_code == 0, mp.snapshot()

    asyncio.run(scenario())
    seen = signals(log)
    # Every process of every instance (server and its two workers; two instances for a restart) took one SIGTERM
    # and exited 0 after its graceful shutdown.
    assert len(seen) == (6 if how == "restart" else 3), seen
    for pid, lines in seen.items():
        assert lines == ["sigterm 1", "exit 0"], (pid, lines)
    events = [e.event for e in h.events]
    assert "exited" not in events and "fatal" not in events, h.events  # nothing reads as a crash
    stopped = h.of("stopped")
    assert stopped, h.events
    reason = "shutdown" if how in ("restart", "shutdown") else how
    assert stopped[0].detail == f"planned stop, reason: {reason}; exited with code 0", stopped[0]


def test_a_server_that_outlives_the_grace_period_is_killed_once_and_the_stop_is_still_planned(h, tmp_path):
    port = free_port()
    log = tmp_path / "signals.log"

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(spec(port, log, grace=60, stop_timeout_s=0.5, children=0))
        await sup.start_all()
        assert await mp.wait_ready(60), mp.snapshot()
        h.track(mp.pid)
        await all_up(log, 1)
        await mp.stop("idle")
        assert mp.state is ProcessState.STOPPED and mp.last_exit_code == -9
        await sup.shutdown()

    asyncio.run(scenario())
    [(_pid, lines)] = signals(log).items()
    assert lines == ["sigterm 1"], lines  # one SIGTERM, then SIGKILL
    [stopped] = h.of("stopped")
    assert stopped.detail == "planned stop, reason: idle; killed by SIGKILL", stopped
    assert not h.of("exited")
