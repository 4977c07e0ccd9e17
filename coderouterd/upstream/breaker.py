"""Per-provider circuit breakers: stop calling a provider that keeps failing, then test it with one request.

The breaker owns the provider's one count of consecutive failures: real requests (passive) and active probes
both feed it, as Envoy pairs outlier detection with active health checks. Only real requests open it; a probe
streak that reaches the threshold makes health UNHEALTHY (routing/state.py derives health from this count), and
the next real failure finds the count already there. An ejection gate (max_ejection_percent) may keep a provider
in rotation although its count says out.

Single-threaded by design: every call happens on the daemon's event loop, so there are no locks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection
from enum import StrEnum
from typing import TypedDict

from ..providers.errors import MAX_RETRY_AFTER_S
from .clock import Clock, SystemClock, wall_time

log = logging.getLogger(__name__)


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# The longest an upstream's retry-after may hold a breaker open. providers/errors.py clamps the header to it; the
# breaker clamps again for values that did not come through there (a snapshot persisted by an older daemon).
MAX_HINT_S = MAX_RETRY_AFTER_S

TransitionHook = Callable[[str, BreakerState, BreakerState, str], None]
# (provider) -> None: it may be ejected; or the words why ejecting it would take too many providers out at once.
EjectionGate = Callable[[str], str | None]


class BreakerSnapshot(TypedDict):
    """A breaker as it is persisted, shared between instances and shown (times on the wall clock)."""

    state: str  # a BreakerState value
    consecutive_failures: int
    opened_at: float | None
    retry_at: float | None
    retry_in_s: float | None
    trial_in_flight: bool
    retry_after_only: bool
    ejections: int
    kept_in_rotation: str | None


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        failures: int = 3,
        recovery_s: float = 30.0,
        max_recovery_s: float | None = None,
        clock: Clock | None = None,
        on_transition: TransitionHook | None = None,
    ) -> None:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        if recovery_s <= 0:
            raise ValueError("recovery_s must be > 0")
        self.name = name
        self.failures = failures
        self.recovery_s = float(recovery_s)
        # Ejection time grows: recovery_s, then twice that after each failed trial, up to max_recovery_s, so a
        # provider that keeps failing its trials is tried less and less often instead of every recovery_s for
        # ever. The count resets once the provider stays closed as long as its last ejection lasted.
        self.max_recovery_s = max(float(max_recovery_s or recovery_s * 10), self.recovery_s)
        self._ejections = 0  # consecutive ejections without a healthy period between them
        self._closed_at: float | None = None  # monotonic: when it last closed after an ejection
        self._clock: Clock = clock or SystemClock()
        self._on_transition = on_transition
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._opened_at: float | None = None  # monotonic
        self._retry_at: float | None = None  # monotonic
        self._trial_in_flight = False
        # Open only because the upstream said when to come back (retry-after), not because it kept failing:
        # once that time has passed the breaker closes without a trial, since nothing failed that a trial
        # would have to disprove.
        self._hint_only = False
        self.open_reason = ""  # why it last opened (the planner tells a memory cooldown from a fault)
        # Shared breakers: may this instance send the half-open trial? (one instance at a time holds it)
        self.trial_gate: Callable[[str], bool] | None = None
        # max_ejection_percent: asked when the count reaches the threshold; its words say why it stays in.
        self.ejection_gate: EjectionGate | None = None
        self._kept: str | None = None  # why the gate kept it in rotation although its count says out
        # Every failure of the current streak came from a probe: a probe that answers again ends it. A streak
        # with a real request's failure in it stands until a request (or a generation) succeeds.
        self._probe_streak = False

    # -- state -------------------------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        # Half-open is reached lazily: nothing needs a timer, the next reader observes it.
        if (
            self._state is BreakerState.OPEN
            and self._retry_at is not None
            and self._clock.now() >= self._retry_at
        ):
            self._trial_in_flight = False
            if self._hint_only:
                self._hint_only = False
                self._consecutive = 0
                self._probe_streak = False
                self._kept = None  # the streak it was kept in rotation for is over
                self._opened_at = None
                self._retry_at = None
                self._move(BreakerState.CLOSED, "retry-after elapsed")
            else:
                self._move(BreakerState.HALF_OPEN, "recovery time elapsed")
        return self._state

    @property
    def ejection_s(self) -> float:
        """How long the current (or next) ejection lasts: recovery_s doubled per consecutive ejection, capped."""
        n = max(self._ejections, 1)
        return min(self.recovery_s * 2.0 ** min(n - 1, 30), self.max_recovery_s)

    @property
    def ejections(self) -> int:
        return self._ejections

    @property
    def consecutive_failures(self) -> int:
        """The one count: consecutive failures of real requests and of probes, since the last success."""
        return self._consecutive

    @property
    def kept_in_rotation(self) -> str | None:
        """Why the provider is still routed to although its count reached the threshold (the ejection limit),
        or None."""
        return self._kept

    @property
    def out(self) -> bool:
        """Out of rotation: open or half-open, or its count reached the threshold and nothing kept it in (a
        probe streak: health UNHEALTHY)."""
        return self.state is not BreakerState.CLOSED or (self._consecutive >= self.failures and self._kept is None)

    @property
    def retry_after_only(self) -> bool:
        """Open only because the upstream said when to come back (retry-after), not because it kept failing."""
        return self.state is BreakerState.OPEN and self._hint_only

    @property
    def retry_in_s(self) -> float | None:
        """Seconds until an open breaker admits its trial; None unless open."""
        if self.state is not BreakerState.OPEN or self._retry_at is None:
            return None
        return max(0.0, self._retry_at - self._clock.now())

    @property
    def trial_in_flight(self) -> bool:
        return self.state is BreakerState.HALF_OPEN and self._trial_in_flight

    def allow(self) -> bool:
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        if self._trial_in_flight:
            return False
        if self.trial_gate is not None and not self.trial_gate(self.name):
            return False  # another instance holds the half-open probe (shared breakers)
        self._trial_in_flight = True
        return True

    # -- outcomes ----------------------------------------------------------------------------------------

    def record_success(self) -> None:
        state = self.state
        if state is BreakerState.OPEN:
            # A late success from an attempt started before the breaker opened says little about now;
            # the half-open trial is what decides, so the open period is not cut short.
            return
        self._consecutive = 0
        self._probe_streak = False
        self._kept = None
        self._trial_in_flight = False
        if state is BreakerState.HALF_OPEN:
            self._opened_at = None
            self._retry_at = None
            self._closed_at = self._clock.now()
            self._move(BreakerState.CLOSED, "trial request succeeded")

    def reset(self, reason: str) -> None:
        """Close the breaker now: the provider was verified by someone who knows (a recovery probe after a
        restart), so waiting out the rest of the open period would only keep a good backend idle."""
        self._consecutive = 0
        self._probe_streak = False
        self._kept = None
        self._trial_in_flight = False
        self._hint_only = False
        self._opened_at = None
        self._retry_at = None
        self._ejections = 0  # verified healthy: the next ejection starts short again
        self._closed_at = None
        self._move(BreakerState.CLOSED, reason)

    def record_failure(self, *, retry_after: float | None = None, reason: str = "") -> None:
        state = self.state
        now = self._clock.now()
        hint = (
            min(retry_after, MAX_HINT_S)
            if retry_after is not None and math.isfinite(retry_after) and retry_after > 0
            else None
        )
        self._consecutive += 1
        self._probe_streak = False
        detail = f": {reason}" if reason else ""
        if state is BreakerState.HALF_OPEN:
            self._trial_in_flight = False
            self._ejections += 1
            eject = self.ejection_s
            self._open(now, max(eject, hint or 0.0), f"trial request failed{detail}; out for {eject:g}s "
                                                     f"(ejection {self._ejections})")
            return
        if state is BreakerState.OPEN:
            # Only a longer upstream hint matters here; the breaker is already refusing traffic. A failure
            # without a hint while open only on a hint makes it a real open: a trial will decide.
            if hint is None:
                self._hint_only = False
            elif self._retry_at is not None and now + hint > self._retry_at:
                self._retry_at = now + hint
            return
        if self._consecutive >= self.failures and not self._keep_in_rotation():
            if self._closed_at is not None and now - self._closed_at >= self.ejection_s:
                self._ejections = 0  # it stayed healthy as long as it was last out: start short again
            self._ejections += 1
            why = f"{self._consecutive} consecutive failures{detail}"
            if hint is not None:
                why += f" (retry-after {hint:g}s)"
            self._open(now, max(self.ejection_s, hint or 0.0), why)
        elif hint is not None:
            # The upstream said when to come back; calling earlier only earns more 429s.
            self._open(now, hint, f"retry-after {hint:g}s{detail}", hint_only=True)

    def count_failure(self) -> None:
        """A failure that must not move the breaker (a panic attempt while it is open or half-open: the trial
        decides), yet is one more in the count."""
        self._consecutive += 1
        self._probe_streak = False

    def record_probe_failure(self) -> None:
        """An active probe failed: one more in the same count. A probe never opens the breaker (only a real
        request's failure does); at the threshold health says UNHEALTHY, unless the ejection limit keeps the
        provider in rotation."""
        if self._consecutive == 0:
            self._probe_streak = True
        self._consecutive += 1
        if self._consecutive >= self.failures and self.state is BreakerState.CLOSED:
            self._keep_in_rotation()

    def record_probe_success(self) -> None:
        """An active probe answered. It ends a streak of probe failures; a streak with a real request's failure
        in it stands (answering the model list is not generating)."""
        if self._probe_streak and self.state is BreakerState.CLOSED:
            self._consecutive = 0
            self._probe_streak = False
            self._kept = None

    def clear_failures(self) -> None:
        """Self-healing's recovery probes say it answers again: a closed breaker's count starts over."""
        if self.state is BreakerState.CLOSED:
            self._consecutive = 0
            self._probe_streak = False
            self._kept = None

    def _keep_in_rotation(self) -> bool:
        """Ask the ejection gate whether this provider may go out; remember why not."""
        why = self.ejection_gate(self.name) if self.ejection_gate is not None else None
        if why is not None and self._kept is None:
            log.warning("provider %s: %d consecutive failures, kept in rotation: %s", self.name, self._consecutive,
                        why)
        self._kept = why
        return why is not None

    def record_neutral(self) -> None:
        """An attempt that said nothing about the provider's health (client 4xx, cancelled race loser)."""
        if self.state is BreakerState.HALF_OPEN:
            self._trial_in_flight = False

    def release(self) -> None:
        self.record_neutral()

    # -- persistence -------------------------------------------------------------------------------------

    def snapshot(self) -> BreakerSnapshot:
        state = self.state
        now = self._clock.now()
        wall = wall_time(self._clock)
        opened_at = None if self._opened_at is None else wall - (now - self._opened_at)
        retry_in = None
        retry_at = None
        if state is BreakerState.OPEN and self._retry_at is not None:
            retry_in = max(0.0, self._retry_at - now)
            retry_at = wall + retry_in
        return {
            "state": state.value,
            "consecutive_failures": self._consecutive,
            "opened_at": opened_at,
            "retry_at": retry_at,
            "retry_in_s": retry_in,
            "trial_in_flight": state is BreakerState.HALF_OPEN and self._trial_in_flight,
            "retry_after_only": state is BreakerState.OPEN and self._hint_only,
            "ejections": self._ejections,
            "kept_in_rotation": self._kept,
        }

    def restore(self, snap: object) -> None:
        """Load a snapshot taken by a previous process (or another instance): anything, checked here. Raises
        ValueError on malformed data."""
        if not isinstance(snap, dict):
            raise ValueError("breaker snapshot must be an object")
        try:
            state = BreakerState(snap.get("state", "closed"))
        except ValueError as exc:
            raise ValueError(f"unknown breaker state {snap.get('state')!r}") from exc
        consecutive = _non_negative_int(snap.get("consecutive_failures", 0), "consecutive_failures")
        ejections = _non_negative_int(snap.get("ejections", 0), "ejections")
        now = self._clock.now()
        wall = wall_time(self._clock)
        opened_at = _optional_float(snap.get("opened_at"), "opened_at")
        retry_in = _optional_float(snap.get("retry_in_s"), "retry_in_s")
        retry_at = _optional_float(snap.get("retry_at"), "retry_at")

        self._consecutive = consecutive
        if consecutive < self.failures:
            self._kept = None  # the count no longer says out: nothing keeps it in
        if consecutive == 0:
            self._probe_streak = False
        self._ejections = ejections if state is not BreakerState.CLOSED else 0
        # The trial that was in flight died with the old process; a new one must be admitted.
        self._trial_in_flight = False
        self._opened_at = None if opened_at is None else now - max(0.0, wall - opened_at)
        self._retry_at = None
        if state is BreakerState.OPEN:
            remaining = self.recovery_s if retry_in is None else max(0.0, retry_in)
            # A snapshot from an older daemon may hold a wait an upstream imposed without bound.
            remaining = min(remaining, max(self.max_recovery_s, MAX_HINT_S))
            if retry_at is not None:
                # Downtime counts toward recovery; a wall clock that went backwards must not extend it.
                remaining = min(remaining, max(0.0, retry_at - wall))
            self._retry_at = now + remaining
            if self._opened_at is None:
                self._opened_at = now
        elif state is BreakerState.CLOSED:
            self._opened_at = None
        self._hint_only = state is BreakerState.OPEN and snap.get("retry_after_only") is True
        self._state = state

    # -- internals ---------------------------------------------------------------------------------------

    def _open(self, now: float, duration: float, reason: str, *, hint_only: bool = False) -> None:
        self.open_reason = reason
        self._hint_only = hint_only
        self._opened_at = now
        self._retry_at = now + duration
        self._move(BreakerState.OPEN, reason)

    def _move(self, new: BreakerState, reason: str) -> None:
        old = self._state
        self._state = new
        if old is new or self._on_transition is None:
            return
        try:
            self._on_transition(self.name, old, new, reason)
        except Exception:
            # Auditing a transition must never break routing.
            log.exception("breaker transition hook failed for %s", self.name)


def _optional_float(value: object, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number")
    return float(value)


def _non_negative_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be a non-negative integer")
    return value


class BreakerRegistry:
    """One breaker per provider, shared by every profile that routes to it."""

    def __init__(
        self,
        *,
        failures: int = 3,
        recovery_s: float = 30.0,
        max_recovery_s: float | None = None,
        clock: Clock | None = None,
        on_transition: TransitionHook | None = None,
    ) -> None:
        self._failures = failures
        self._recovery_s = recovery_s
        self._max_recovery_s = max_recovery_s
        self._clock: Clock = clock or SystemClock()
        self._on_transition = on_transition
        self._breakers: dict[str, CircuitBreaker] = {}
        self._trial_gate: Callable[[str], bool] | None = None
        self._max_ejection_percent = 100
        # The providers configured now: only their breakers count toward the limit. A registry also holds
        # breakers of providers a reload removed or only a peer configures (shared breakers); those are never
        # routed to, so an open one would never get its trial and would count as out for ever.
        self._configured: Callable[[], Collection[str]] | None = None

    @property
    def failures(self) -> int:
        """Consecutive failures that take a provider out ([breaker] failures)."""
        return self._failures

    def set_trial_gate(self, gate: Callable[[str], bool] | None) -> None:
        self._trial_gate = gate
        for breaker in self._breakers.values():
            breaker.trial_gate = gate

    def limit_ejections(self, max_percent: int, configured: Callable[[], Collection[str]]) -> None:
        """At most `max_percent` of the `configured()` providers out at once (never fewer than one may go out):
        Envoy's max_ejection_percent. 100: no limit."""
        self._max_ejection_percent = max_percent
        self._configured = configured
        for breaker in self._breakers.values():
            breaker.ejection_gate = self._ejection_gate

    def _counted(self) -> Collection[str]:
        return self._configured() if self._configured is not None else self._breakers.keys()

    def max_out(self) -> int:
        """How many providers may be out of rotation at once."""
        return max(1, len(self._counted()) * self._max_ejection_percent // 100)

    def _ejection_gate(self, name: str) -> str | None:
        if self._max_ejection_percent >= 100:
            return None
        counted = self._counted()
        if name not in counted:
            return None  # not configured here: nothing routes to it, keeping it in would protect nothing
        out = [n for n in counted if n != name and (b := self._breakers.get(n)) is not None and b.out]
        allowed = self.max_out()
        if len(out) + 1 <= allowed:
            return None
        return (f"{len(out)} of {len(counted)} providers are out already ({', '.join(sorted(out))}); "
                f"[breaker] max_ejection_percent = {self._max_ejection_percent} allows {allowed}")

    def forget(self, names: Collection[str]) -> None:
        """Drop these providers' breakers (no longer configured)."""
        for name in names:
            self._breakers.pop(name, None)

    def get(self, name: str) -> CircuitBreaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = CircuitBreaker(
                name,
                failures=self._failures,
                recovery_s=self._recovery_s,
                max_recovery_s=self._max_recovery_s,
                clock=self._clock,
                on_transition=self._on_transition,
            )
            breaker.trial_gate = self._trial_gate
            breaker.ejection_gate = self._ejection_gate
            self._breakers[name] = breaker
        return breaker

    def configure(self, failures: int, recovery_s: float, max_recovery_s: float | None = None) -> None:
        """New defaults (config reload); applied to existing breakers without resetting their state."""
        if failures < 1:
            raise ValueError("failures must be >= 1")
        if recovery_s <= 0:
            raise ValueError("recovery_s must be > 0")
        self._failures = failures
        self._recovery_s = float(recovery_s)
        self._max_recovery_s = max_recovery_s
        for breaker in self._breakers.values():
            breaker.failures = failures
            breaker.recovery_s = float(recovery_s)
            breaker.max_recovery_s = max(float(max_recovery_s or recovery_s * 10), breaker.recovery_s)

    def names(self) -> list[str]:
        return list(self._breakers)

    def __contains__(self, name: object) -> bool:
        return name in self._breakers

    def snapshot(self) -> dict[str, BreakerSnapshot]:
        return {name: breaker.snapshot() for name, breaker in self._breakers.items()}

    def restore(self, data: object) -> list[str]:
        """Restore every well-formed entry; returns the names whose snapshot was rejected (and logged),
        because a damaged persisted record must not stop the daemon from serving."""
        rejected: list[str] = []
        if not isinstance(data, dict):
            log.warning("ignoring breaker state: expected an object, got %s", type(data).__name__)
            return rejected
        for name, snap in data.items():
            try:
                self.get(str(name)).restore(snap)
            except ValueError as exc:
                log.warning("ignoring persisted breaker state for %s: %s", name, exc)
                rejected.append(str(name))
        return rejected
