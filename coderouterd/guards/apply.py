"""Applying the guards to a live request: the tool-loop guard before routing, budget reservations around
each paid attempt."""

from __future__ import annotations

import logging
from inspect import isawaitable
from typing import TYPE_CHECKING

import orjson

from ..providers.errors import BUDGET, BUDGET_FINAL, UpstreamError
from ..state import cost_usd
from . import tool_loop
from .budget import Budget, BudgetSkips

if TYPE_CHECKING:
    from ..providers.provider import Provider
    from ..routing.executor import Exchange

log = logging.getLogger("coderouterd.guards")


def _report_tool_loop(ex: Exchange, publish) -> tool_loop.LoopFinding | None:
    """Check the request's history; a finding goes into the record's trace and out as a GuardFired event."""
    cfg = ex.profile.tool_loop
    req = ex.req
    finding = tool_loop.check(req.ingress, req.body, cfg)
    if finding is None:
        return None
    ex.record.guard_fired({"guard": tool_loop.GUARD_NAME, "action": cfg.action, "message": finding.message(),
                           **finding.detail()})  # the trace (`corectl explain`, the dashboard) tells it
    if publish is not None:
        publish(finding.event(req.request_id, cfg.action))
    return finding


async def apply_tool_loop(ex: Exchange, publish) -> bool:
    """Before routing: True when the guard answered the request itself (action = break). With action = warn
    nothing is decided here: a warning changes nothing about the request, so `warn_tool_loop` checks once the
    answer is out (issue 36: a feature that cannot change the answer does not delay it)."""
    cfg = ex.profile.tool_loop
    if cfg.action == "warn":
        return False
    finding = _report_tool_loop(ex, publish)
    if finding is None:
        return False
    if cfg.action == "inject":
        req = ex.req
        req.body = tool_loop.inject(req.ingress, req.body, finding)
        req.raw = orjson.dumps(req.body)
        return False
    ex.record.end(400, "tool_loop")
    await ex.sink.error(400, finding.message(), kind="invalid_request_error",
                        headers={"x-coderouter-profile": ex.profile_name}, extra={"detail": finding.detail()})
    return True


def warn_tool_loop(ex: Exchange, publish) -> None:
    """After the answer, before the request's record is finished (so its trace and journal show the warning):
    the check of a profile whose tool_loop action is warn."""
    if ex.profile.tool_loop.action != "warn":
        return
    finding = _report_tool_loop(ex, publish)
    if finding is not None:
        log.warning("%s %s (profile %s)", ex.req.request_id, finding.message(), ex.profile_name)


class BudgetHooks:
    """Reserve a worst-case estimate before a paid call and settle with the real cost after, so concurrent
    requests cannot overshoot a cap together."""

    def __init__(self, budget, skips: BudgetSkips | None = None) -> None:
        """`budget`: guards.budget.Budget (this machine), or cluster.budget.SharedBudget (a shared ledger,
        whose reserve is awaited). `skips`: where refusals for a request's worst-case cost are counted (the
        availability verdict's words read them: routing/availability.py)."""
        self.budget = budget
        self.skips = skips if skips is not None else BudgetSkips()

    def allowed(self, provider: str) -> bool:
        return self.budget.allowed(provider)

    def spent_cap(self, provider: str) -> str | None:
        return self.budget.spent_cap(provider)

    async def reserve(self, provider: Provider, req):
        cfg = provider.cfg
        if not cfg.paid:
            return None
        max_tokens = req.body.get("max_tokens") or req.body.get("max_completion_tokens") or 4096
        est = Budget.estimate(cfg, provider.estimate_tokens(len(req.raw)), int(max_tokens))
        key = req.key
        if key is None:
            res = self.budget.reserve(provider.name, est)
        else:  # the key's own budget applies too (its spend is kept even without a cap)
            res = self.budget.reserve(provider.name, est, key=key.name, key_cap=key.monthly_usd)
        if isawaitable(res):
            res = await res
        if res is None:
            final = self.budget.too_dear(provider.name, est)
            if final is not None:
                # The provider's own (or the global) cap cannot fit this estimate: counted, so every view can say
                # it is skipped. A key's cap, or others' reservations in flight, say nothing of the provider.
                left = getattr(self.budget, "left", None)  # a shared ledger does not say: the words use the estimate
                self.skips.skipped(provider.name, est, left(provider.name) if left is not None else None)
            if key is not None:
                final = self.budget.too_dear(provider.name, est, key=key.name, key_cap=key.monthly_usd)
            if final is not None:  # this request cannot fit before the reset, whatever else is in flight
                raise UpstreamError(BUDGET, message=final, error_type=BUDGET_FINAL)
            whose = f"team key {key.name!r} or {provider.name}" if key is not None else provider.name
            raise UpstreamError(BUDGET, message=f"monthly budget for {whose} would be exceeded")
        self.skips.admitted(provider.name)
        return res

    def settle(self, reservation, provider: Provider, usage: dict | None) -> dict | None:
        """None, or (shared ledger) the settle's record, which the request's journal row carries."""
        if reservation is None:
            return None
        if usage is None:
            return self.budget.cancel(reservation)
        try:
            actual = cost_usd(usage, provider.cfg.cost)
        except (TypeError, ValueError, OverflowError):
            # Usage the upstream garbled (a string, an object, an infinite count): charged at the worst case it was
            # reserved for. Raising here would leave the reservation held for good (issue 41).
            log.warning("%s reported usage that cannot be priced; charged its reserved estimate", provider.name)
            actual = reservation.estimate_usd
        return self.budget.settle(reservation, actual)
