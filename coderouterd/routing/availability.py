"""Why is provider X getting no traffic? One answer, in one place.

One upstream's state lives in several objects: its managed process (down, starting, unable to start, startable on
demand), its circuit breaker (the one count of failures, open, half-open, kept in rotation by the ejection limit, a
memory cooldown, an upstream's retry-after), the routing state (health as a view of that count, self-healing's
hold), the health monitor (the last probe's words), the budget, and the provider's own configuration. `judge`
reads them through the narrow seams below and answers for one provider at the moment the routing clock says:
whether it can take traffic, a short bounded code (a metric label) and the reason in words.

The planner gates by this answer (routing/planner.py), so `corectl explain`'s skips, `corectl status`, the admin
view, the dashboard and `/metrics` all show the same one. Panic (every provider of a chain out for a passing
reason: tried anyway) is a chain's answer: `judge_chain`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from ..providers.errors import MEMORY_PRESSURE
from ..upstream.breaker import BreakerState


class Code(StrEnum):
    """Why, as a bounded label (metrics, the dashboard's badge). The words say the rest."""

    OK = "ok"
    DEGRADED = "degraded"  # routed: some failures, below the threshold
    KEPT_IN_ROTATION = "kept_in_rotation"  # routed: its count says out, the ejection limit keeps it in
    HALF_OPEN = "half_open"  # routed one trial at a time
    UNHEALTHY = "unhealthy"  # out (health_action = exclude) or routed with a warning (warn, demote)
    HELD = "held"  # self-healing holds it while it recovers it
    BREAKER_OPEN = "breaker_open"
    RETRY_AFTER = "retry_after"
    MEMORY_COOLDOWN = "memory_cooldown"
    BUDGET = "budget"
    # Routed, but every recent request's worst-case cost was over what is left of a cap (guards/budget.py's skip
    # count): a smaller request may still fit, so the planner keeps trying it; every view says it gets nothing.
    BUDGET_SKIPPED = "budget_skipped"
    NOT_READY = "not_ready"
    STARTING = "starting"  # its process is being started (on demand, by hand, or again by self-healing)
    ON_DEMAND = "on_demand"  # its process is stopped; the next request that needs it starts it
    CANNOT_START = "cannot_start"
    PANIC = "panic"  # out for a passing reason, but so is every other provider of the chain: tried anyway


# The planner's skip reason for each code that keeps a provider out (the journal and metrics know these words).
SKIP_REASON: Mapping[Code, str] = {
    Code.BREAKER_OPEN: "breaker_open", Code.RETRY_AFTER: "breaker_open", Code.HALF_OPEN: "breaker_open",
    Code.MEMORY_COOLDOWN: "memory_cooldown", Code.UNHEALTHY: "unhealthy", Code.HELD: "unhealthy",
    Code.BUDGET: "budget", Code.BUDGET_SKIPPED: "budget", Code.NOT_READY: "not_ready", Code.STARTING: "not_ready",
    Code.ON_DEMAND: "not_ready",
    Code.CANNOT_START: "cannot_start",
}
# Out "for now": when every provider of a chain is out only for these, panic tries them anyway.
PASSING = frozenset({Code.BREAKER_OPEN, Code.RETRY_AFTER, Code.HALF_OPEN, Code.MEMORY_COOLDOWN, Code.UNHEALTHY,
                     Code.HELD})


@dataclass(frozen=True, slots=True)
class Availability:
    provider: str
    available: bool
    code: Code
    words: str
    failures: int = 0  # the one count of consecutive failures (real requests and probes)
    retry_in_s: float | None = None  # when an open breaker admits its trial

    @property
    def takes_traffic(self) -> bool:
        """Whether it is getting requests: routed, and not refused by the budget on every one of them."""
        return self.available and self.code is not Code.BUDGET_SKIPPED

    def as_dict(self) -> dict[str, object]:
        return {"available": self.available, "code": self.code.value, "why": self.words,
                "failures": self.failures, "retry_in_s": self.retry_in_s}


# -- the seams: only what the answer reads -------------------------------------------------------------------

class BreakerView(Protocol):
    @property
    def state(self) -> BreakerState: ...
    @property
    def consecutive_failures(self) -> int: ...
    @property
    def retry_in_s(self) -> float | None: ...
    @property
    def trial_in_flight(self) -> bool: ...
    @property
    def retry_after_only(self) -> bool: ...
    @property
    def kept_in_rotation(self) -> str | None: ...
    failures: int
    open_reason: str


class RoutingView(Protocol):
    """What the routing state says: whether the process is down and why, self-healing's hold, the breaker."""

    def is_down(self, provider: str) -> bool: ...
    def down_reason(self, provider: str) -> str: ...
    def cannot_start_reason(self, provider: str) -> str | None: ...
    def start_left(self, provider: str) -> float | None: ...  # not None: its process is starting (or restarting)
    def held_reason(self, provider: str) -> str | None: ...
    def breaker(self, provider: str) -> BreakerView: ...


class BudgetView(Protocol):
    def allowed(self, provider: str) -> bool: ...
    def spent_cap(self, provider: str) -> str | None: ...


class SkipsView(Protocol):
    """guards/budget.BudgetSkips: the budget's skips of the last window, when they were all its requests."""

    def every(self, provider: str) -> str | None: ...


class DemandView(Protocol):
    def can_start(self, provider: str) -> bool: ...


# provider -> the last active probe ({"ok", "detail", ...}) or None: the monitor's words for a probe streak.
LastProbe = Callable[[str], Mapping[str, object] | None]


@dataclass(frozen=True, slots=True)
class Sources:
    routing: RoutingView
    budget: BudgetView | None = None
    demand: Callable[[], DemandView | None] = lambda: None
    last_probe: LastProbe = lambda _name: None


# The answer for a provider with no trouble, one per provider: it is frozen, and judging every provider of the
# chain on every request must not allocate anything while all is well (bench/README.md, "The hot path back").
_OK: dict[str, Availability] = {}


def _ok(provider: str) -> Availability:
    a = _OK.get(provider)
    if a is None:
        if len(_OK) >= 4096:  # names come from the configuration; a bound all the same
            _OK.clear()
        a = _OK[provider] = Availability(provider, True, Code.OK, "can take traffic", 0)
    return a


def _s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 1 else "now"


def judge(provider: str, sources: Sources, *, health_action: str = "exclude") -> Availability:
    """Can `provider` take traffic at this moment (the routing clock's), and if not, why."""
    st = sources.routing
    if st.is_down(provider):
        why = st.cannot_start_reason(provider)
        if why is not None:
            return Availability(provider, False, Code.CANNOT_START, why)
        if st.start_left(provider) is not None:  # being started (on demand or not): starting, no longer at rest
            return Availability(provider, False, Code.STARTING, st.down_reason(provider))
        demand = sources.demand()
        if demand is not None and demand.can_start(provider):
            return Availability(provider, False, Code.ON_DEMAND,
                                f"{provider}'s managed process is stopped; a request starts it (on demand)")
        return Availability(provider, False, Code.NOT_READY, st.down_reason(provider))
    budget = sources.budget
    if budget is not None and not budget.allowed(provider):
        cap = budget.spent_cap(provider)
        return Availability(provider, False, Code.BUDGET,
                            f"budget exhausted: {cap}" if cap else f"budget exhausted: {provider} is over its monthly "
                                                                   "budget")
    br = st.breaker(provider)
    # The state first: reading it may move the breaker (a retry-after that elapsed closes it and zeroes the
    # count), and the answer must be all before or all after that move.
    state = br.state
    n = br.consecutive_failures
    if state is BreakerState.OPEN:
        retry = br.retry_in_s
        when = f", retry in {_s(retry)}" if retry is not None else ""
        if MEMORY_PRESSURE in br.open_reason:
            left = f" {_s(retry)}" if retry is not None else ""
            return Availability(provider, False, Code.MEMORY_COOLDOWN,
                                f"held: memory cooldown{left} ({provider} ran out of memory)", n, retry)
        if br.retry_after_only:
            return Availability(provider, False, Code.RETRY_AFTER, f"the upstream asked us to wait{when}", n, retry)
        return Availability(provider, False, Code.BREAKER_OPEN,
                            f"breaker open after {n} failure{'s' if n != 1 else ''}{when}", n, retry)
    if state is BreakerState.HALF_OPEN:
        if br.trial_in_flight:
            return Availability(provider, False, Code.HALF_OPEN, "breaker half-open: its trial request is in flight",
                                n)
        return Availability(provider, True, Code.HALF_OPEN, "breaker half-open: the next request is its trial", n)
    held = st.held_reason(provider)
    if held is not None or (n >= br.failures and br.kept_in_rotation is None):
        if held is not None:
            code, what = Code.HELD, f"held by self-healing ({held})"
        else:
            code, what = Code.UNHEALTHY, f"unhealthy after {n} failure{'s' if n != 1 else ''}"
            probe = sources.last_probe(provider)
            if probe is not None and not probe.get("ok"):
                what += f" (last probe: {probe.get('detail') or 'failed'})"
        if health_action == "exclude":
            return Availability(provider, False, code, what, n)
        routed = "moved to the back" if health_action == "demote" else "still routed"
        return Availability(provider, True, code, f"{what}; health_action = {health_action}: {routed}", n)
    if br.kept_in_rotation is not None:
        return Availability(provider, True, Code.KEPT_IN_ROTATION,
                            f"{n} failures, kept in rotation: {br.kept_in_rotation}", n)
    if budget is not None:
        # Read through an attribute, not a method of the seam: a budget without skip counting (a test's) has none.
        skips: SkipsView | None = getattr(budget, "skips", None)
        skipped = skips.every(provider) if skips is not None else None
        if skipped is not None:
            return Availability(provider, True, Code.BUDGET_SKIPPED, skipped, n)
    if n > 0:
        return Availability(provider, True, Code.DEGRADED,
                            f"{n} consecutive failure{'s' if n != 1 else ''} (out at {br.failures})", n)
    return _ok(provider)


def judge_chain(chain: Sequence[str], sources: Sources, *, health_action: str = "exclude",
                panic: bool = True) -> dict[str, Availability]:
    """Each provider of a chain. When none can take traffic (and the profile keeps panic on), those out only for a
    passing reason are tried anyway, as the executor does: their answer says panic, and why each was out."""
    answers = {p: judge(p, sources, health_action=health_action) for p in dict.fromkeys(chain)}
    if not panic or any(a.available for a in answers.values()):
        return answers
    return {p: Availability(p, True, Code.PANIC, f"panic: every provider of the chain is out, trying anyway "
                                                 f"({a.words})", a.failures, a.retry_in_s)
            if a.code in PASSING else a for p, a in answers.items()}
