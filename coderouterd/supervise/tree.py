"""psutil helpers for process identity, tree termination and resource usage.

A pid alone is not an identity (pids are reused), so everything here that outlives one moment
takes the pair (pid, create_time). A process that is a zombie counts as gone: it runs no code,
holds no port, and in a container whose PID 1 does not reap, orphans may stay zombies forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import psutil

# create_time is derived from boot time + start ticks; the same process reads back the same float,
# a reused pid would have to be created within this window to be mistaken for the old one.
_CREATE_TIME_TOLERANCE_S = 0.05


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def _open(pid: int, ctime: float | None) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        if ctime is not None and abs(proc.create_time() - ctime) > _CREATE_TIME_TOLERANCE_S:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def is_gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ProcessLookupError):
        return True
    except psutil.AccessDenied:
        return False


def process_alive(pid: int, ctime: float | None) -> bool:
    """True if the process that had this pid at `ctime` still runs (not reused, not a zombie)."""
    proc = _open(pid, ctime)
    return proc is not None and not is_gone(proc)


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def _own_group(proc: psutil.Process) -> int | None:
    """The group to signal: only if `proc` leads its own group, and never the daemon's group."""
    try:
        pgid = os.getpgid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return None
    if pgid != proc.pid or pgid == os.getpgrp():
        return None
    return pgid


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def _killpg(pgid: int, ctime: float, sig: int) -> bool:
    """Signal the group; False when it was not signalled (its id now names another process's group)."""
    # A group id stays reserved while the group has members; once it is empty the id can name a
    # new process. Refuse if it now belongs to a different process that leads its own group.
    holder = _open(pgid, None)
    if holder is not None and _leads_group(pgid):
        try:
            reused = abs(holder.create_time() - ctime) > _CREATE_TIME_TOLERANCE_S
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            reused = False
        if reused:
            return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    return True


def _in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """Live members of a process group. Needed because a double-forked helper is reparented away
    from the tree, and because kill(-pgid, 0) also succeeds for a group of unreaped zombies."""
    if pgid == os.getpgrp():
        return []
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
            proc = psutil.Process(pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        if not is_gone(proc):
            members.append(proc)
    return members


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        # psutil refuses to signal a pid that now belongs to another process.
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            proc.send_signal(sig)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if not is_gone(p)]


async def _wait_gone(procs: list[psutil.Process], timeout: float, poll: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        alive = await asyncio.to_thread(_alive, procs)  # psutil reads /proc: never on the event loop
        if not alive or time.monotonic() >= deadline:
            return alive
        await asyncio.sleep(poll)


def _kill_rest(procs: list[psutil.Process], alive: list[psutil.Process], pgid: int | None,
               ctime: float | None) -> None:
    """SIGKILL what the grace period left, children forked during it included (blocking: reads /proc)."""
    for proc in alive:
        procs.extend(p for p in _descendants(proc) if p not in procs)
    if pgid is not None and ctime is not None:
        _killpg(pgid, ctime, signal.SIGKILL)
    _signal_all([p for p in procs if not is_gone(p)], signal.SIGKILL)


def _collect(pid: int, ctime: float | None) -> tuple[list[psutil.Process], int | None, float | None]:
    """Everything that belongs to the server: root, descendants and its group, found before any
    signal (once the root dies its children are reparented and unreachable from it)."""
    root = _open(pid, ctime)
    if root is not None and not is_gone(root):
        procs, pgid, ctime = [root, *_descendants(root)], _own_group(root), root.create_time()
    elif ctime is not None:
        # Root already gone: what it started in its own group (pgid == pid) may still run.
        procs, pgid = [], (pid if pid != os.getpgrp() else None)
    else:
        return [], None, None
    if pgid is not None:
        procs += [p for p in group_members(pgid) if p not in procs]
    return procs, pgid, ctime


def _term_once(procs: list[psutil.Process], pgid: int | None, ctime: float | None) -> None:
    """SIGTERM every process exactly once: the group's signal for its members (a double-forked helper included),
    a process's own for those outside the group (a descendant that called setsid). A second SIGTERM is not a
    firmer stop to every server: llama-server takes it for "stop now" ("Received second interrupt"), exits 1
    without finishing its shutdown, and sometimes aborts (SIGABRT, a core dump) -- a planned stop that looked
    like a crash (issue 43, D1)."""
    outside = [p for p in procs if pgid is None or not _in_group(p, pgid)]  # decided before any signal
    if pgid is None or ctime is None or not _killpg(pgid, ctime, signal.SIGTERM):
        outside = procs
    _signal_all(outside, signal.SIGTERM)


def members(pid: int, ctime: float | None) -> set[int]:
    """The pids of the server started as (pid, ctime): the process, its descendants and its group's members.
    Empty when it is gone. Blocking (reads /proc): call it in a thread."""
    procs, _, _ = _collect(pid, ctime)
    return {p.pid for p in procs if not is_gone(p)}


async def kill_tree(pid: int, *, timeout: float, ctime: float | None = None, poll: float = 0.05) -> list[int]:
    """SIGTERM the tree and its group once, wait up to `timeout`, then SIGKILL whatever is left.

    Descendants that left the group (setsid) are reached through the collected list; group
    members that left the tree (double fork) through the group. Returns pids still alive.
    """
    procs, pgid, ctime = await asyncio.to_thread(_collect, pid, ctime)
    if not procs:
        return []
    await asyncio.to_thread(_term_once, procs, pgid, ctime)
    alive = await _wait_gone(procs, timeout, poll)
    await asyncio.to_thread(_kill_rest, procs, alive, pgid, ctime)
    return [p.pid for p in await _wait_gone(procs, 2.0, poll)]


def kill_tree_now(pid: int, ctime: float | None = None) -> None:
    """SIGKILL a tree and its group at once; for last-resort cleanup where waiting is not possible."""
    procs, pgid, ctime = _collect(pid, ctime)
    if pgid is not None and ctime is not None:
        _killpg(pgid, ctime, signal.SIGKILL)
    _signal_all(procs, signal.SIGKILL)


class UsageMeter:
    """rss and cpu% summed over a process tree.

    psutil's cpu_percent() measures since the previous call on the same Process object, so the
    objects are kept between snapshots; model servers (ollama) do their work in child runners,
    which is why the whole tree is counted.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def measure(self, pid: int | None, ctime: float | None = None) -> tuple[int | None, float | None]:
        root = _open(pid, ctime) if pid is not None else None
        if root is None:
            self._procs.clear()
            return None, None
        current: dict[int, psutil.Process] = {}
        for proc in [root, *_descendants(root)]:
            kept = self._procs.get(proc.pid)
            current[proc.pid] = kept if kept is not None and kept == proc else proc
        self._procs = current
        rss, cpu = 0, 0.0
        for proc in current.values():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(None)
        return rss, round(cpu, 1)
