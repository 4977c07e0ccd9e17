"""Provider health: passive (consecutive failures of real traffic, reported by the router) and active
(periodic cheap probes) -> HEALTHY / DEGRADED / UNHEALTHY, which the profiles' health_action acts on.

Also closes the adaptive-routing sampling gap: a fallback chain only sends traffic to its first provider, so
the others would have no latency figures; for adaptive profiles this task sends light probes (a 1-token
completion) to the providers the ProbeScheduler says are stale, never to paid ones unless allowed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
import orjson

from ..state import HealthTransition

log = logging.getLogger("coderouterd.health")

HEALTHY, DEGRADED, UNHEALTHY = "HEALTHY", "DEGRADED", "UNHEALTHY"
_PROBE_TIMEOUT_S = 5.0


def health_state(consecutive_failures: int, threshold: int) -> str:
    if consecutive_failures <= 0:
        return HEALTHY
    return UNHEALTHY if consecutive_failures >= threshold else DEGRADED


def probe_url(provider) -> str:
    cfg = provider.cfg
    if cfg.kind == "ollama":
        return f"{provider.root_url}/api/tags"
    return f"{cfg.base_url}/models"


class HealthMonitor:
    def __init__(self, daemon, *, publish: Callable | None = None, store=None) -> None:
        self.daemon = daemon
        self.publish = publish
        self.store = store
        self.failures: dict[str, int] = {}
        self.last_probe: dict[str, dict] = {}
        self._task: asyncio.Task | None = None
        self._latency_task: asyncio.Task | None = None
        # Providers whose health is owned by the self-healing orchestrator while it restarts them.
        self.held: set[str] = set()
        self.listeners: list[Callable[[str, str, str], None]] = []
        # Providers seen answering since this daemon started. One that never was is reported once as
        # unreachable, not as a HEALTHY -> DEGRADED transition it never made.
        self.seen_up: set[str] = set()
        self.reported_unreachable: set[str] = set()

    def threshold(self, provider: str) -> int:
        cfg = self.daemon.runtime.config
        ts = [p.health_threshold for p in cfg.profiles.values() if provider in p.providers]
        return min(ts) if ts else 3

    def set_state(self, provider: str, new: str, reason: str, *, quiet: bool = False) -> None:
        """Move a provider's health; `quiet`: the cause was logged already, the transition is a debug line
        (it is audited all the same)."""
        router = self.daemon.router
        old = router.health.get(provider, HEALTHY)
        if old == new:
            return
        router.health[provider] = new
        if self.store is not None:
            self.store.set("health", provider, new)
        if self.publish is not None:
            self.publish(HealthTransition(provider=provider, old=old, new=new, reason=reason))
        log.log(logging.DEBUG if quiet else logging.INFO, "provider %s: %s -> %s (%s)", provider, old, new, reason)
        for fn in self.listeners:
            fn(provider, old, new)

    # -- passive: fed by the router on each real request ------------------------------------------------------

    def on_passive(self, provider: str, consecutive: int) -> None:
        if provider in self.held:
            return
        self.failures[provider] = consecutive
        if consecutive == 0:
            self.seen_up.add(provider)
        reason = "recovered on real traffic" if consecutive == 0 else f"{consecutive} consecutive request failures"
        self.set_state(provider, health_state(consecutive, self.threshold(provider)), reason)

    # -- active ---------------------------------------------------------------------------------------------

    async def probe(self, provider) -> tuple[bool, str, float]:
        """One cheap reachability probe. Returns (ok, detail, seconds)."""
        t0 = time.monotonic()
        headers = {**provider.cfg.headers, **provider.auth_headers()}
        if provider.cfg.kind == "anthropic":
            headers["anthropic-version"] = "2023-06-01"
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                async with provider.session().get(probe_url(provider), headers=headers) as r:
                    await r.read()
                    ok = r.status < 500 and r.status not in (401, 403)
                    detail = f"HTTP {r.status}"
        except aiohttp.ClientConnectorError as e:
            ok, detail = False, f"cannot connect: {e.os_error.strerror or e.os_error}"[:200]
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"[:200]
        return ok, detail, time.monotonic() - t0

    async def probe_all(self) -> None:
        runtime = self.daemon.runtime
        # Managed processes that are not ready are the supervisor's and self-healing's business, not a probe's.
        down = self.daemon.router.down
        names = [n for n in runtime.providers if n not in self.held and n not in down]
        results = await asyncio.gather(*(self.probe(runtime.providers[n]) for n in names))
        for name, (ok, detail, secs) in zip(names, results, strict=True):
            self.last_probe[name] = {"ok": ok, "detail": detail, "at": time.time(), "seconds": round(secs, 4)}
            if ok:
                self.seen_up.add(name)
                if self.failures.get(name):
                    self.failures[name] = 0
                    self.daemon.router.passive_failures[name] = 0
                self.set_state(name, HEALTHY, f"probe ok ({detail})")
                continue
            n = self.failures.get(name, 0) + 1
            self.failures[name] = n
            new = health_state(n, self.threshold(name))
            if name in self.seen_up:
                self.set_state(name, new, f"probe failed: {detail}")
                continue
            # Never up since start: one warning, then its health follows quietly until it first answers.
            if name not in self.reported_unreachable:
                self.reported_unreachable.add(name)
                log.warning("provider %s: unreachable at %s (%s); probing every %g s", name,
                            probe_url(runtime.providers[name]), detail, runtime.config.health.probe_interval_s)
                self.daemon.router.health[name] = new
                if self.store is not None:
                    self.store.set("health", name, new)
                if self.publish is not None:
                    self.publish(HealthTransition(provider=name, old="UNKNOWN", new=new,
                                                  reason=f"unreachable since start: {detail}"))
            self.set_state(name, new, f"probe failed: {detail}", quiet=True)

    async def latency_probe(self, provider) -> None:
        """A 1-token completion, timed to first byte: keeps an idle peer's latency figure fresh."""
        router = self.daemon.router
        cfg = provider.cfg
        t0 = time.monotonic()
        ok = False
        try:
            model = await provider.resolve_model("")
            headers = {"content-type": "application/json", **cfg.headers, **provider.auth_headers()}
            if cfg.kind == "anthropic":
                headers["anthropic-version"] = "2023-06-01"
                url, body = f"{cfg.base_url}/messages", {"model": model, "max_tokens": 1,
                                                         "messages": [{"role": "user", "content": "ping"}]}
            else:
                base = cfg.base_url if cfg.kind != "ollama" or cfg.base_url.endswith("/v1") else cfg.base_url + "/v1"
                url, body = f"{base}/chat/completions", {"model": model, "max_tokens": 1,
                                                         "messages": [{"role": "user", "content": "ping"}]}
            async with asyncio.timeout(min(cfg.timeouts.first_byte, 60.0)):
                async with provider.session().post(url, data=orjson.dumps(body), headers=headers) as r:
                    await r.read()
                    ok = r.status < 400
        except Exception:  # a probe must never take the monitor down
            ok = False
        router.report_probe(provider.name, time.monotonic() - t0 if ok else None, ok)

    async def _latency_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            runtime = self.daemon.runtime
            router = self.daemon.router
            paid = {n: p.cfg.paid for n, p in runtime.providers.items()}
            due: set[str] = set()
            for prof in runtime.config.profiles.values():
                if prof.adaptive:
                    due.update(router.probes.due(list(prof.providers), paid))
            for name in due:
                router.probes.mark_probed(name)
                asyncio.ensure_future(self.latency_probe(runtime.providers[name]))

    async def _loop(self) -> None:
        while True:
            try:
                await self.probe_all()
            except Exception as e:  # keep probing whatever happens
                log.warning("health probe round failed: %s", e)
            await asyncio.sleep(self.daemon.runtime.config.health.probe_interval_s)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())
        self._latency_task = asyncio.ensure_future(self._latency_loop())

    async def stop(self) -> None:
        for t in (self._task, self._latency_task):
            if t is not None:
                t.cancel()
        for t in (self._task, self._latency_task):
            if t is not None:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass

    def snapshot(self) -> dict:
        router = self.daemon.router
        return {n: {"state": router.health.get(n, HEALTHY), "consecutive_failures": self.failures.get(n, 0),
                    "last_probe": self.last_probe.get(n)} for n in self.daemon.runtime.providers}
