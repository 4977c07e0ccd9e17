"""What a supervised process is: its spec, its states, its errors, and how readiness is judged."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# The audit vocabulary lives with the other recorded events; the supervisor is one of its producers.
from ..state.events import ProcessEventName

# on_event(process name, event, pid, detail); record(name, info | None); lookup(name) -> info | None.
# record and lookup may be plain functions or coroutine functions.
EventCallback = Callable[[str, ProcessEventName, int | None, str], Any]
RecordCallback = Callable[[str, dict[str, Any] | None], Any]
LookupCallback = Callable[[str], Any]

DEFAULT_BACKOFF: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
PROBE_TIMEOUT_S = 2.0


class SupervisorError(RuntimeError):
    pass


class ExternalProcessError(SupervisorError):
    """Stop/restart asked for a backend that coderouterd adopted by its URL and does not own."""


@dataclass
class ProcessSpec:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    ready_url: str | None = None
    autostart: bool = True
    stop_timeout_s: float = 10.0
    start_timeout_s: float = 120.0
    startsecs: float = 1.0
    max_restarts: int = 5
    restart_window_s: float = 300.0
    # Ready for this long, a process has proved itself: its next crash starts the back-off from the first
    # step again instead of counting every crash in the window. None: the longest back-off step.
    healthy_after_s: float | None = None
    # A server already answering ready_url at start: "verify" adopts it only when it runs this command as this
    # user (supervise/adopt.py), "never" refuses it.
    adopt: str = "verify"

    def __post_init__(self) -> None:
        # The name becomes a log file name and a store key.
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"process name {self.name!r} is not usable as a file name")
        # A string would be split by nobody and run by nothing: commands are argv, never a shell line.
        if isinstance(self.command, str) or not self.command:
            raise ValueError(f"process {self.name!r}: command must be a non-empty argv list")
        if not all(isinstance(arg, str) for arg in self.command):
            raise ValueError(f"process {self.name!r}: every command argument must be a string")
        self.command = list(self.command)
        self.env = {str(k): str(v) for k, v in self.env.items()}


class ProcessState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    FATAL = "fatal"


# The only moves the supervisor makes; anything else is a bug in it and fails loudly (IllegalTransition) rather
# than leaving a process in a state nobody planned for. Moves into STOPPING come from a stop, a restart or a
# start timeout; out of STOPPING to STOPPED (stop), a new start (restart) or a failure (start timeout).
TRANSITIONS: dict[ProcessState, frozenset[ProcessState]] = {
    ProcessState.STOPPED: frozenset({ProcessState.STARTING, ProcessState.READY, ProcessState.FATAL}),
    ProcessState.STARTING: frozenset({ProcessState.READY, ProcessState.STOPPING, ProcessState.BACKOFF,
                                      ProcessState.FATAL}),
    ProcessState.READY: frozenset({ProcessState.STOPPING, ProcessState.BACKOFF, ProcessState.FATAL}),
    ProcessState.BACKOFF: frozenset({ProcessState.STARTING, ProcessState.READY, ProcessState.FATAL,
                                     ProcessState.STOPPED}),
    # A start from FATAL whose command still cannot run lands in FATAL again.
    ProcessState.FATAL: frozenset({ProcessState.STARTING, ProcessState.READY, ProcessState.FATAL,
                                   ProcessState.STOPPED}),
    ProcessState.STOPPING: frozenset({ProcessState.STOPPED, ProcessState.STARTING, ProcessState.READY,
                                      ProcessState.BACKOFF, ProcessState.FATAL}),
}


class IllegalTransition(SupervisorError):
    """The supervisor tried a move its transition table does not allow."""


_ssl_context: ssl.SSLContext | None = None


async def http_ready(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True if GET url answers 2xx. A bare request on a fresh connection: probes run a few times
    per start, and a client library's pool would only keep sockets to a server that may vanish."""
    global _ssl_context
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    ctx = None
    if parts.scheme == "https":
        _ssl_context = _ssl_context or ssl.create_default_context()
        ctx = _ssl_context
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rpartition("@")[2]
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\nConnection: close\r\n\r\n".encode()
    try:
        port = parts.port or (443 if ctx else 80)
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(parts.hostname, port, ssl=ctx)
            try:
                writer.write(request)
                await writer.drain()
                status = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError, ValueError):
        return False
    fields = status.split(None, 2)
    return len(fields) >= 2 and fields[0].startswith(b"HTTP/") and fields[1][:1] == b"2"


def describe_spawn_error(program: str, exc: OSError, cwd: str | None) -> str:
    """Why a command could not be started, in the words that point at the fix: exec() of a directory fails with
    EACCES, whose "Permission denied" would send the user to chmod instead."""
    path = program if os.path.isabs(program) or os.sep not in program else os.path.join(cwd or os.getcwd(), program)
    if os.sep in program and os.path.isdir(path):
        return f"cannot execute {program!r}: it is a directory, not a program"
    return f"cannot execute {program!r}: {exc.strerror or exc}"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exited (code unknown: not our child)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
