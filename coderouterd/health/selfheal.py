"""Self-healing: when a managed backend crashes or turns UNHEALTHY, take it out of routing at once, restart
it (one restart at a time per process, whoever asks), then probe with back-off until it answers and let it
rejoin at its original place in every chain. Unmanaged providers may have a `restart_command`; otherwise
recovery is probe-only. Every step is an audit event.

Whether a process is up is not decided here: the supervisor's events move its providers' upstreams directly
(upstream/: supervise/from_config.Processes sends them), and self-healing reads that registry and calls `hold`
and `recovered` on the routing state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..routing.state import HEALTHY, UNHEALTHY, RoutingState
from ..state import ProcessEvent, RecoveryProbe
from ..state.events import ProcessEventName
from ..supervise.spec import ProcessState
from ..upstream.breaker import BreakerState
from ..upstream.lifecycle import Phase
from .process_news import UP as _UP
from .process_news import ProcessNews

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

    from ..runtime import Runtime
    from ..supervise.registry import Supervisor
    from .monitor import HealthMonitor

log = logging.getLogger("coderouterd.selfheal")

RESTART_COMMAND_TIMEOUT_S = 120.0

E = ProcessEventName
_ENDED = frozenset({E.EXITED, E.FATAL})
_NOT_COMING = frozenset({ProcessState.FATAL, ProcessState.STOPPED})  # gone on its own: recover it


class SelfHealer:
    """Receives the routing state (to take a provider out and bring it back, by named operations), the health
    monitor (for its probes), a getter for the supervisor (None until a process is configured; a reload may add
    one) and one for the live runtime."""

    def __init__(self, state: RoutingState, monitor: HealthMonitor, *, supervisor: Callable[[], Supervisor | None],
                 runtime: Callable[[], Runtime], publish: Callable[[ProcessEvent | RecoveryProbe], object] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 fresh_start: Callable[[list[str]], None] | None = None,
                 ready: Callable[[list[str]], None] | None = None) -> None:
        """`fresh_start(providers)`: a process was started anew (not adopted); whatever its predecessor held in
        memory (a KV cache) is gone. `ready(providers)`: a process answers (ready or adopted): what its server
        is and holds can be asked now."""
        self.state = state
        self.monitor = monitor
        self._supervisor = supervisor
        self._runtime = runtime
        self.publish = publish
        self.sleep = sleep
        self.news = ProcessNews(supervisor=supervisor, publish=publish, fresh_start=fresh_start, ready=ready)
        # provider -> the recovery task watching it; a second trigger while one runs is a logged no-op
        self._recovering: dict[str, asyncio.Task] = {}
        self.next_probe_at: dict[str, float] = {}
        state.watch_health(self._on_health)

    def start(self) -> None:
        """Watch the registry from now on; a process that went fatal before self-healing existed (an on-demand
        start in the daemon's first moments) is recovered like one that goes fatal later."""
        for up in self.state.upstreams:
            if up.phase is Phase.FATAL:
                self.trigger(up.name, f"process {up.life.process} fatal: {up.life.why}", restart=False)

    @property
    def supervisor(self) -> Supervisor | None:
        return self._supervisor()

    def _event(self, provider: str, process: str, event: ProcessEventName, pid: int | None = None, detail: str = "", *,
               primary: bool = True) -> None:
        if self.publish is not None:
            self.publish(ProcessEvent(provider=provider, process=process, event=event, pid=pid, detail=detail,
                                      primary=primary))

    # -- triggers -------------------------------------------------------------------------------------------

    def on_process_event(self, name: str, event: ProcessEventName, pid: int | None, detail: str) -> None:
        """Everything a process event says outside routing (the registry heard it first): `news`, then `react`."""
        self.news(name, event, pid, detail)
        self.react(name, event, detail)

    def react(self, name: str, event: ProcessEventName, detail: str) -> None:
        """Supervisor callback: a process that answers is probed now; one that ended is recovered."""
        providers = self.news.providers(name)
        if event in _UP:
            # Health restarts from this readiness: probed now, not at the next tick. A provider being
            # recovered is probed by its recovery as soon as it is ready.
            self.monitor.probe_soon([p for p in providers if p not in self._recovering])
        if event in _ENDED:
            for p in providers:
                self.trigger(p, f"process {name} {event}: {detail}", restart=False)

    def _on_health(self, provider: str, old: str, new: str) -> None:
        if new == UNHEALTHY and provider not in self._recovering:
            self.trigger(provider, "health became UNHEALTHY", restart=True)
        elif new == HEALTHY and not self.state.is_held(provider):
            # Real traffic proved it serves (or our own recovery just said so): nothing left to recover.
            task = self._recovering.get(provider)
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
                self._event(provider, self._process_name(provider), ProcessEventName.REJOINED, None,
                            "served a request")

    def trigger(self, provider: str, reason: str, *, restart: bool) -> bool:
        task = self._recovering.get(provider)
        if task is not None and not task.done():
            log.debug("recovery of %s already in progress; ignoring trigger (%s)", provider, reason)
            return False
        # Registered before the hold: holding publishes UNHEALTHY, and our own watcher must see this recovery.
        self._recovering[provider] = asyncio.ensure_future(self._recover(provider, reason, restart))
        # A process that exited was logged by the supervisor: the health change it causes is not a second line.
        self.state.hold(provider, reason, quiet=not restart)
        self._event(provider, self._process_name(provider), ProcessEventName.EXCLUDED, None, reason)
        return True

    @contextlib.asynccontextmanager
    async def hold(self, provider: str, reason: str) -> AsyncIterator[bool]:
        """Another part works on this provider's backend (drift's model reload). Yields False when a recovery is
        already running: the caller leaves the backend to it rather than fighting a restart."""
        if provider in self._recovering:
            yield False
            return
        log.info("self-healing: %s busy elsewhere (%s)", provider, reason)
        yield True

    def _process_name(self, provider: str) -> str:
        mp = self.supervisor.for_provider(provider) if self.supervisor else None
        return mp.spec.name if mp is not None else ""

    # -- recovery -------------------------------------------------------------------------------------------

    async def _recover(self, provider: str, reason: str, restart: bool) -> None:
        try:
            mp = self.supervisor.for_provider(provider) if self.supervisor else None
            if mp is not None:
                # The supervisor records the restart itself (one `restarting` event per restart, which the
                # restart counter counts): recording it here too would count it twice.
                if restart and not mp.external and not await mp.restart(reason):
                    log.debug("restart of %s skipped: one is already in progress", mp.spec.name)
                # The first probe waits for readiness: a server still loading its model is not dead.
                ready = await mp.wait_ready(mp.spec.start_timeout_s)
                while mp is not None and not ready and mp.state in _NOT_COMING:
                    # Fatal or stopped: it does not come back by itself, and a probe of its port would answer for
                    # whatever else listens there (an impostor it refused to adopt). Nothing is probed until its
                    # process is started again (`corectl start`/`restart`), then its own server is.
                    if not await mp.wait_started():
                        # Closed: a reload replaced it (follow the new one) or dropped it (probe the provider).
                        current = self.supervisor.for_provider(provider) if self.supervisor else None
                        mp = current if current is not mp else None
                        if mp is None:
                            break
                    ready = await mp.wait_ready(mp.spec.start_timeout_s)
            elif restart and self._runtime().providers[provider].cfg.restart_command:
                await self._run_restart_command(provider)
            else:
                # Probe-only recovery: give the backend the first back-off step before asking again.
                first = (list(self._runtime().config.health.recovery_backoff_s) or [30.0])[0]
                self.next_probe_at[provider] = time.time() + first
                await self.sleep(first)
            await self._probe_until_healthy(provider)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # recovery must never die silently
            log.exception("recovery of %s failed: %s", provider, e)
        finally:
            self._recovering.pop(provider, None)
            self.next_probe_at.pop(provider, None)
            # A recovery that ended without recovering (failed, cancelled) hands the provider back: a hold nobody
            # lifts would exclude it until a daemon restart. The health monitor probes it again like any other,
            # and it rejoins once it answers.
            self.state.unhold(provider)

    async def _probe_until_healthy(self, provider: str) -> None:
        backoff = list(self._runtime().config.health.recovery_backoff_s) or [30.0]
        attempt = 0
        while True:
            p = self._runtime().providers.get(provider)
            if p is None:  # removed by a reload
                self.state.unhold(provider)
                return
            ok, detail, _ = await self.monitor.probe(p)
            verified = False
            if ok and self.state.breakers.get(provider).state is not BreakerState.CLOSED:
                # Reachable is not the same as generating: a breaker that failed generations opened is closed
                # only by a real 1-token generation, and until one succeeds the recovery goes on.
                verified, gen_detail, _ = await self.monitor.generation_probe(p)
                ok, detail = verified, f"{detail}; {gen_detail}"
            attempt += 1
            wait = backoff[min(attempt - 1, len(backoff) - 1)]
            if self.publish is not None:
                self.publish(RecoveryProbe(provider=provider, ok=ok, attempt=attempt, next_in_s=None if ok else wait))
            if ok:
                self.state.recovered(provider, f"recovered after self-healing ({detail})",
                                     generation_verified=verified)
                self._event(provider, self._process_name(provider), ProcessEventName.REJOINED, None, detail)
                return
            self.next_probe_at[provider] = time.time() + wait
            await self.sleep(wait)

    async def _run_restart_command(self, provider: str) -> None:
        cmd = self._runtime().providers[provider].cfg.restart_command
        if not cmd:
            return
        self._event(provider, "", ProcessEventName.RESTARTING, None, "restart_command: " + " ".join(cmd))
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            try:
                await asyncio.wait_for(proc.wait(), RESTART_COMMAND_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                log.warning("restart_command for %s timed out", provider)
        except OSError as e:
            log.error("restart_command for %s failed: %s", provider, e)

    def snapshot(self) -> dict:
        return {p: {"recovering": True, "next_probe_at": self.next_probe_at.get(p)} for p in self._recovering}

    async def stop(self) -> None:
        tasks = list(self._recovering.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
