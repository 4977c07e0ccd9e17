"""Provider health: active probes (periodic cheap reachability probes) feed the same count of consecutive failures
as real traffic (the provider's breaker keeps it; routing/state.py derives HEALTHY / DEGRADED / UNHEALTHY from
it), which the profiles' health_action acts on.

Also closes the adaptive-routing sampling gap: a fallback chain only sends traffic to its first provider, so
the others would have no latency figures; for adaptive profiles this task sends light probes (a 1-token
completion) to the providers the ProbeScheduler says are stale, never to paid ones unless allowed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
import orjson

from ..providers.limits import MAX_IGNORED_BYTES, read_at_most
from ..routing.state import DEGRADED, HEALTHY, UNHEALTHY, RoutingState, health_state
from ..tasks import TaskSet

if TYPE_CHECKING:
    from ..providers.provider import Provider
    from ..runtime import Runtime

log = logging.getLogger("coderouterd.health")

__all__ = ["DEGRADED", "HEALTHY", "UNHEALTHY", "HealthMonitor", "health_state", "probe_url"]

_PROBE_TIMEOUT_S = 5.0


def probe_url(provider: Provider) -> str:
    return provider.adapter.probe_url


class HealthMonitor:
    """Active health: periodic reachability probes, and the 1-token generation probes that keep adaptive
    figures fresh and are the only probe allowed to prove a failing backend generates again. A probe's result
    goes to the routing state, which counts it with real traffic's in the breaker: there is no count here."""

    def __init__(self, state: RoutingState, runtime: Callable[[], Runtime], *, tasks: TaskSet) -> None:
        self.state = state
        self._runtime = runtime
        self._tasks = tasks
        # Providers seen answering since this daemon started. One that never was is reported once as
        # unreachable, not as a HEALTHY -> DEGRADED transition it never made.
        self.seen_up: set[str] = set()
        self.reported_unreachable: set[str] = set()

    # -- probes ---------------------------------------------------------------------------------------------

    async def probe(self, provider: Provider) -> tuple[bool, str, float]:
        """One cheap reachability probe (the model list). Returns (ok, detail, seconds). It says a backend
        answers, never that it generates."""
        t0 = time.monotonic()
        headers = provider.adapter.headers()
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                async with provider.session().get(probe_url(provider), headers=headers) as r:
                    await read_at_most(r, MAX_IGNORED_BYTES)  # the status is the answer: never an endless body
                    # A redirect is no answer from this backend (it is not followed: upstream_session.py). Nor is a
                    # refused key: 401/403, or Google's 400 (API_KEY_INVALID) to a bare GET of its model list.
                    ok = r.status < 500 and r.status not in (400, 401, 403) and not 300 <= r.status < 400
                    detail = f"HTTP {r.status}"
        except aiohttp.ClientConnectorError as e:
            ok, detail = False, f"cannot connect: {e.os_error.strerror or e.os_error}"[:200]
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"[:200]
        return ok, detail, time.monotonic() - t0

    async def generation_probe(self, provider: Provider) -> tuple[bool, str, float]:
        """A real 1-token completion. Returns (ok, detail, seconds to the whole answer)."""
        cfg = provider.cfg
        t0 = time.monotonic()
        try:
            model = await provider.resolve_model("")
            headers = provider.adapter.headers(json=True)
            url, body = provider.adapter.ping_request(model)
            async with asyncio.timeout(min(cfg.timeouts.first_byte, 60.0)):
                async with provider.session().post(url, data=orjson.dumps(body), headers=headers) as r:
                    await read_at_most(r, MAX_IGNORED_BYTES)
                    ok, detail = r.status < 300, f"generation HTTP {r.status}"
        except Exception as e:  # a probe must never take the monitor down
            ok, detail = False, f"generation {type(e).__name__}: {e}"[:200]
        return ok, detail, time.monotonic() - t0

    async def probe_all(self) -> None:
        runtime = self._runtime()
        st = self.state
        # Managed processes that are not ready are the supervisor's and self-healing's business, not a probe's.
        await self._probe_names([n for n in runtime.providers if not st.is_held(n) and not st.is_down(n)])

    def probe_soon(self, names: list[str]) -> None:
        """Probe these now rather than at the next tick: a managed backend that just became ready (after our
        own restart, or its) must not wait up to probe_interval_s to be judged on fresh evidence."""
        self._tasks.spawn(self._probe_names([n for n in names if not self.state.is_held(n)]), name="probe-soon")

    async def _probe_names(self, names: list[str]) -> None:
        runtime = self._runtime()
        st = self.state
        names = [n for n in names if n in runtime.providers]
        results = await asyncio.gather(*(self.probe(runtime.providers[n]) for n in names))
        for name, (ok, detail, secs) in zip(names, results, strict=True):
            st.upstream(name).probed({"ok": ok, "detail": detail, "at": time.time(), "seconds": round(secs, 4)})
            if st.is_held(name):  # self-healing took it over while the probe ran
                continue
            if ok:
                self.seen_up.add(name)
                st.reachable(name, f"probe ok ({detail})")
                continue
            if name in self.seen_up or st.health_of(name) == HEALTHY:  # it answered since start
                st.probe_failed(name, f"probe failed: {detail}")
                continue
            # Never up since start: one warning, then its health follows quietly until it first answers.
            if name not in self.reported_unreachable:
                self.reported_unreachable.add(name)
                log.warning("provider %s: unreachable at %s (%s); probing every %g s", name,
                            probe_url(runtime.providers[name]), detail, runtime.config.health.probe_interval_s)
                st.probe_failed(name, f"unreachable since start: {detail}", quiet=True)
            else:
                st.probe_failed(name, f"probe failed: {detail}", quiet=True)

    async def latency_probe(self, provider: Provider) -> None:
        """A 1-token completion, timed: keeps an idle peer's latency figure fresh."""
        ok, _detail, secs = await self.generation_probe(provider)
        self.state.probed(provider.name, secs if ok else None, ok)

    # -- loops ----------------------------------------------------------------------------------------------

    async def _latency_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            runtime = self._runtime()
            probes = self.state.probes
            paid = {n: p.cfg.paid for n, p in runtime.providers.items()}
            due: set[str] = set()
            for prof in runtime.config.profiles.values():
                if prof.adaptive:
                    due.update(probes.due(list(prof.providers), paid))
            for name in due:
                probes.mark_probed(name)
                self._tasks.spawn(self.latency_probe(runtime.providers[name]), name=f"latency-probe:{name}")

    async def _loop(self) -> None:
        while True:
            try:
                await self.probe_all()
            except Exception as e:  # keep probing whatever happens
                log.warning("health probe round failed: %s", e)
            await asyncio.sleep(self._runtime().config.health.probe_interval_s)

    def start(self) -> None:
        self._tasks.spawn(self._loop(), name="health-probes")
        self._tasks.spawn(self._latency_loop(), name="latency-probes")

    def snapshot(self) -> dict:
        st = self.state
        return {n: {"state": st.health_of(n) or "unknown", "consecutive_failures": st.failures(n),
                    "last_probe": st.upstream(n).last_probe, "auth": st.auth_state(n)}
                for n in self._runtime().providers}
