"""Supervision with real child processes: tests/support/fake_backend.py on free loopback ports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from coderouterd.supervise import (
    ExternalProcessError,
    ProcessSpec,
    ProcessState,
    RotatingLog,
    Supervisor,
    http_ready,
    kill_tree_now,
    process_alive,
)
from coderouterd.supervise.tree import is_gone

ROOT = Path(__file__).resolve().parents[2]
BACKEND = str(ROOT / "tests" / "support" / "fake_backend.py")
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Ev:
    t: float
    name: str
    event: str
    pid: int | None
    detail: str


class Harness:
    """Builds supervisors wired to an event log and a dict store, and kills by pid (tree and
    group) every process a test started, whatever the test's outcome."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.log_dir = tmp / "logs"
        self.events: list[Ev] = []
        self.store: dict[str, Any] = {}
        self.tracked: list[psutil.Process] = []
        self.popens: list[subprocess.Popen] = []

    # wiring
    def on_event(self, name: str, event: str, pid: int | None, detail: str) -> None:
        self.events.append(Ev(time.monotonic(), name, event, pid, detail))
        if pid is not None and event in ("started", "adopted"):
            self.track(pid)

    def record(self, name: str, info: dict | None) -> None:
        self.store[name] = info

    def lookup(self, name: str) -> dict | None:
        return self.store.get(name)

    def supervisor(self, **kw: Any) -> Supervisor:
        opts: dict[str, Any] = {
            "log_dir": self.log_dir,
            "on_event": self.on_event,
            "record": self.record,
            "lookup": self.lookup,
            "backoff": (0.05, 0.1),
        }
        opts.update(kw)
        return Supervisor(**opts)

    def spec(self, name: str, port: int, *flags: str, **kw: Any) -> ProcessSpec:
        opts: dict[str, Any] = {
            "ready_url": f"http://127.0.0.1:{port}/api/tags",
            "stop_timeout_s": 2.0,
            "start_timeout_s": 10.0,
            "startsecs": 0.2,
        }
        opts.update(kw)
        return ProcessSpec(name=name, command=[PY, BACKEND, "--port", str(port), *flags], **opts)

    # process bookkeeping
    def track(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            self.tracked.append(proc)
            self.tracked.extend(proc.children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        proc = subprocess.Popen(argv, **kw)
        self.popens.append(proc)
        self.track(proc.pid)
        return proc

    def backend(self, port: int, *flags: str) -> subprocess.Popen:
        """A backend started by 'the user', not by the supervisor."""
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        return self.popen([PY, BACKEND, "--port", str(port), *flags], start_new_session=True, **quiet)

    def read_pid_file(self, path: Path, timeout: float = 30.0) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} never written"
            time.sleep(0.01)
        data = json.loads(path.read_text())
        procs = [psutil.Process(p) for p in [data["pid"], *data["children"]]]
        self.tracked.extend(procs)
        return procs

    def cleanup(self) -> None:
        for proc in self.tracked:
            try:
                kill_tree_now(proc.pid, proc.create_time())
                proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        for popen in self.popens:
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    # queries
    def of(self, event: str, name: str | None = None) -> list[Ev]:
        return [e for e in self.events if e.event == event and (name is None or e.name == name)]

    async def wait_event(self, event: str, count: int = 1, timeout: float = 30.0) -> Ev:
        await wait_until(lambda: len(self.of(event)) >= count, timeout, f"event {event!r} x{count}")
        return self.of(event)[count - 1]


# Ceilings, not measures: what is waited for takes well under a second idle, and a wait that holds returns at once.
async def wait_until(pred, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
def h(tmp_path: Path):
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def all_gone(procs: list[psutil.Process]) -> bool:
    return all(is_gone(p) for p in procs)


# ---- start, readiness, stop ----------------------------------------------------------------------


def test_start_becomes_ready_serves_and_stops_with_sigterm(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(h.spec("b1", port), providers=["ollama-a", "ollama-b"])
        await sup.start_all()
        assert mp.state is ProcessState.STARTING
        assert await mp.wait_ready(30)
        assert await http_ready(f"http://127.0.0.1:{port}/v1/models")
        snap = sup.snapshot()["b1"]
        assert snap["state"] == "ready" and snap["pid"] == mp.pid and snap["external"] is False
        assert snap["providers"] == ["ollama-a", "ollama-b"]
        assert snap["rss_bytes"] > 1_000_000 and snap["cpu_percent"] is not None
        assert snap["uptime_s"] >= 0 and snap["restarts_total"] == 0
        assert h.store["b1"]["pid"] == mp.pid and h.store["b1"]["command"] == mp.spec.command
        pid = mp.pid
        # A well-behaved server goes on SIGTERM: its exit code says so (a grace wait would end in SIGKILL).
        await asyncio.wait_for(sup.shutdown(), 30)
        assert mp.state is ProcessState.STOPPED and mp.last_exit_code == -signal.SIGTERM
        assert not process_alive(pid, None)
        assert h.store["b1"] is None

    asyncio.run(scenario())
    assert [e.event for e in h.events] == ["started", "ready", "stopped"]


def test_without_ready_url_ready_after_startsecs(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        # startsecs an hour away: the server answers, yet it is not ready (an event to wait for, not a time).
        sup = h.supervisor()
        mp = sup.add(h.spec("b1", port, ready_url=None, startsecs=3600))
        await mp.start()
        deadline = time.monotonic() + 30
        while not await http_ready(f"http://127.0.0.1:{port}/api/tags"):
            assert time.monotonic() < deadline, "the server never answered"
            await asyncio.sleep(0.05)
        assert mp.state is ProcessState.STARTING and not await mp.wait_ready(0.05)
        await sup.shutdown()
        # A short one: ready once it has passed.
        sup = h.supervisor()
        mp = sup.add(h.spec("b2", port, ready_url=None, startsecs=0.3))
        await mp.start()
        assert mp.state is ProcessState.STARTING
        assert await mp.wait_ready(30)
        await sup.shutdown()

    asyncio.run(scenario())


def test_slow_start_is_not_declared_dead(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor()
        # The server binds 1.5 s after it starts; the start timeout (60 s) is far beyond that.
        mp = sup.add(h.spec("slow", port, "--start-delay", "1.5", start_timeout_s=60.0))
        asked.append(time.monotonic())
        await mp.start()
        pid = mp.pid
        assert await mp.wait_ready(60)
        assert mp.pid == pid and mp.restarts_total == 0
        await sup.shutdown()

    asked: list[float] = []
    asyncio.run(scenario())
    # Its 1.5 s of silence were waited through: one start, no exit, ready only after them. A lower bound (the
    # server cannot bind before it was asked to start plus its delay), which load can only lengthen: no window.
    assert not h.of("exited") and len(h.of("started")) == 1
    [ready] = h.of("ready")
    assert ready.t - asked[0] >= 1.5


def test_not_ready_within_start_timeout_is_killed_and_counted(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor()
        spec = h.spec("hung", port, "--start-delay", "100", start_timeout_s=0.4, max_restarts=0)
        mp = sup.add(spec)
        await mp.start()
        pid = mp.pid
        await h.wait_event("fatal")
        assert mp.state is ProcessState.FATAL and not process_alive(pid, None)
        assert "not ready after 0.4s" in (mp.fatal_reason or "")
        await sup.shutdown()

    asyncio.run(scenario())


def test_unexecutable_command_is_fatal_with_reason(h: Harness, caplog) -> None:
    caplog.set_level("INFO", logger="coderouterd.supervise")

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(ProcessSpec(name="nope", command=[str(h.tmp / "no-such-binary")]))
        await mp.start()
        assert mp.state is ProcessState.FATAL
        assert "cannot execute" in (mp.fatal_reason or "")
        assert not await mp.wait_ready(1)
        await sup.shutdown()

    asyncio.run(scenario())
    fatal = [r.getMessage() for r in caplog.records if ": fatal" in r.getMessage()]
    assert fatal and all("pid=None" not in m for m in fatal), fatal  # no process, so no pid is named


def test_a_command_that_is_a_directory_says_so(h: Harness) -> None:
    """exec() of a directory fails with EACCES: "Permission denied" would send the user to chmod (issue 34)."""
    (h.tmp / "llama.cpp").mkdir()

    async def scenario() -> list[str]:
        sup = h.supervisor()
        absolute = sup.add(ProcessSpec(name="abs", command=[str(h.tmp / "llama.cpp"), "--port", "1"]))
        relative = sup.add(ProcessSpec(name="rel", command=["./llama.cpp"], cwd=str(h.tmp)))
        await absolute.start()
        await relative.start()
        reasons = [absolute.fatal_reason or "", relative.fatal_reason or ""]
        await sup.shutdown()
        return reasons

    for reason in asyncio.run(scenario()):
        assert "is a directory" in reason and "Permission denied" not in reason, reason


# ---- crashes, restarts, FATAL --------------------------------------------------------------------


def test_crash_is_noticed_at_once_and_restarted(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(h.spec("b1", port))
        await mp.start()
        assert await mp.wait_ready(30)
        old = mp.pid
        os.kill(old, signal.SIGKILL)
        # Noticed by the child watcher (no poll): the ceiling only turns a missed exit into a failure.
        exited = await h.wait_event("exited", timeout=30)
        assert exited.pid == old and "SIGKILL" in exited.detail
        await h.wait_event("started", count=2)
        assert await mp.wait_ready(30)
        assert mp.pid != old and mp.last_exit_code == -signal.SIGKILL
        snap = mp.snapshot()
        assert snap["restarts_recent"] == 1 and snap["restarts_total"] == 1
        await sup.shutdown()

    asyncio.run(scenario())
    assert [e.event for e in h.events] == [
        "started", "ready", "exited", "restarting", "started", "ready", "stopped"]


def test_between_a_crash_and_its_restart_nobody_reads_ready_without_a_process(h: Harness) -> None:
    """What the admin API shows while the supervisor handles an exit (killing what the server left, writing
    its log, saving the record) says the process is gone: never "ready" with no pid, which a client waiting
    for the restart would take for the new instance."""
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor(backoff=(0.3,))
        mp = sup.add(h.spec("b1", port))
        await mp.start()
        assert await mp.wait_ready(30)
        seen: list[tuple[str, int | None]] = []
        watching = True

        async def watch() -> None:
            while watching:
                snap = mp.snapshot()
                seen.append((snap["state"], snap["pid"]))
                await asyncio.sleep(0)

        persist = mp._persist

        async def slow_persist(info):  # the record's write is a thread hop in the daemon: let the watcher look
            await asyncio.sleep(0.05)
            await persist(info)

        mp._persist = slow_persist
        watcher = asyncio.create_task(watch())
        old = mp.pid
        os.kill(old, signal.SIGKILL)
        await h.wait_event("restarting")
        watching = False
        await watcher
        assert ("backoff", None) in seen, seen[-5:]
        assert [s for s in seen if s[0] in ("ready", "starting") and s[1] is None] == []
        assert await mp.wait_ready(30) and mp.pid != old
        await sup.shutdown()

    asyncio.run(scenario())


def test_concurrent_restarts_make_exactly_one_new_process(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(h.spec("b1", port))
        await mp.start()
        assert await mp.wait_ready(30)
        old = mp.pid
        results = await asyncio.gather(*(mp.restart("health: unhealthy") for _ in range(5)))
        assert sorted(results) == [False, False, False, False, True]
        assert await mp.wait_ready(30)
        assert mp.pid != old and not process_alive(old, None)
        started = [e.pid for e in h.of("started")]
        assert len(started) == 2 and started[1] == mp.pid
        assert len(h.of("restart_skipped")) == 4
        await sup.shutdown()

    asyncio.run(scenario())


def test_crash_loop_goes_fatal_until_explicit_restart(h: Harness) -> None:
    port = free_port()
    flag = h.tmp / "broken"
    flag.write_text("")

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(h.spec("loop", port, "--fail-while-exists", str(flag), max_restarts=2))
        await mp.start()
        await h.wait_event("fatal")
        assert mp.state is ProcessState.FATAL and mp.pid is None
        assert "2 restarts within 300s" in (mp.fatal_reason or "")
        assert mp.last_exit_code == 3
        await asyncio.sleep(0.3)  # a late start would show here; load can only hide one (weaker), never fail a good run
        assert len(h.of("started")) == 3  # first start + max_restarts, then nothing more
        flag.unlink()
        assert await mp.restart("operator") is True
        assert await mp.wait_ready(30)
        snap = mp.snapshot()
        assert snap["fatal_reason"] is None and snap["restarts_recent"] == 0
        await sup.shutdown()

    asyncio.run(scenario())


def test_restart_window_forgets_old_crashes(h: Harness) -> None:
    port = free_port()
    now = [1000.0]

    async def scenario() -> None:
        sup = h.supervisor(clock=lambda: now[0])
        mp = sup.add(h.spec("b1", port, max_restarts=1, restart_window_s=60))
        await mp.start()
        assert await mp.wait_ready(30)
        os.kill(mp.pid, signal.SIGKILL)
        await h.wait_event("started", count=2)
        assert await mp.wait_ready(30)
        now[0] += 61  # the first crash leaves the window
        os.kill(mp.pid, signal.SIGKILL)
        await h.wait_event("started", count=3)
        assert await mp.wait_ready(30)
        os.kill(mp.pid, signal.SIGKILL)  # second crash inside the window: budget of 1 is spent
        await h.wait_event("fatal")
        assert mp.snapshot()["restarts_total"] == 2
        await sup.shutdown()

    asyncio.run(scenario())


# ---- stopping trees ------------------------------------------------------------------------------


async def started_tree(h: Harness, sup, name: str, port: int, pid_file: Path, flag: str):
    """A backend with a child in its group, one that left it and a double-forked one (--spawn-escapees), started
    and ready, with its stop grace at 0.5 s; and the processes of that tree, as the backend wrote them down."""
    mp = sup.add(h.spec(name, port, flag, "--spawn-escapees", "--pid-file", str(pid_file), stop_timeout_s=0.5))
    await mp.start()
    assert await mp.wait_ready(30)
    return mp, h.read_pid_file(pid_file)


def test_stop_kills_sigterm_ignoring_server_and_its_whole_tree(h: Harness) -> None:
    port = free_port()
    pid_file = h.tmp / "tree.json"

    async def scenario() -> None:
        sup = h.supervisor()
        mp, procs = await started_tree(h, sup, "stubborn", port, pid_file, "--ignore-sigterm")
        assert len(procs) == 4 and not any(is_gone(p) for p in procs)
        t0 = time.monotonic()
        await asyncio.wait_for(mp.stop(), 30)  # a ceiling against a hang, not a measure
        # SIGKILL came only after the grace (stop_timeout_s): a lower bound on the supervisor's own wait, which
        # load can only lengthen, so it cannot flake. No upper bound.
        assert time.monotonic() - t0 >= 0.5
        survivors = [p.pid for p in procs if not is_gone(p)]
        assert survivors == []
        assert mp.state is ProcessState.STOPPED and mp.last_exit_code == -signal.SIGKILL
        await sup.shutdown()

    asyncio.run(scenario())


def test_stop_reaches_descendants_that_outlive_a_server_dying_on_sigterm(h: Harness) -> None:
    # The server exits at once, its grandchildren do not: they must have been found before the
    # first signal, since a dead root no longer leads to them.
    port = free_port()
    pid_file = h.tmp / "tree.json"

    async def scenario() -> None:
        sup = h.supervisor()
        mp, procs = await started_tree(h, sup, "leaky", port, pid_file, "--children-ignore-sigterm")
        await mp.stop()
        assert [p.pid for p in procs if not is_gone(p)] == []
        assert mp.last_exit_code == -signal.SIGTERM

    asyncio.run(scenario())


def test_shutdown_leaves_no_orphans(h: Harness) -> None:
    ports = free_port(), free_port()
    files = h.tmp / "a.json", h.tmp / "b.json"

    async def scenario() -> None:
        sup = h.supervisor()
        a = sup.add(h.spec("a", ports[0], "--spawn-child", "--pid-file", str(files[0])))
        b = sup.add(h.spec("b", ports[1], "--spawn-escapees", "--pid-file", str(files[1])))
        sup.add(h.spec("manual", free_port(), autostart=False))
        await sup.start_all()
        assert await a.wait_ready(30) and await b.wait_ready(30)
        procs = h.read_pid_file(files[0]) + h.read_pid_file(files[1])
        assert len(procs) == 6
        await sup.shutdown()
        assert all_gone(procs)
        snap = sup.snapshot()
        assert {s["state"] for s in snap.values()} == {"stopped"}
        assert h.store == {"a": None, "b": None}
        with pytest.raises(RuntimeError, match="shut down"):
            await a.start()

    asyncio.run(scenario())


# ---- adoption ------------------------------------------------------------------------------------


def test_backend_already_running_is_adopted_not_duplicated(h: Harness) -> None:
    port = free_port()
    user = h.backend(port)

    async def scenario() -> None:
        deadline = time.monotonic() + 30
        while not await http_ready(f"http://127.0.0.1:{port}/api/tags", 0.5):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        sup = h.supervisor()
        mp = sup.add(h.spec("ext", port))
        await sup.start_all()
        assert mp.state is ProcessState.READY and mp.external and mp.pid is None
        with pytest.raises(ExternalProcessError, match="did not start"):
            await mp.stop()
        with pytest.raises(ExternalProcessError):
            await mp.restart("unhealthy")
        await sup.shutdown()

    asyncio.run(scenario())
    assert [e.event for e in h.events] == ["adopted"]
    assert user.poll() is None  # the user's server is not ours to stop


DAEMON = r"""
import asyncio, json, sys
from pathlib import Path
from coderouterd.supervise import ProcessSpec, Supervisor

store, log_dir, spec = Path(sys.argv[1]), Path(sys.argv[2]), ProcessSpec(**json.loads(sys.argv[3]))

def record(name, info):
    data = json.loads(store.read_text()) if store.exists() else {}
    data[name] = info
    store.write_text(json.dumps(data))

async def main():
    sup = Supervisor(log_dir=log_dir, record=record)
    mp = sup.add(spec)
    await sup.start_all()
    assert await mp.wait_ready(10)
    print("ready", mp.pid, flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


def test_child_of_a_crashed_daemon_is_adopted_then_supervised(h: Harness) -> None:
    port = free_port()
    spec = h.spec("b1", port)
    store = h.tmp / "kv.json"
    daemon = h.popen(
        [PY, "-c", DAEMON, str(store), str(h.log_dir), json.dumps(dataclasses.asdict(spec))],
        stdout=subprocess.PIPE, cwd=ROOT)
    assert select.select([daemon.stdout], [], [], 15)[0], "fake daemon never became ready"
    line = daemon.stdout.readline().split()
    daemon.stdout.close()
    assert line[0] == b"ready"
    child = int(line[1])
    h.track(child)
    daemon.kill()  # a crash: no shutdown, no cleanup
    daemon.wait(5)
    h.store.update(json.loads(store.read_text()))
    assert h.store["b1"]["pid"] == child

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(spec)
        await sup.start_all()
        assert mp.state is ProcessState.READY and mp.adopted and not mp.external and mp.pid == child
        assert not h.of("started")
        # Watched by polling psutil: its death is noticed and it is replaced by our own child.
        os.kill(child, signal.SIGKILL)
        exited = await h.wait_event("exited")
        assert exited.pid == child
        assert await mp.wait_ready(30)
        assert mp.pid != child and not mp.adopted
        await sup.shutdown()

    asyncio.run(scenario())
    assert [e.event for e in h.events][:2] == ["adopted", "exited"]


def test_recorded_leftover_that_does_not_serve_is_stopped_and_replaced(h: Harness) -> None:
    port = free_port()
    spec = h.spec("b1", port)
    leftover = h.popen(["sleep", "1000"], start_new_session=True)
    h.store["b1"] = {"pid": leftover.pid, "create_time": psutil.Process(leftover.pid).create_time(),
                     "command": spec.command}

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(spec)
        await sup.start_all()
        assert await mp.wait_ready(30)
        assert mp.pid != leftover.pid and not mp.adopted
        await sup.shutdown()

    asyncio.run(scenario())
    assert leftover.wait(2) == -signal.SIGTERM
    stopped = h.events[0]
    assert (stopped.event, stopped.pid) == ("stopped", leftover.pid) and "ready_url" in stopped.detail


def test_recorded_pid_now_owned_by_another_process_is_left_alone(h: Harness) -> None:
    port = free_port()
    spec = h.spec("b1", port)
    other = h.popen(["sleep", "1000"], start_new_session=True)
    real_ctime = psutil.Process(other.pid).create_time()
    h.store["b1"] = {"pid": other.pid, "create_time": real_ctime - 3600, "command": spec.command}

    async def scenario() -> None:
        sup = h.supervisor()
        mp = sup.add(spec)
        await sup.start_all()
        assert await mp.wait_ready(30)
        await sup.shutdown()

    asyncio.run(scenario())
    assert other.poll() is None
    assert [e.event for e in h.events] == ["started", "ready", "stopped"]


# ---- logs ----------------------------------------------------------------------------------------


def test_child_output_is_captured_and_rotated(h: Harness) -> None:
    port = free_port()

    async def scenario() -> None:
        sup = h.supervisor(log_max_bytes=10_000, log_keep=2, log_check_s=0.05)
        mp = sup.add(h.spec("chatty", port, "--spam-bytes", "30000"))
        await mp.start()
        assert await mp.wait_ready(30)
        first = mp.log.rotated_paths()[0]
        await wait_until(first.exists, 3, "rotation")
        text = first.read_text()
        assert "[coderouterd" in text and "starting:" in text
        assert "fake_backend stdout" in text and "fake_backend stderr" in text
        assert mp.snapshot()["log"] == str(h.log_dir / "chatty.log")
        await sup.shutdown()
        assert "stopped pid" in mp.log.path.read_text()

    asyncio.run(scenario())


def test_rotation_keeps_n_files_and_child_keeps_appending(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "logs" / "x.log", max_bytes=1000, keep=2)
    fd = log.open_for_child()  # what the child holds: it never reopens
    try:
        for i in range(4):
            os.write(fd, f"{i}".encode() * 1200)
            assert log.rotate_if_needed()
        os.write(fd, b"tail")
    finally:
        os.close(fd)
    assert not log.rotate_if_needed()
    assert (tmp_path / "logs").stat().st_mode & 0o777 == 0o700
    assert log.path.stat().st_mode & 0o777 == 0o600
    assert log.path.read_bytes() == b"tail"  # O_APPEND: writes land at the start after truncation
    one, two = log.rotated_paths()
    assert one.read_bytes() == b"3" * 1200 and two.read_bytes() == b"2" * 1200
    assert not (tmp_path / "logs" / "x.log.3").exists()


# ---- registry and spec ---------------------------------------------------------------------------


def test_registry_shares_one_process_between_providers(tmp_path: Path) -> None:
    sup = Supervisor(log_dir=tmp_path)
    spec = ProcessSpec(name="ollama", command=["ollama", "serve"])
    first = sup.add(spec, providers=["qwen"])
    assert sup.add(ProcessSpec(name="ollama", command=["ollama", "serve"]), providers=["llama"]) is first
    assert sup.for_provider("qwen") is sup.for_provider("llama") is sup.get("ollama")
    assert sup.for_provider("cloud") is None and sup.names() == ["ollama"]
    with pytest.raises(ValueError, match="different spec"):
        sup.add(ProcessSpec(name="ollama", command=["ollama", "serve", "--verbose"]))
    with pytest.raises(KeyError, match="unknown process"):
        sup.get("lmstudio")


def test_spec_rejects_shell_strings_and_bad_names() -> None:
    with pytest.raises(ValueError, match="argv list"):
        ProcessSpec(name="x", command="ollama serve")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="argv list"):
        ProcessSpec(name="x", command=[])
    with pytest.raises(ValueError, match="file name"):
        ProcessSpec(name="../x", command=["true"])


# ---- the before-stop hook (slots saved before a planned stop) ------------------------------------


def test_before_stop_runs_for_planned_stops_with_their_reason_and_never_for_a_crash(h: Harness) -> None:
    port = free_port()
    calls: list[tuple[str, str, bool]] = []

    async def before_stop(name: str, reason: str) -> None:
        # The process is still serving while the hook runs: that is the point of it.
        calls.append((name, reason, await http_ready(f"http://127.0.0.1:{port}/api/tags")))

    async def scenario() -> None:
        sup = h.supervisor(before_stop=before_stop)
        mp = sup.add(h.spec("b1", port))
        await mp.start()
        assert await mp.wait_ready(30)
        await mp.restart("corectl restart")
        assert await mp.wait_ready(30)
        os.kill(mp.pid, signal.SIGKILL)
        await h.wait_event("started", count=3)
        assert await mp.wait_ready(30)
        await mp.stop("idle")
        await mp.start()
        assert await mp.wait_ready(30)
        await mp.stop()
        await mp.start()
        assert await mp.wait_ready(30)
        await sup.remove("b1")  # a reload that dropped or changed it
        mp2 = sup.add(h.spec("b1", port))
        await mp2.start()
        assert await mp2.wait_ready(30)
        await sup.shutdown()

    asyncio.run(scenario())
    assert calls == [("b1", "restart", True), ("b1", "idle", True), ("b1", "manual", True),
                     ("b1", "reload", True), ("b1", "shutdown", True)]


def test_a_hook_that_overruns_its_time_does_not_hold_the_stop(h: Harness) -> None:
    port = free_port()
    released = asyncio.Event()

    async def before_stop(name: str, reason: str) -> None:
        await released.wait()  # never set: only the timeout ends it

    async def scenario() -> None:
        sup = h.supervisor(before_stop=before_stop, before_stop_timeout_s=0.2)
        mp = sup.add(h.spec("b1", port))
        await mp.start()
        assert await mp.wait_ready(30)
        await asyncio.wait_for(mp.stop("manual"), 30)
        assert mp.state is ProcessState.STOPPED
        await sup.shutdown()

    asyncio.run(scenario())
