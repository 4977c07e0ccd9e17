"""One state word per provider: what `corectl status`, the dashboard's Now and the attention strip print.

It is computed here, once, from the availability verdict (routing/availability.py, which /metrics labels with its
code) and what the verdict does not know: the managed process's state, a missing key, a spend near its cap. The
page and the CLI print `word` in the colour `kind` says and list `problem` in the attention strip; they never
derive a state of their own from breaker, health and budget fields (issue 43: E1, E4, E7 came from doing so).

Kinds: ok (takes traffic), warn (a passing state: half-open, starting, waiting), idle (at rest: an on-demand model
stopped until a request needs it), bad (out, or failing). Problems: down, budget, key (None: nothing to attend to).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from ..routing.availability import Availability, Code
from ..routing.state import DEGRADED, HEALTHY, UNHEALTHY
from ..state.events import BreakerTransition, HealthTransition, ProcessEvent
from ..state.events import ProcessEventName as E
from ..upstream.breaker import BreakerState


class Kind(StrEnum):
    OK = "ok"
    WARN = "warn"
    IDLE = "idle"
    BAD = "bad"


class Problem(StrEnum):
    DOWN = "down"
    BUDGET = "budget"
    KEY = "key"


@dataclass(frozen=True, slots=True)
class StateWord:
    word: str
    kind: Kind
    problem: Problem | None
    code: Code  # the verdict's code: the label /metrics shows for the same provider
    takes_traffic: bool

    def as_dict(self) -> dict[str, object]:
        return {"word": self.word, "kind": self.kind.value, "problem": self.problem.value if self.problem else None,
                "code": self.code.value, "takes_traffic": self.takes_traffic}


# The verdict's codes that read the same whatever else is known. Not here: OK, NOT_READY, UNHEALTHY, HELD,
# HALF_OPEN (they depend on the process, on whether it is routed anyway, on the trial).
_FIXED: dict[Code, tuple[str, Kind, Problem | None]] = {
    Code.DEGRADED: ("degraded", Kind.WARN, None),
    Code.KEPT_IN_ROTATION: ("kept in rotation", Kind.WARN, None),
    Code.BREAKER_OPEN: ("down: breaker open", Kind.BAD, Problem.DOWN),
    Code.RETRY_AFTER: ("waiting: the upstream asked us to", Kind.WARN, None),
    Code.MEMORY_COOLDOWN: ("down: memory cooldown", Kind.BAD, Problem.DOWN),
    Code.BUDGET: ("blocked: monthly cap", Kind.BAD, Problem.BUDGET),
    Code.BUDGET_SKIPPED: ("skipped: over its budget", Kind.BAD, Problem.BUDGET),
    Code.ON_DEMAND: ("stopped: starts on demand", Kind.IDLE, None),
    Code.STARTING: ("process starting", Kind.WARN, None),
    Code.CANNOT_START: ("down: cannot start", Kind.BAD, Problem.DOWN),
    Code.PANIC: ("panic: tried anyway", Kind.BAD, Problem.DOWN),
}


def state_word(a: Availability, *, process_state: str | None = None, key_problem: str | None = None,
               budget_ratio: float | None = None, warn_ratio: float = 0.8) -> StateWord:
    """The one word for a provider whose verdict is `a`. `process_state`: its managed process's (None: unmanaged);
    `budget_ratio`: its month's spend over its cap (None: no cap)."""
    code = a.code
    word, kind, problem = _word(a, process_state)
    if code is Code.OK and key_problem:
        word, kind, problem = "no key", Kind.BAD, Problem.KEY
    elif code in (Code.OK, Code.DEGRADED) and budget_ratio is not None and budget_ratio >= warn_ratio:
        word, kind, problem = "near its cap", Kind.WARN, Problem.BUDGET
    return StateWord(word, kind, problem, code, a.takes_traffic)


def _word(a: Availability, process_state: str | None) -> tuple[str, Kind, Problem | None]:
    code = a.code
    fixed = _FIXED.get(code)
    if fixed is not None:
        return fixed
    if code is Code.HALF_OPEN:
        # A trial is how a breaker recovers: a warning, never "down" (E4).
        return ("half-open: next request is its trial" if a.available else "half-open: trial in flight",
                Kind.WARN, None)
    if code is Code.NOT_READY:
        if process_state == "fatal":
            return "down: process fatal", Kind.BAD, Problem.DOWN
        if process_state in (None, "ready", "running"):
            return "down: not ready", Kind.BAD, Problem.DOWN
        return f"process {process_state}", Kind.WARN, None
    if code in (Code.UNHEALTHY, Code.HELD):
        what = "unhealthy" if code is Code.UNHEALTHY else "recovering: held by self-healing"
        if a.available:  # health_action = warn or demote: still routed
            return f"{what}, still routed", Kind.BAD, Problem.DOWN
        return (f"down: {what}" if code is Code.UNHEALTHY else what), Kind.BAD, Problem.DOWN
    return "healthy", Kind.OK, None


# -- the tone of an event in the feed (E7) -------------------------------------------------------------------------

_PROCESS_TONE = {E.READY: Kind.OK, E.ADOPTED: Kind.OK, E.REJOINED: Kind.OK, E.STARTED: Kind.WARN,
                 E.RESTARTING: Kind.BAD, E.RESTART_SKIPPED: Kind.WARN, E.EXITED: Kind.BAD, E.FATAL: Kind.BAD,
                 E.EXCLUDED: Kind.BAD, E.STOPPED: Kind.IDLE}
_BREAKER_TONE = {BreakerState.CLOSED.value: Kind.OK, BreakerState.HALF_OPEN.value: Kind.WARN,
                 BreakerState.OPEN.value: Kind.BAD}
_HEALTH_TONE = {HEALTHY: Kind.OK, DEGRADED: Kind.WARN, UNHEALTHY: Kind.BAD}


def event_tone(kind: str, fields: Mapping[str, object]) -> Kind | None:
    """How the feed draws a state change, decided here with the daemon's own words (routing/state.py's HEALTHY,
    the breaker's states, the process events), so the page never compares spellings: a recovery is ok, an on-demand
    model stopped (idle, room for another, by hand) is at rest, a crash is bad. `fields`: the event's (as the bus
    has them, or as the audit log kept them). None: the kind has no tone here."""
    if kind == HealthTransition.kind:
        return _HEALTH_TONE.get(str(fields.get("new")).upper(), Kind.BAD)
    if kind == BreakerTransition.kind:
        return _BREAKER_TONE.get(str(fields.get("new")).lower(), Kind.BAD)
    if kind == ProcessEvent.kind:
        try:
            return _PROCESS_TONE.get(E(str(fields.get("event"))))
        except ValueError:
            return None
    return None
