"""The routing state, with one owner: health, latency/error figures and auth refusals, over the registry of
upstreams (upstream/: each provider's breaker, self-healing's hold and lifecycle, whether its process is up).

Health is a view, not a second count: the breaker owns the one count of consecutive failures, fed by real
requests (`passive_failure`) and by active probes (`probe_failed`), and health is derived from it (plus
self-healing's hold) after every change, then published as a transition for the audit and self-healing.

Everyone else reads it and changes it only through the named operations below (`hold`, `recovered`,
`passive_failure`, `passive_success`, `probe_failed`, `reachable`, ...); the health monitor and the self-healer
receive this object, not the daemon. Whether a process is up is not written here: the supervisor's events and the
on-demand scheduler move each upstream's lifecycle (`upstreams`), and this object only reads it.
Single-threaded: every call happens on the event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..upstream.breaker import BreakerRegistry, BreakerSnapshot, BreakerState, CircuitBreaker
from ..upstream.clock import Clock, SystemClock
from ..upstream.lifecycle import Phase
from ..upstream.upstream import Upstream, Upstreams
from .adaptive import AdaptiveSettings, ProbeScheduler, ProviderStats

if TYPE_CHECKING:
    from ..config.schema import ConfigModel

log = logging.getLogger("coderouterd.health")

HEALTHY, DEGRADED, UNHEALTHY = "HEALTHY", "DEGRADED", "UNHEALTHY"
_NONE: frozenset[str] = frozenset()

# (provider, breaker snapshot, old, new, reason): persistence and audit of breaker moves.
BreakerHook = Callable[[str, BreakerSnapshot, BreakerState, BreakerState, str], None]
# (provider, old, new, reason): persistence and audit of health moves.
HealthHook = Callable[[str, str, str, str], None]


def health_state(consecutive_failures: int, threshold: int) -> str:
    if consecutive_failures <= 0:
        return HEALTHY
    return UNHEALTHY if consecutive_failures >= threshold else DEGRADED


class RoutingState:
    def __init__(self, config: ConfigModel, *, clock: Clock | None = None, on_breaker: BreakerHook | None = None,
                 on_health: HealthHook | None = None) -> None:
        self.clock = clock or SystemClock()
        self._on_breaker = on_breaker
        self._on_health = on_health
        self._breaker_watchers: list[BreakerHook] = []
        self.breakers = BreakerRegistry(failures=config.breaker.failures, recovery_s=config.breaker.recovery_s,
                                        max_recovery_s=config.breaker.max_recovery_s,
                                        clock=self.clock, on_transition=self._breaker_moved)
        self._configured = frozenset(config.providers)
        self.breakers.limit_ejections(config.breaker.max_ejection_percent, lambda: self._configured)
        # One Upstream per configured provider from the start (its gauges are in /metrics before it moves).
        self.upstreams = Upstreams(self.breakers, self.clock.now)
        self.upstreams.configure(self._configured)
        self.settings = AdaptiveSettings(**config.adaptive.model_dump())
        self.stats = ProviderStats(self.settings, self.clock)
        self.probes = ProbeScheduler(self.stats, self.settings, self.clock)
        self._health: dict[str, str] = {}
        self._health_view = MappingProxyType(self._health)  # a live read-only view, made once
        self._auth: dict[str, dict] = {}
        self._health_watchers: list[Callable[[str, str, str], None]] = []

    def _breaker_moved(self, name: str, old: BreakerState, new: BreakerState, reason: str) -> None:
        if self._on_breaker is not None or self._breaker_watchers:
            snap = self.breakers.get(name).snapshot()
            if self._on_breaker is not None:
                self._on_breaker(name, snap, old, new, reason)
            for fn in list(self._breaker_watchers):
                fn(name, snap, old, new, reason)
        # Health is the count's view, whatever moved the breaker: a move nobody called for (a retry-after that
        # elapsed, read lazily, zeroes the count) has no named operation after it to re-derive health.
        self._refresh_health(name, reason)

    def watch_breakers(self, fn: BreakerHook) -> None:
        """Call fn(provider, snapshot, old, new, reason) on every breaker move made here (shared breakers
        publish them to the other instances)."""
        self._breaker_watchers.append(fn)

    def adopt_breaker(self, provider: str, snapshot: dict, reason: str) -> BreakerState:
        """Take a breaker state another instance decided (shared breakers). Not a move made here: no hook runs,
        so it is not sent back. Raises ValueError on a malformed snapshot."""
        br = self.breakers.get(provider)
        old = br.state
        br.restore(snapshot)
        new = br.state
        if new is not old:
            log.info("provider %s: breaker %s -> %s (%s)", provider, old, new, reason)
        self._refresh_health(provider, reason)  # the peer's count replaced ours
        return new

    def set_trial_gate(self, gate: Callable[[str], bool] | None) -> None:
        """Who may send a half-open breaker's trial: with shared breakers, the instance holding the probe lease."""
        self.breakers.set_trial_gate(gate)

    def reconfigure(self, config: ConfigModel) -> None:
        self.breakers.configure(config.breaker.failures, config.breaker.recovery_s, config.breaker.max_recovery_s)
        self._configured = frozenset(config.providers)
        # A removed provider's breaker would never see traffic again (an open one never its trial); if the
        # provider comes back, it starts closed like any new one.
        self.breakers.forget([n for n in self.breakers.names() if n not in self._configured])
        self.upstreams.configure(self._configured)
        new = AdaptiveSettings(**config.adaptive.model_dump())
        for k, v in vars(new).items():
            setattr(self.settings, k, v)

    def restore(self, breakers: Mapping, health: Mapping) -> list[str]:
        """Load what a previous process persisted. Returns the breaker names whose snapshot is to be dropped:
        rejected as malformed, or of a provider no longer configured."""
        gone = [str(n) for n in breakers if n not in self._configured]
        if gone:
            log.info("dropping persisted breaker state of providers no longer configured: %s", ", ".join(gone))
        known = {n: s for n, s in breakers.items() if n in self._configured}
        rejected = self.breakers.restore(known) if known else []
        self._health.update({k: v for k, v in health.items()
                             if k in self._configured and v in (HEALTHY, DEGRADED, UNHEALTHY)})
        for name in self.breakers.names():
            # Health is the breaker's view: a persisted word the restored count contradicts is not kept.
            if name not in rejected:
                self._health[name] = self._derived_health(name)
        return rejected + gone

    # -- reads ----------------------------------------------------------------------------------------------

    @property
    def health(self) -> Mapping[str, str]:
        """provider -> HEALTHY | DEGRADED | UNHEALTHY (absent: unknown). Read-only."""
        return self._health_view

    @property
    def down(self) -> frozenset[str]:
        """Providers whose managed process is not ready (starting, draining, stopped, unable to start, fatal)."""
        out = self.upstreams.out
        return frozenset(out) if out else _NONE

    def upstream(self, provider: str) -> Upstream:
        return self.upstreams.get(provider)

    def health_of(self, provider: str) -> str | None:
        if provider in self.breakers:
            _ = self.breakers.get(provider).state  # a lazy move that is due re-derives health (_breaker_moved)
        return self._health.get(provider)

    def is_down(self, provider: str) -> bool:
        return provider in self.upstreams.out

    def down_reason(self, provider: str) -> str:
        """Why a down provider is not routed to, for the client: its process, its state, what brings it back."""
        return self.upstreams.get(provider).life.words()

    def cannot_start_reason(self, provider: str) -> str | None:
        """Why this down provider's process cannot start (None: it is not known to be unable to)."""
        if provider not in self.upstreams:
            return None
        life = self.upstreams.get(provider).life
        return life.why if life.phase in (Phase.CANNOT_START, Phase.FATAL) else None

    def start_left(self, provider: str) -> float | None:
        """Seconds left in the start window of this provider's process (None: not starting): when a start under
        way has come up or failed, at the latest (a Retry-After's upper bound)."""
        if provider not in self.upstreams.out:
            return None
        return self.upstreams.get(provider).life.start_left(self.clock.now())

    def is_held(self, provider: str) -> bool:
        return provider in self.upstreams and self.upstreams.get(provider).held is not None

    def breaker(self, provider: str) -> CircuitBreaker:
        return self.breakers.get(provider)

    def held_reason(self, provider: str) -> str | None:
        """Why self-healing holds this provider out of routing, or None."""
        return self.upstreams.get(provider).held if provider in self.upstreams else None

    def failures(self, provider: str) -> int:
        """The one count of consecutive failures (real requests and probes), kept by the provider's breaker."""
        return self.breakers.get(provider).consecutive_failures if provider in self.breakers else 0

    def passive_failures(self, provider: str) -> int:
        """The same one count (its older name: there is no separate passive count any more)."""
        return self.failures(provider)

    def threshold(self, provider: str) -> int:
        """Consecutive failures (of real requests, or of probes) that make a provider UNHEALTHY: the breaker's
        own count, so health and the breaker agree on when a provider is out (one number, `[breaker] failures`)."""
        return self.breakers.failures

    def auth_state(self, provider: str) -> dict | None:
        """The last credentials refusal (401/403) since the provider last served, or None."""
        a = self._auth.get(provider)
        return dict(a) if a is not None else None

    # -- named operations -----------------------------------------------------------------------------------

    def watch_health(self, fn: Callable[[str, str, str], None]) -> None:
        """Call fn(provider, old, new) on every health move (self-healing reacts to UNHEALTHY)."""
        self._health_watchers.append(fn)

    def set_health(self, provider: str, new: str, reason: str, *, quiet: bool = False) -> None:
        """Move a provider's health; `quiet`: its cause was logged already, so the move is a debug line (it is
        audited all the same)."""
        old = self._health.get(provider)
        if old == new:
            return
        self._health[provider] = new
        if old is None and new == HEALTHY:
            return  # the first news is good news: no transition to audit or log, the default was assumed
        old_word = old or "UNKNOWN"
        if self._on_health is not None:
            self._on_health(provider, old_word, new, reason)
        log.log(logging.DEBUG if quiet else logging.INFO, "provider %s: %s -> %s (%s)", provider, old_word, new,
                reason)
        for fn in list(self._health_watchers):
            fn(provider, old_word, new)

    def hold(self, provider: str, reason: str, *, quiet: bool = False) -> None:
        """Self-healing takes the provider out of routing while it recovers it."""
        self.upstreams.get(provider).held = reason
        self.set_health(provider, UNHEALTHY, reason, quiet=quiet)

    def unhold(self, provider: str, reason: str = "self-healing let go without recovering it") -> None:
        """Self-healing hands the provider back: its health is the breaker's count again (the hold made it
        UNHEALTHY; left as it was, the word would stay stale until the next count change)."""
        if self._unhold(provider):
            self._refresh_health(provider, reason)

    def _unhold(self, provider: str) -> bool:
        up = self.upstreams.get(provider) if provider in self.upstreams else None
        if up is None or up.held is None:
            return False
        up.held = None
        return True

    def _derived_health(self, provider: str) -> str:
        """Health as a view of the breaker's one count and self-healing's hold. A provider the ejection limit
        keeps in rotation is DEGRADED, not UNHEALTHY: UNHEALTHY would take it out all the same."""
        if self.is_held(provider):
            return UNHEALTHY
        br = self.breakers.get(provider)
        n = br.consecutive_failures
        if n >= br.failures and br.kept_in_rotation is not None:
            return DEGRADED
        return health_state(n, br.failures)

    def _refresh_health(self, provider: str, reason: str, *, quiet: bool = False) -> None:
        self.set_health(provider, self._derived_health(provider), reason, quiet=quiet)

    def recovered(self, provider: str, reason: str, *, generation_verified: bool) -> None:
        """The provider answers again. Only a real generation (`generation_verified`) may close a breaker that
        failed generations opened; self-healing asks for one whenever the breaker is not closed, so a
        reachability answer only ever restarts a closed breaker's count."""
        self._unhold(provider)
        br = self.breakers.get(provider)
        if generation_verified and br.state is not BreakerState.CLOSED:
            br.reset(reason)
        else:
            br.clear_failures()
        self._refresh_health(provider, reason)

    def reachable(self, provider: str, reason: str) -> None:
        """A reachability probe answered. It says nothing about generating: it ends a streak of failed probes,
        while a streak with failed real requests in it stands (until a request or a generation succeeds)."""
        self.breakers.get(provider).record_probe_success()
        if not self.is_held(provider):
            self._refresh_health(provider, reason)

    def probe_failed(self, provider: str, reason: str, *, quiet: bool = False) -> None:
        """An active probe failed: one more in the breaker's count, the same count real requests feed."""
        self.breakers.get(provider).record_probe_failure()
        if not self.is_held(provider):
            self._refresh_health(provider, reason, quiet=quiet)

    def passive_failure(self, provider: str, *, retry_after: float | None = None, reason: str = "") -> None:
        """A real request failed for the backend's own reason: counted by its breaker (which may open)."""
        br = self.breakers.get(provider)
        br.record_failure(retry_after=retry_after, reason=reason)
        self._after_failure(provider)

    def panic_failure(self, provider: str) -> None:
        """A panic attempt failed while the breaker refused: one more in the count; the breaker's own trial
        decides when it closes, so its state does not move."""
        self.breakers.get(provider).count_failure()
        self._after_failure(provider)

    def _after_failure(self, provider: str) -> None:
        if not self.is_held(provider):
            n = self.failures(provider)
            self._refresh_health(provider, f"{n} consecutive request failures")

    def passive_success(self, provider: str) -> None:
        """A real request was served (its breaker was told first): the provider is HEALTHY unless its breaker
        still refuses (a late answer from before it opened)."""
        self._auth.pop(provider, None)
        # A real request served (a panic attempt, say) is better proof than any recovery probe: self-healing's
        # hold ends here, and its watcher sees HEALTHY and stops recovering.
        self._unhold(provider)
        self._refresh_health(provider, "served a request")

    def probed(self, provider: str, latency_s: float | None, ok: bool) -> None:
        """A generation probe's result, as a sample for adaptive ordering."""
        self.stats.record(provider, latency_s=latency_s, ok=ok, probe=True)

    def auth_refused(self, provider: str, status: int) -> None:
        self._auth[provider] = {"status": status, "at": time.time()}
