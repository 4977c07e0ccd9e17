"""Whether a server already answering a managed process's ready_url may be adopted as that process.

Anyone on the machine can bind a port before the daemon starts; adopting whatever answers would relay an
impostor's answers as the local model's. So a listener is adopted only when the process that owns the
listening socket (or one of its ancestors: a wrapper script that started the server) runs the configured
command, as the daemon's own user. Everything here is blocking (psutil reads /proc): call it in a thread.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

ADOPT_MODES = ("verify", "never")
_ANCESTORS = 4  # how far up from the listener a wrapper that started it is looked for


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds the port, as far as this user may know: a pid and command only for processes we can see."""

    port: int
    pid: int | None = None
    uid: int | None = None
    cmdline: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"pid {self.pid}" if self.pid is not None else "pid unknown (not visible to this user)"]
        parts.append(f"user {_user_name(self.uid)}" if self.uid is not None else "user unknown")
        if self.cmdline:
            parts.append(f"command {shlex.join(self.cmdline)[:300]}")
        return f"port {self.port} is held by " + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str  # for ok: what matched; else why not, naming the port's owner


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def url_port(url: str) -> int | None:
    parts = urlsplit(url)
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def _socket_uids(port: int) -> list[int]:
    """Linux: the uid owning each listening TCP socket on this port, from /proc/net/tcp{,6} (readable by anyone,
    unlike the pid behind a socket, which the kernel shows only to the socket's own user)."""
    uids: list[int] = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; field 7 is the uid
            if len(fields) > 7 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                uids.append(int(fields[7]))
    return uids


def _listener_pids(port: int) -> list[int]:
    """The pids holding a listening TCP socket on this port that this user may see."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS without root: ask each of our own processes instead
        pids = []
        for proc in psutil.process_iter():
            try:
                if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                       for c in proc.net_connections(kind="tcp")):
                    pids.append(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return pids
    return sorted({c.pid for c in conns
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid is not None})


def find_owner(port: int) -> Owner:
    """The port's listener: the first we can see, else what the kernel says about its user."""
    for pid in _listener_pids(port):
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                return Owner(port, pid, proc.uids().real, tuple(proc.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    uids = _socket_uids(port) if sys.platform.startswith("linux") else []
    return Owner(port, uid=uids[0] if uids else None)


def _resolve(program: str, cwd: str | None) -> str | None:
    """The real path of a program as the configured command names it (PATH lookup, relative to cwd)."""
    if os.sep in program:
        path = Path(cwd or ".", program) if not os.path.isabs(program) else Path(program)
        return os.path.realpath(path)
    found = shutil.which(program)
    return os.path.realpath(found) if found else None


def _runs(proc: psutil.Process, command: list[str], cwd: str | None) -> bool:
    """The process runs `command`: the same program (by real path) with the same arguments, directly or through
    an interpreter (`/bin/sh ./run-server.sh ARGS` for a configured `./run-server.sh ARGS`)."""
    try:
        cmdline = proc.cmdline()
        exe = proc.exe()
        pcwd = proc.cwd()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    want = _resolve(command[0], cwd)
    if want is None or not cmdline:
        return False
    args = command[1:]
    direct = {os.path.realpath(exe)} if exe else set()
    first = _resolve(cmdline[0], pcwd)
    if first:
        direct.add(first)
    if want in direct and cmdline[1:] == args:
        return True
    return len(cmdline) >= 2 and _resolve(cmdline[1], pcwd) == want and cmdline[2:] == args


def verify(url: str, command: list[str], cwd: str | None = None) -> Verdict:
    """May the server answering `url` be adopted as the process configured to run `command`?"""
    port = url_port(url)
    if port is None:
        return Verdict(False, f"ready_url {url!r} names no usable port")
    owner = find_owner(port)
    if owner.pid is None:
        who = owner.describe() if owner.uid is not None else (
            f"no process visible to this user listens on port {port} (another user's, or another host's)")
        return Verdict(False, who)
    me = os.getuid()
    if owner.uid != me:
        return Verdict(False, f"{owner.describe()}, not {_user_name(me)}")
    try:
        proc: psutil.Process | None = psutil.Process(owner.pid)
        for _ in range(_ANCESTORS + 1):
            if proc is None or proc.pid <= 1 or proc.uids().real != me:
                break
            if _runs(proc, command, cwd):
                return Verdict(True, f"pid {proc.pid} runs the configured command as {_user_name(me)}")
            proc = proc.parent()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return Verdict(False, f"{owner.describe()}, not the configured command {shlex.join(command)[:300]}")


def judge(url: str, command: list[str], cwd: str | None, mode: str) -> Verdict:
    """The adoption decision for a process configured with `adopt = mode`, with the message the operator sees
    (`corectl status`, `doctor`) when it is refused."""
    port = url_port(url)
    if mode == "never":
        owner = find_owner(port).describe() if port is not None else "its owner is unknown"
        return Verdict(False, f"{url} already answers and adopt = \"never\" ({owner}); not adopted and not "
                              f"started: free the port, then corectl restart")
    v = verify(url, command, cwd)
    if v.ok:
        return v
    return Verdict(False, f"{url} already answers but is not verified as this process: {v.reason}; not adopted "
                          f"and not started: stop it (or run exactly the configured command as this user), then "
                          f"corectl restart")
