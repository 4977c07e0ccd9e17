"""One supervised child process as an explicit state machine.

Every transition happens inside a single actor task that reads commands (start/stop/restart from
callers) and observations (exited/ready/timeout from helper tasks) from one queue. Callers never
touch the process themselves, so no interleaving of two callers can spawn a second copy, and a
helper's word about a process instance that has since been replaced is recognised as stale by
its generation number and dropped.

    STOPPED --start--> STARTING --ready--> READY
       ^                  |  exit/timeout    | exit
       |                  v                  v
       +----stop---- BACKOFF <-----------(restart budget left)   else FATAL (until restart())
    STOPPING is held while a tree is being terminated.

READY is reached only when the listener on ready_url's port belongs to the tree we started: anyone else there
(another user who bound the port before our child did) is refused as an impostor, and the start ends FATAL. The
sockets that check saw the tree hold are kept while READY (`verified()`): the providers' connections go there only.

This module is the state machine and nothing else: what it does to the operating system is instance.py's, what it
watches for is probe.py's, and how many restarts a crash loop gets is restarts.py's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import shlex
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ..providers.pinning import NOT_READY, Verified
from . import adopt, instance, memory, probe, tree
from .logs import DEFAULT_KEEP, DEFAULT_MAX_BYTES, RotatingLog
from .restarts import RestartBudget
from .spec import (
    DEFAULT_BACKOFF,
    TRANSITIONS,
    EventCallback,
    ExternalProcessError,
    IllegalTransition,
    LookupCallback,
    ProcessEventName,
    ProcessSpec,
    ProcessState,
    RecordCallback,
    SupervisorError,
    describe_exit,
    describe_spawn_error,
    http_ready,
)

log = logging.getLogger("coderouterd.supervise")
# Events logged at debug level only (they change no state a reader of the log needs).
_ROUTINE_EVENTS = frozenset({ProcessEventName.RESTART_SKIPPED})

# A before_stop hook (saving llama-server slots) gets this long before the tree is terminated anyway.
BEFORE_STOP_TIMEOUT_S = 60.0

# `async before_stop(process_name, reason)`: awaited before a planned stop (stop, restart, close) of a READY
# process, never after a crash. Reasons: "manual", "restart", "shutdown", "reload", "idle", "room for X".
BeforeStopCallback = Callable[[str, str], Awaitable[None]]


class ProcessOptions(TypedDict, total=False):
    """ManagedProcess's keywords beyond its spec and log directory, as the Supervisor passes them on to every
    process it makes (`**options: Unpack[ProcessOptions]`); the defaults are ManagedProcess's."""

    on_event: EventCallback | None
    record: RecordCallback | None
    lookup: LookupCallback | None
    backoff: Sequence[float]
    clock: Callable[[], float]
    log_max_bytes: int
    log_keep: int
    log_check_s: float
    before_stop: BeforeStopCallback | None
    before_stop_timeout_s: float


