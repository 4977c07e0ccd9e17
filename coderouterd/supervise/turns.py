"""Whose turn it is: which model to swap in next, and when, so that a swap happens only when it pays. Pure: the
wants, the residency policy and the clock are handed in; ondemand.py acts on the answer.

The rules (README: Several local models, "Swaps only when they pay"):

- Turns go in order: requests a user waits for (foreground) first, then background ones (ClientRequest.is_background:
  titles, topic checks), then a start nobody waits for any more (a request failed over while it was decided); within each,
  the longest waiting first. A later want may go ahead of one that is held only if it stops nothing.
- A model some requests were promised (it came up for them) is never stopped before they begin: the swap that
  brought it in finishes by serving what waited for it.
- A model serving requests is stopped for a foreground want only once that want's oldest request has been held
  as long as the swap would cost, at most `hold_s`: meanwhile the resident model keeps serving, and the requests
  for the other are gathered and served together by one swap. The swap's cost is the load times learned
  (residency.py `load_s`): the target's now, and the victims' when they are wanted again. Waiting as long as
  what one would pay, then paying, is the ski-rental rule: never more than twice the best choice made knowing
  the future. No load time learned yet: `hold_s`.
- A background want never stops a model with requests in flight or promised, nor one used within the last
  `hold_s` whatever the loads cost (idle only between two tool calls of an agent): that window guesses whether
  the agent is still at work, which a load time says nothing about, and the reload it risks lands on a request a
  user waits for, while the background one waits unseen (docs/decisions.md).
- A model that became ready less than the policy's minimum residency ago is not stopped for another.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .residency import NoRoom, ResidencyPolicy

FOREGROUND, BACKGROUND, UNWAITED = 0, 1, 2


@dataclass(frozen=True)
class Want:
    """A stopped model that requests are waiting for."""

    name: str
    since: float  # when its longest-waiting request asked
    foreground: int = 0  # waiting requests a user waits for
    background: int = 0  # waiting background requests

    @property
    def rank(self) -> int:
        return FOREGROUND if self.foreground else BACKGROUND if self.background else UNWAITED


@dataclass(frozen=True)
class Go:
    target: str
    victims: list[str]


@dataclass(frozen=True)
class Hold:
    """Nothing to swap now. `until`: decide again then (None: when something changes); `why` in words (the status).
    `target`: the want held; `hold_s`: how long its requests may be held to save the swap, as decided for it
    (None: not held by the swap hold)."""

    until: float | None
    why: str = ""
    target: str | None = None
    hold_s: float | None = None


@dataclass(frozen=True)
class Refuse:
    """The want cannot fit whatever is stopped: its requests are told why at once."""

    target: str
    why: str


Decision = Go | Hold | Refuse


def decide(wants: Iterable[Want], policy: ResidencyPolicy, *, holding: Collection[str], starting: Collection[str],
           fixed: Collection[str] = (), hold_s: float, now: float) -> Decision:
    ordered = sorted(wants, key=lambda w: (w.rank, w.since, w.name))
    held: Hold | None = None
    for w in ordered:
        if w.name in holding:
            continue  # it is starting or up already: its requests wait for readiness, not for a swap
        try:
            victims = policy.victims(w.name, holding, fixed=fixed)
        except NoRoom as e:
            return Refuse(w.name, str(e))
        if not victims:
            return Go(w.name, [])
        if held is not None:
            continue  # an earlier want waits for room: a later one does not take it first
        hold = _blocked(w, victims, policy, starting=starting, hold_s=hold_s, now=now)
        if hold is None:
            return Go(w.name, victims)
        held = hold
    return held or Hold(None)


def swap_cost(target: str, victims: Iterable[str], policy: ResidencyPolicy) -> float | None:
    """What stopping `victims` to start `target` costs in seconds: the target's load now and each victim's when it
    is wanted again, as learned from their own starts (an unknown one counts nothing; one already being stopped
    goes anyway, so its reload is not this swap's). None when no load time is known."""
    loads = [r.load_s for n in [target, *victims]
             if (r := policy.residents.get(n)) is not None and r.load_s is not None
             and (n == target or not r.draining)]
    return sum(loads) if loads else None


def hold_for(target: str, victims: Iterable[str], policy: ResidencyPolicy, hold_s: float) -> tuple[float, float | None]:
    """How long a foreground want may be held while a resident model serves (ski rental: as long as the swap
    costs, bounded by the configured `hold_s`), and the swap's cost (None: unknown, `hold_s` as configured)."""
    cost = swap_cost(target, victims, policy)
    return (hold_s if cost is None else min(hold_s, cost)), cost


def _blocked(w: Want, victims: list[str], policy: ResidencyPolicy, *, starting: Collection[str], hold_s: float,
             now: float) -> Hold | None:
    """Why stopping `victims` for `w` does not pay yet, or None when it does."""
    until = float("-inf")
    held: float | None = None  # the hold applied to w (the swap's cost or hold_s), when one applies
    cost: float | None = None
    for v in victims:
        r = policy.residents[v]
        if r.draining:
            continue  # already being stopped (idle, by hand): its memory is on its way out
        if v in starting:
            return Hold(None, f"{v} is starting: the swap that started finishes", w.name)
        if r.admitted:
            return Hold(None, f"{v} came up for {r.admitted} request(s) that have not begun", w.name)
        serving = policy.in_flight(v)
        if serving:
            if w.rank != FOREGROUND:
                return Hold(None, f"{v} is serving {serving} request(s): a background request never stops it", w.name)
            if held is None:
                held, cost = hold_for(w.name, victims, policy, hold_s)
            until = max(until, w.since + held)
        elif w.rank != FOREGROUND:
            # Idle only for a moment (an agent between two tool calls): likely wanted again soon. A lighter
            # request waits until it has been idle for the hold too, whatever the loads cost (module doc).
            held = hold_s
            until = max(until, r.last_used + hold_s)
        until = max(until, policy.resident_until(v))
    if until > now:
        worth = f" (~{cost:.1f} s: the load times learned)" if cost is not None else ""
        return Hold(until, f"held to save a swap{worth} until {until - now:.1f}s from now", w.name, held)
    return None
