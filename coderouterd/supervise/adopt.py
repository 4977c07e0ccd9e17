"""Whether a server answering a managed process's ready_url is that process.

Anyone on the machine can bind a port before the daemon starts; adopting whatever answers would relay an
impostor's answers as the local model's. So a listener is adopted only when the process that owns the
listening socket (or one of its ancestors: a wrapper script that started the server) runs the configured
command, as the daemon's own user. The same holds after a start of ours (`serves_from_tree`): another user can
bind the port between the spawn and the moment our child binds it, and the readiness probe would take their
answer for our server's (issue 43, N9). Everything here is blocking (psutil reads /proc): call it in a thread.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from ..providers.pinning import Verified, is_local, plain
from . import tree

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
    # For ok after the listener check: the verified tree's listening sockets, where its providers' connections
    # are pinned (providers/pinning.py). None: no check ran (no ready_url).
    verified: Verified | None = None


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
                # The owner above is only the first listener this user can see. Every listener that could answer
                # `url` must be this process's tree: another user's on another address of the host name (::1
                # beside 127.0.0.1 for `localhost`) would be sent some of the prompts.
                whole = serves_from_tree(url, proc.pid, None, "the configured command")
                if not whole.ok:
                    return Verdict(False, whole.reason)
                return Verdict(True, f"pid {proc.pid} runs the configured command as {_user_name(me)}",
                               whole.verified)
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


_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def machine_addresses() -> frozenset[str]:
    return frozenset(plain(str(a.address)) for nics in psutil.net_if_addrs().values() for a in nics)


def resolve(host: str) -> set[str]:
    """The addresses `host` names (empty when it cannot be resolved)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {plain(str(info[4][0])) for info in infos}


def _local_addresses(host: str, mine: frozenset[str]) -> set[str] | None:
    """The addresses `host` names, when one of them is this machine's; None when none is (a server on another
    host: no local user can bind its port, and no local socket would show it)."""
    addrs = resolve(host)
    if not addrs:
        return set()  # unresolvable: nothing can have answered there; checked as local, so refused
    # A mapped address (::ffff:127.0.0.1) is its IPv4 one; the wildcard (0.0.0.0, ::) names this machine too:
    # connect() to it reaches a local listener, so it is never "another host" whose port nobody here can bind.
    if any(is_local(a, mine) for a in addrs):
        return addrs
    return None


def _listening() -> list[tuple[int | None, str, int]]:
    """(pid, address, port) of each listening TCP socket. On Linux every socket is listed, another user's with pid
    None; on macOS without root only this user's are seen."""
    found: list[tuple[int | None, str, Any]] = []  # (pid, status, laddr)
    try:
        found = [(c.pid, c.status, c.laddr) for c in psutil.net_connections(kind="tcp")]
    except psutil.AccessDenied:  # macOS without root: ask each of our own processes instead
        for proc in psutil.process_iter():
            try:
                found += [(proc.pid, c.status, c.laddr) for c in proc.net_connections(kind="tcp")]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return [(holder, plain(str(laddr.ip)), laddr.port) for holder, status, laddr in found
            if status == psutil.CONN_LISTEN and laddr]


def _port_listeners(port: int, addrs: set[str], listening: list[tuple[int | None, str, int]]
                    ) -> list[tuple[int | None, str]]:
    """(pid, address) of each listening TCP socket on `port` that would take a connection to one of `addrs`
    (bound to one of them, or to a wildcard)."""
    wanted = {plain(a) for a in addrs}
    anywhere = bool(wanted & _WILDCARDS)  # a connection to the wildcard address may reach any local listener
    return [(holder, ip) for holder, ip, p in listening
            if p == port and (anywhere or ip in _WILDCARDS or ip in wanted)]


def _owner_of(port: int, pid: int | None) -> Owner:
    if pid is None:
        uids = _socket_uids(port) if sys.platform.startswith("linux") else []
        return Owner(port, uid=next((u for u in uids if u != os.getuid()), uids[0] if uids else None))
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return Owner(port, pid, proc.uids().real, tuple(proc.cmdline()))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return Owner(port, pid)


def serves_from_tree(url: str, pid: int, ctime: float | None, who: str = "the server we started") -> Verdict:
    """At readiness: does the server we started as (pid, ctime) -- it, a descendant or a member of its group --
    hold every listener that could have answered `url`? Anything else on that port is an impostor, and its
    answers must never be taken for our server's."""
    port = url_port(url)
    host = urlsplit(url).hostname
    if port is None or not host:
        return Verdict(False, f"ready_url {url!r} names no usable host and port")
    mine = machine_addresses()
    addrs = _local_addresses(host, mine)
    listening = _listening()
    ours = tree.members(pid, ctime)
    # Where the providers of this server may connect from now on (providers/pinning.py): its tree's sockets. Taken
    # with the same listing the check reads, so nothing bound between the two can slip in.
    verified = Verified(frozenset((ip, p) for holder, ip, p in listening if holder in ours), mine)
    if addrs is None:
        return Verdict(True, f"{host} is not this machine: no local listener to check", verified)
    if not ours:
        return Verdict(False, f"port {port} answers, but {who} (pid {pid}) is gone")
    listeners = _port_listeners(port, addrs, listening)
    for holder, _ip in listeners:
        if holder not in ours:
            return Verdict(False, f"{_owner_of(port, holder).describe()}, not by {who} (pid {pid})")
    if not listeners:
        return Verdict(False, f"port {port} answers, but no listener on it belongs to {who} "
                              f"(pid {pid})")
    return Verdict(True, f"port {port} is held by {who} (pid {pid})", verified)