@dataclass
class _Msg:
    kind: str
    gen: int = 0
    value: Any = None
    reply: asyncio.Future[Any] | None = None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class ManagedProcess:
    def __init__(
        self,
        spec: ProcessSpec,
        *,
        log_dir: Path,
        on_event: EventCallback | None = None,
        record: RecordCallback | None = None,
        lookup: LookupCallback | None = None,
        backoff: Sequence[float] = DEFAULT_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        log_keep: int = DEFAULT_KEEP,
        log_check_s: float = 2.0,
        before_stop: BeforeStopCallback | None = None,
        before_stop_timeout_s: float = BEFORE_STOP_TIMEOUT_S,
    ) -> None:
        self._restarts = RestartBudget(spec, backoff, clock)  # first: an empty backoff is refused before anything
        self.spec = spec
        self.log = RotatingLog(Path(log_dir) / f"{spec.name}.log", max_bytes=log_max_bytes, keep=log_keep)
        self._on_event = on_event
        self._record = record
        self._lookup = lookup
        self._clock = clock
        self._log_check_s = log_check_s
        self._before_stop = before_stop
        self._before_stop_timeout_s = before_stop_timeout_s

        self.state = ProcessState.STOPPED
        self.pid: int | None = None
        self.external = False  # found answering on ready_url; not ours, pid unknown
        self.adopted = False  # spawned by a previous daemon; ours, watched by pid
        self.restarts_total = 0
        self.last_exit_code: int | None = None
        self.started_at: float | None = None  # wall clock, for people
        self.fatal_reason: str | None = None
        self.last_stop_reason: str | None = None  # manual, idle, room for X, reload, crash...

        self._ctime: float | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._verified = NOT_READY  # what the current instance's READY check saw it hold; reset on leaving READY
        self._started_mono: float | None = None
        self._ready_mono: float | None = None  # when the current instance became READY (spawned or adopted)
        self._gen = 0
        self._inbox: asyncio.Queue[_Msg] | None = None
        self._changed: asyncio.Event | None = None
        self._actor: asyncio.Task[None] | None = None
        self._helpers: set[asyncio.Task[Any]] = set()
        self._rotation: asyncio.Task[Any] | None = None
        self._closed = False
        self._meter = tree.UsageMeter()

    @property
    def name(self) -> str:
        return self.spec.name

    # ---- public API: every call is a message to the actor -------------------------------------

    async def start(self) -> None:
        """Adopt a running backend or spawn one; returns once it is STARTING (or READY if adopted)."""
        await self._call("start")

    async def adopt(self) -> bool:
        """Adopt a server a previous coderouterd left running (its recorded pid, still the same process, serving
        as the configured command), without starting anything: True when it is READY as ours. A recorded one that
        cannot be adopted is stopped. For every process at the daemon's start, on demand or not: a survivor
        holds memory whether or not anything asked for it (issue 43, D2)."""
        if self._lookup is None or not await _maybe_await(self._lookup(self.name)):
            return False  # nothing recorded: no actor is woken for a process nothing has asked for yet
        return bool(await self._call("adopt"))

    async def stop(self, reason: str = "manual") -> None:
        """Stop it (its whole tree). `reason` ("manual", "idle", "room for X", ...) is what the before_stop hook is
        told and what status shows as the last stop's."""
        await self._call("stop", reason)

    async def restart(self, reason: str = "") -> bool:
        """False (and a `restart_skipped` event) when a start or restart is already under way."""
        return bool(await self._call("restart", reason))

    async def close(self, reason: str = "shutdown") -> None:
        """Stop what we own (not external backends) and end the actor; the object is then inert."""
        if self._closed:
            return
        if self._actor is None or self._actor.done():
            self._closed = True
            self._wake_waiters()
            return
        await self._call("close", reason)

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for READY; False on timeout, if the process settles in STOPPED or FATAL, or once it is closed."""
        if self._closed:
            return False  # a closed object is inert: no actor is started again for it
        self._ensure_actor()

        async def until_settled() -> bool:
            while True:
                if self._closed:
                    return False
                if self.state is ProcessState.READY:
                    return True
                if self.state in (ProcessState.STOPPED, ProcessState.FATAL):
                    return False
                assert self._changed is not None
                await self._changed.wait()

        try:
            return await asyncio.wait_for(until_settled(), timeout)
        except TimeoutError:
            return False

    async def wait_started(self) -> bool:
        """Until the process leaves STOPPED or FATAL: started again, by hand or by a request (no time limit).
        False once this object is closed (a reload replaced or dropped it): it never starts again, so a waiter
        that stayed would wait for good."""
        if self._closed:
            return False
        self._ensure_actor()
        while self.state in (ProcessState.STOPPED, ProcessState.FATAL):
            if self._closed:
                return False
            assert self._changed is not None
            await self._changed.wait()
        return not self._closed

    def verified(self) -> Verified | None:
        """Where its providers may connect: the listening sockets the READY check of the running instance saw its
        tree hold (NOT_READY when it is not ready: nowhere). None without a ready_url: nothing was checked, and
        connections are not pinned."""
        return self._verified if self.spec.ready_url else None

    def snapshot(self) -> dict[str, Any]:
        rss, cpu = self._meter.measure(self.pid, self._ctime)
        now = self._clock()
        return {
            "name": self.name,
            "state": self.state.value,
            "pid": self.pid,
            "external": self.external,
            "adopted": self.adopted,
            "uptime_s": round(now - self._started_mono, 3) if self._started_mono is not None else None,
            "restarts_recent": self._restarts.recent(now),
            "restarts_total": self.restarts_total,
            "rss_bytes": rss,
            "cpu_percent": cpu,
            "last_exit_code": self.last_exit_code,
            "started_at": self.started_at,
            "log": str(self.log.path),
            "fatal_reason": self.fatal_reason,
            "last_stop_reason": self.last_stop_reason,
            "ready_url": self.spec.ready_url,
        }

    # ---- actor -------------------------------------------------------------------------------

    def _ensure_actor(self) -> None:
        if self._actor is not None and not self._actor.done():
            return
        if self._actor is not None and not self._actor.cancelled() and self._actor.exception():
            log.error("%s: supervisor actor died; starting a new one", self.name)
        self._inbox = asyncio.Queue()
        self._changed = asyncio.Event()
        self._actor = asyncio.get_running_loop().create_task(self._run(), name=f"supervise:{self.name}")

    async def _call(self, kind: str, value: Any = None) -> Any:
        if self._closed:
            raise SupervisorError(f"{self.name}: supervisor is shut down")
        self._ensure_actor()
        assert self._inbox is not None
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(_Msg(kind, value=value, reply=reply))
        return await reply

    def _post(self, kind: str, gen: int, value: Any = None) -> None:
        if self._inbox is not None:
            self._inbox.put_nowait(_Msg(kind, gen=gen, value=value))

    async def _run(self) -> None:
        assert self._inbox is not None
        loop = asyncio.get_running_loop()
        next_rotation = loop.time() + self._log_check_s
        while True:
            try:
                msg = await asyncio.wait_for(self._inbox.get(), max(0.0, next_rotation - loop.time()))
            except TimeoutError:
                msg = None
            if loop.time() >= next_rotation:
                self._check_rotation()
                next_rotation = loop.time() + self._log_check_s
            if msg is None:
                continue
            try:
                result = await self._handle(msg)
            except Exception as exc:
                if msg.reply is None:
                    log.exception("%s: error while handling %s", self.name, msg.kind)
                elif not msg.reply.done():
                    msg.reply.set_exception(exc)
            else:
                if msg.reply is not None and not msg.reply.done():
                    msg.reply.set_result(result)
            if msg.kind == "close":
                self._refuse_pending()
                return

    def _refuse_pending(self) -> None:
        """Callers that queued behind close() get an answer instead of waiting forever."""
        assert self._inbox is not None
        while not self._inbox.empty():
            msg = self._inbox.get_nowait()
            if msg.reply is not None and not msg.reply.done():
                msg.reply.set_exception(SupervisorError(f"{self.name}: supervisor is shut down"))

    async def _handle(self, msg: _Msg) -> Any:
        if msg.kind == "start":
            return await self._cmd_start()
        if msg.kind == "stop":
            return await self._cmd_stop(msg.value or "manual")
        if msg.kind == "restart":
            return await self._cmd_restart(msg.value or "")
        if msg.kind == "close":
            return await self._cmd_close(msg.value or "shutdown")
        if msg.kind == "adopt":
            return self.state is ProcessState.STOPPED and await self._adopt_leftover()
        if msg.gen != self._gen:
            return None  # news about a process instance that has already been replaced
        if msg.kind == "ready" and self.state is ProcessState.STARTING:
            self._set_state(ProcessState.READY, msg.value.verified)
            self._emit(ProcessEventName.READY, self.pid, f"after {self._clock() - (self._started_mono or 0):.1f}s")
        elif msg.kind == "impostor" and self.state is ProcessState.STARTING:
            await self._terminate()
            # Not a crash to retry: the port is someone else's, and a restart would race them again. FATAL until
            # the operator frees it (corectl start); the reason is audited with the fatal event.
            await self._go_fatal(f"refused as an impostor: {msg.value.reason}; ours was stopped")
        elif msg.kind == "exited" and self.state in (ProcessState.STARTING, ProcessState.READY):
            await self._on_exit(msg.value)
        elif msg.kind == "start_timeout" and self.state is ProcessState.STARTING:
            pid = self.pid
            await self._terminate()
            reason = f"pid {pid} not ready after {self.spec.start_timeout_s:g}s"
            self._emit(ProcessEventName.EXITED, pid, f"{reason}; stopped")
            await self._after_failure(reason)
        elif msg.kind == "backoff_done" and self.state is ProcessState.BACKOFF:
            await self._bring_up()
        return None

    # ---- commands ----------------------------------------------------------------------------

    async def _cmd_start(self) -> None:
        if self.state not in (ProcessState.STOPPED, ProcessState.FATAL):
            return
        self._reset_failures()
        await self._bring_up()

    async def _cmd_stop(self, reason: str = "manual") -> None:
        self._refuse_if_external("stop")
        if self.state is ProcessState.STOPPED:
            return
        self.last_stop_reason = reason
        pid = self.pid
        if self.state in (ProcessState.FATAL, ProcessState.BACKOFF):
            self._invalidate()
        else:
            await self._run_before_stop(reason)
            await self._terminate()
        self._reset_failures()
        self._set_state(ProcessState.STOPPED)
        # Said as planned, whatever the exit code: a server may exit 1 on a SIGTERM (or be killed after the
        # grace period), and the audit log must not read a swap or an idle stop as a crash (issue 43, D1).
        exit_desc = f"; {describe_exit(self.last_exit_code)}" if pid else ""
        self._emit(ProcessEventName.STOPPED, pid, f"planned stop, reason: {reason}{exit_desc}")

    async def _cmd_restart(self, reason: str) -> bool:
        self._refuse_if_external("restart")
        if self.state in (ProcessState.STARTING, ProcessState.STOPPING, ProcessState.BACKOFF):
            detail = f"{self.state.value}: a start or restart is already in progress"
            self._emit(ProcessEventName.RESTART_SKIPPED, self.pid, detail)
            return False
        self._emit(ProcessEventName.RESTARTING, self.pid, reason or "requested")
        if self.state is ProcessState.READY:
            await self._run_before_stop("restart")
            await self._terminate()
        self._reset_failures()
        self.restarts_total += 1
        await self._bring_up()
        return True

    async def _cmd_close(self, reason: str) -> None:
        self._closed = True
        if not self.external and self.state is not ProcessState.STOPPED:
            await self._cmd_stop(reason)
        self._invalidate()
        if self._rotation is not None:
            await asyncio.gather(self._rotation, return_exceptions=True)
        self._wake_waiters()  # closing from STOPPED changes no state, yet waiters must learn it is over

    def _refuse_if_external(self, action: str) -> None:
        if self.external:
            raise ExternalProcessError(
                f"{self.name}: cannot {action} a backend coderouterd did not start (it was already "
                f"answering on {self.spec.ready_url}); {action} it where it was started"
            )

    # ---- bringing a process up ---------------------------------------------------------------

    async def _bring_up(self) -> None:
        if await self._adopt_leftover():
            return
        url = self.spec.ready_url
        if url and await http_ready(url):
            # Someone else serves this backend; a second copy would only fight it for the port. It is served as
            # this process only when verified: anyone can bind the port first.
            verdict = await asyncio.to_thread(adopt.judge, url, self.spec.command, self.spec.cwd, self.spec.adopt)
            if not verdict.ok:
                await self._go_fatal(verdict.reason)
                return
            self._invalidate()
            self.external = True
            self._started_mono = self._clock()
            self.started_at = time.time()
            self._set_state(ProcessState.READY, verdict.verified)
            self._emit(ProcessEventName.ADOPTED, None, f"{url} already answers; not started by coderouterd; {verdict.reason}")
            return
        await self._spawn()

    async def _adopt_leftover(self) -> bool:
        """A child recorded by a previous daemon: adopt it if it serves, else stop it (tree)."""
        if self._lookup is None:
            return False
        try:
            rec = await _maybe_await(self._lookup(self.name))
        except Exception:
            log.warning("%s: lookup of a recorded process failed", self.name, exc_info=True)
            return False
        if not rec:
            return False
        pid, ctime = rec.get("pid"), rec.get("create_time")
        # Without a create_time a pid may name an unrelated process by now: never act on it.
        if isinstance(pid, int) and isinstance(ctime, int | float) and await asyncio.to_thread(tree.process_alive, pid, ctime):
            verdict = await instance.judge_leftover(self.spec, pid, float(ctime), rec.get("command"))
            if verdict.ok:
                self._invalidate()
                gen = self._gen
                self.pid, self._ctime, self._proc = pid, float(ctime), None
                self.adopted, self.external = True, False
                self._started_mono = self._clock()
                self.started_at = float(ctime)
                self._set_state(ProcessState.READY, verdict.verified)
                self._emit(ProcessEventName.ADOPTED, pid, "left running by a previous coderouterd; ready_url answers")
                self._helper(self._watch_pid(gen, pid, float(ctime)))
                return True
            log.warning("%s: stopping pid %s left by a previous coderouterd: %s", self.name, pid, verdict.reason)
            self._emit(ProcessEventName.STOPPED, pid, f"left by a previous coderouterd; {verdict.reason}; stopping it")
            await instance.stop(self.spec, pid, float(ctime), None)
        await self._persist(None)
        return False

    async def _spawn(self) -> None:
        self._invalidate()
        gen = self._gen
        argv = self.spec.command
        model = memory.model_path(argv, self.spec.cwd)
        if model is not None and not await asyncio.to_thread(model.is_file):
            # The server would start, fail to load and crash-loop for a minute: say so at once instead.
            await self._go_fatal(f"model file {str(model)!r} not found")
            return
        await asyncio.to_thread(self.log.append, f"starting: {shlex.join(argv)}")
        try:
            proc = await instance.spawn(self.spec, self.log)
        except OSError as exc:
            # A missing binary or a bad cwd will not fix itself; retrying only hides the message.
            await self._go_fatal(describe_spawn_error(argv[0], exc, self.spec.cwd))
            return
        self._proc, self.pid = proc, proc.pid
        self._ctime = tree.create_time(proc.pid)
        self.external = self.adopted = False
        self._started_mono = self._clock()
        self.started_at = time.time()
        # Recorded first: a daemon crash from here on leaves a child the next daemon can find.
        if self._ctime is not None:
            await self._persist({"pid": proc.pid, "create_time": self._ctime, "command": list(argv)})
        self._set_state(ProcessState.STARTING)
        self._emit(ProcessEventName.STARTED, proc.pid, shlex.join(argv))
        self._helper(self._watch_child(gen, proc))
        self._helper(self._watch_ready(gen, proc.pid, self._ctime))

    # ---- helpers: they only observe and post messages -----------------------------------------

    async def _watch_child(self, gen: int, proc: asyncio.subprocess.Process) -> None:
        self._post("exited", gen, await proc.wait())

    async def _watch_pid(self, gen: int, pid: int, ctime: float) -> None:
        await probe.until_gone(pid, ctime)
        self._post("exited", gen, None)

    async def _watch_ready(self, gen: int, pid: int, ctime: float | None) -> None:
        owner = await probe.until_ready(self.spec, pid, ctime)
        if owner is None:
            self._post("start_timeout", gen)
        else:
            self._post("ready" if owner.ok else "impostor", gen, owner)

    async def _backoff_timer(self, gen: int, delay: float) -> None:
        await asyncio.sleep(delay)
        self._post("backoff_done", gen)

    def _helper(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)

    def _invalidate(self) -> None:
        """Start a new generation: whatever the previous instance's helpers say is now ignored."""
        self._gen += 1
        for task in list(self._helpers):
            task.cancel()

    # ---- failures and stopping ---------------------------------------------------------------

    async def _on_exit(self, code: int | None) -> None:
        pid, ctime = self.pid, self._ctime
        self.last_exit_code = code
        self.last_stop_reason = "crash"
        # Ready for the healthy period before this exit: the crash is news, not part of a crash loop.
        if self._restarts.proved(self._ready_mono if self.state is ProcessState.READY else None):
            self._restarts.clear()
        self._invalidate()
        self._clear_instance()
        desc = describe_exit(code)
        # No instance runs from here on, and the state says so before the first await: the admin API (and
        # whoever waits there for the restart) must never read "ready" with no process behind it.
        announce = self._fail(f"pid {pid} {desc}")
        if pid is not None:  # whatever the server left running in its group must not keep holding the port
            await tree.kill_tree(pid, ctime=ctime, timeout=self.spec.stop_timeout_s)
        await asyncio.to_thread(self.log.append, f"pid {pid} {desc}")
        self._emit(ProcessEventName.EXITED, pid, desc)
        await self._persist(None)
        await announce()

    async def _after_failure(self, reason: str) -> None:
        await self._fail(reason)()

    def _fail(self, reason: str) -> Callable[[], Awaitable[None]]:
        """Move to BACKOFF, or to FATAL past the restart limit, at once; returns what then says so and (in
        BACKOFF) starts the timer for the next start."""
        now = self._clock()
        recent = self._restarts.recent(now)
        delay = self._restarts.take(now)
        if delay is None:
            fatal = f"{reason}; {recent} restarts within {self.spec.restart_window_s:g}s"
            self._enter_fatal(fatal)
            return lambda: self._announce_fatal(fatal)
        self.restarts_total += 1
        self._set_state(ProcessState.BACKOFF)
        gen = self._gen

        async def announce() -> None:
            self._emit(ProcessEventName.RESTARTING, None,
                       f"{reason}; restart {recent + 1}/{self.spec.max_restarts} in {delay:g}s")
            self._helper(self._backoff_timer(gen, delay))

        return announce

    async def _go_fatal(self, reason: str) -> None:
        self._enter_fatal(reason)
        await self._announce_fatal(reason)

    def _enter_fatal(self, reason: str) -> None:
        self._invalidate()
        self._clear_instance()
        self.fatal_reason = reason
        self._set_state(ProcessState.FATAL)

    async def _announce_fatal(self, reason: str) -> None:
        log.error("%s: fatal: %s", self.name, reason)
        await asyncio.to_thread(self.log.append, f"fatal: {reason}")
        self._emit(ProcessEventName.FATAL, None, reason)

    async def _run_before_stop(self, reason: str) -> None:
        """A planned stop of a serving process: the hook (saving its KV caches) runs first, bounded; whatever it
        does not finish in time is lost, and the process stops anyway. A crash never gets here."""
        if self._before_stop is None or self.state is not ProcessState.READY or self.external:
            return
        try:
            await asyncio.wait_for(self._before_stop(self.name, reason), self._before_stop_timeout_s)
        except TimeoutError:
            log.warning("%s: before-stop hook still running after %gs; stopping anyway", self.name,
                        self._before_stop_timeout_s)
        except Exception:
            log.exception("%s: before-stop hook failed; stopping anyway", self.name)

    async def _terminate(self) -> None:
        self._invalidate()
        self._set_state(ProcessState.STOPPING)
        pid, ctime, proc = self.pid, self._ctime, self._proc
        if pid is not None:
            self.last_exit_code = await instance.stop(self.spec, pid, ctime, proc)
            await asyncio.to_thread(self.log.append, f"stopped pid {pid} ({describe_exit(self.last_exit_code)})")
        self._clear_instance()
        await self._persist(None)

    def _clear_instance(self) -> None:
        self.pid = self._ctime = self._proc = self._started_mono = self._ready_mono = None
        self.external = self.adopted = False

    def _reset_failures(self) -> None:
        self._restarts.clear()
        self.fatal_reason = None

    # ---- small effects -----------------------------------------------------------------------

    def _set_state(self, state: ProcessState, verified: Verified | None = None) -> None:
        """`verified`: for READY, what the check that made it ready saw the tree hold (None: no check ran, which
        only happens without a ready_url). Any other state verifies nothing."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.name}: {self.state.value} -> {state.value} is not a move the supervisor "
                                    f"makes")
        if state is ProcessState.READY and self.state is not ProcessState.READY:
            self._ready_mono = self._clock()
        # Set before the state: whoever the READY wakes connects to what this instance was verified to hold.
        self._verified = (verified or NOT_READY) if state is ProcessState.READY else NOT_READY
        self.state = state
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Wake every wait_ready/wait_started: the state moved, or the object was closed."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _emit(self, event: ProcessEventName, pid: int | None, detail: str = "") -> None:
        # A skipped restart changes nothing: the crash or start that made it redundant was logged already.
        # No "pid=None": an event without a process (fatal, stopped, a restart not yet spawned) names none.
        log.log(logging.DEBUG if event in _ROUTINE_EVENTS else logging.INFO, "%s: %s%s %s", self.name, event,
                f" pid={pid}" if pid is not None else "", detail)
        if self._on_event is None:
            return
        try:
            self._on_event(self.name, event, pid, detail)
        except Exception:
            log.exception("%s: on_event callback failed for %s", self.name, event)

    async def _persist(self, info: dict[str, Any] | None) -> None:
        if self._record is None:
            return
        try:
            await _maybe_await(self._record(self.name, info))
        except Exception:
            # The store being unusable must not stop supervision; adoption after a crash is lost.
            log.warning("%s: could not record process info", self.name, exc_info=True)

    def _check_rotation(self) -> None:
        if self._rotation is not None and not self._rotation.done():
            return
        self._rotation = asyncio.get_running_loop().create_task(asyncio.to_thread(self.log.rotate_if_needed))
        self._rotation.add_done_callback(self._rotation_done)

    def _rotation_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: log rotation failed: %s", self.name, task.exception())
