"""The budget guard over the shared ledger: what the request path calls when budgets are shared.

Reserve is one round trip (`ledger.reserve`), bounded by `[state] shared_timeout_ms`. Settle never makes a
request wait: it goes on a queue drained in order by one task, retried until the database takes it (a settle
is idempotent by reservation id, so a retry after a lost answer cannot charge twice). Its record also goes into
the request's journal row, and the journal shipper applies it again with the row: a settle lost with a killed
instance reaches the ledger when that instance's journal is shipped.

When the ledger cannot answer in time (down, or slow for this request), a paid request is held against this
instance's allowance: a reservation the instance took in the ledger in advance, of a tenth of what was left
divided by the live instances, renewed with its heartbeat and re-taken when half spent or too large for what is
left. Because the allowance is itself held in the ledger, what an instance spends blind can never be spent by a
peer too: N instances cut off at once still cannot overshoot the cap. The allowance's draws are settled against
it when the ledger answers again (`cr_settle_draw`); an allowance whose instance died is reclaimed like any
lease. Before the first contact there is no allowance: paid providers with a cap are refused until the ledger
has answered once. Uncapped budgets need no allowance (their rows are a report of who spent what).

A team key's budget is one more row ("key:<name>") in the same reservation: a request must fit its key's, its
provider's and the global cap at once. Offline, a key with a cap has an allowance of its own, taken the same way
once the key has been seen (before that, its paid requests are refused until the ledger answers, like a capped
provider before the first contact); an offline request of a key draws from both allowances, and its settle is
split in two (the provider's part, the key's part), each against its own allowance.

Every instance re-reads the ledger every `poll_s` (and after its own settles), which is what `allowed()` and the
status answer from; the reservation itself is the only check that counts.

No hold outlives what it was taken for (issue 41): the heartbeat renews only the ids in `held` (the requests'
reservations until their settle reaches the ledger, and the allowances), never "every open row of this process",
so a hold nobody here knows of any more runs out with its lease. An allowance never refuses a request that would
fit: a refusal by a budget this instance holds an allowance on gives the allowance back and asks once more."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from ..guards.budget import GLOBAL, KEY_PREFIX, Budget, Reservation, budget_words, key_budget, zero_words
from ..state.events import BudgetBlocked, BudgetWarning, Event
from ..state.shared import ledger
from ..state.shared.db import Database, Unavailable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..state.shared.db import Conn
    from ..tasks import TaskSet

# How long a stop waits for allowances being tended (release_allowances).
TEND_WAIT_ON_STOP_S = 2.0
# The allowance: this fraction of what is left per live instance, held in advance for blind spending.
ALLOWANCE_FRACTION = 10

log = logging.getLogger("coderouterd.shared")


def new_boot() -> str:
    """This process's part of its reservation ids: ids never repeat across restarts, and the heartbeat renews
    only this process's holds."""
    return f"{int(time.time() * 1000):x}{os.getpid():x}"


@dataclass(slots=True, eq=False)
class SharedReservation:
    provider: str
    estimate_usd: float
    billable: bool
    rid: str = ""
    period: str = ""
    budgets: list[tuple[str, int]] = field(default_factory=list)
    amount: int = 0
    offline: bool = False  # not held in the ledger by its own row (the ledger did not answer in time)
    parent: str = ""  # offline: the allowance it was drawn from ("" = an uncapped budget, nothing to draw from)
    done: bool = False
    key: str | None = None  # the team key whose budget ("key:<name>") is among `budgets`
    key_parent: str = ""  # offline: the key's allowance it was drawn from


class SharedBudget:
    def __init__(self, local: Budget, db: Database, *, instance: str, lease_s: float, tasks: TaskSet,
                 live_instances: Callable[[], int], publish: Callable[[Event], None] | None = None,
                 poll_s: float = 2.0, boot: str | None = None) -> None:
        """`local`: the configuration side of the budget (caps, which providers bill, estimates, the month).
        `live_instances`: how many instances heartbeat now (the offline share divides by it)."""
        self.local = local
        self.db = db
        self.instance = instance
        self.lease_s = lease_s
        self._tasks = tasks
        self._live = live_instances
        self._publish_fn = publish
        # Reservation ids must never repeat, across restarts too (a settle is idempotent by id).
        self._ids = itertools.count()
        self._boot = boot or new_boot()
        self.rows: dict[str, ledger.Row] = {}
        self.rows_period = ""
        self.rows_at: float | None = None
        self._settles: asyncio.Queue | None = None
        self._notified: dict[str, set[str]] = {"warned": set(), "blocked": set()}
        self._notified_period = ""
        self.poll_s = poll_s
        # provider (or "key:<name>") -> this instance's allowance (a reservation held in advance), and the estimates
        # drawn from it.
        self.allowances: dict[str, SharedReservation] = {}
        # Team keys seen by this instance, with their cap (nano-USD): those with a cap get an allowance.
        self._key_caps: dict[str, int] = {}
        self._stopping = False
        # Held while allowances are being tended (a reservation may be on its way to the ledger): a stop waits
        # for it, so what that tend takes is given back before the stop's drain, not after it.
        self._tending = asyncio.Lock()
        self._drawn: dict[str, int] = {}
        # Every hold this process has in the ledger under its own id (a request's reservation until its settle
        # reached the ledger, an allowance until it is given back): what the heartbeat renews, and nothing else.
        self.held: dict[str, SharedReservation] = {}
        self.offline_since: float | None = None
        self.refused = 0
        self.granted = 0
        self.fallbacks = 0
        db.on_change(self._db_changed)

    # -- configuration --------------------------------------------------------------------------------------

    def configure(self, providers: Mapping[str, Any], *, global_cap_usd: float, warn_ratio: float) -> None:
        self.local.configure(providers, global_cap_usd=global_cap_usd, warn_ratio=warn_ratio)
        if self._settles is not None:
            self._tasks.spawn(self._push_caps(), name="shared-budget-caps")

    def _caps(self) -> dict[str, int]:
        caps = {GLOBAL: ledger.to_nano(self.local.cap(GLOBAL))}
        for name in self._billable_names():
            caps[name] = ledger.to_nano(self.local.cap(name))
        return caps

    def _billable_names(self) -> list[str]:
        return [n for n in self.local.snapshot()["providers"] if self.local.is_billable(n)]

    async def _push_caps(self) -> None:
        period, _ = self.local.period()
        caps = self._caps()
        try:
            await self.db.run(lambda c: ledger.set_caps(c, period=period, caps=caps))
        except Unavailable:
            pass  # reserve() creates missing rows with the cap it knows; the next reload or start retries

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        settles: asyncio.Queue = asyncio.Queue()
        self._settles = settles
        await self._push_caps()
        await self.refresh()
        self._tasks.spawn(self._drain_settles(settles), name="shared-budget-settle")
        self._tasks.spawn(self._refresh_loop(), name="shared-budget-refresh")

    async def drain(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until every queued settle reached the ledger: a clean stop leaves no
        hold to be reclaimed. False if some are still queued."""
        if self._settles is None:
            return True
        try:
            await asyncio.wait_for(self._settles.join(), timeout_s)
            return True
        except TimeoutError:
            return False

    async def refresh(self) -> None:
        """Read this period's ledger rows (status, `allowed`, the offline share, notices)."""
        period, _ = self.local.period()
        try:
            rows = await self.db.run(lambda c: ledger.rows(c, period))
        except Unavailable:
            return
        self.rows, self.rows_period, self.rows_at = rows, period, time.time()
        self._check_notices()
        await self._tend_allowances()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.refresh()

    # -- the request path -----------------------------------------------------------------------------------

    def allowed(self, provider: str) -> bool:
        if not self.local.is_billable(provider):
            return True
        keys = self._keys(provider)
        if not any(cap > 0 for _, cap in keys):
            return True
        if self.offline_since is not None or self.rows_at is None or not self.db.up:
            return self._left(provider) > 0
        for budget, _cap in keys:
            row = self.rows.get(budget)
            if row is not None and row.spent + row.reserved >= row.cap > 0:
                return False
        return True

    async def reserve(self, provider: str, estimate_usd: float, *, key: str | None = None,
                      key_cap: float | None = None) -> Reservation | SharedReservation | None:
        """A SharedReservation (a provider that bills: the local Budget's own Reservation otherwise), or None
        when a cap would be exceeded. `key`: the team key that admitted the request (its budget applies too:
        `key_cap` None = none, 0 = free providers only)."""
        if not self.local.is_billable(provider):
            return self.local.reserve(provider, estimate_usd)
        if key is not None and key_cap is not None and key_cap <= 0:
            self.refused += 1
            return None
        period, _ = self.local.period()
        amount = ledger.to_nano(estimate_usd, up=True)
        budgets = self._keys(provider)
        if key is not None:
            budgets = sorted([*budgets, self._key_row(key, key_cap)])
        res = SharedReservation(provider, estimate_usd, True, rid=f"{self.instance}:{self._boot}:{next(self._ids)}",
                                period=period, budgets=budgets, amount=amount, key=key)
        if key is not None and self.offline_since is None:
            await self._key_cap_changed(key, period)
        if self.offline_since is None:
            try:
                refused = await self.db.bounded(
                    lambda c: ledger.reserve(c, rid=res.rid, instance=self.instance, period=period, budgets=budgets,
                                             amount=amount, lease_s=self.lease_s),
                    late=lambda refused: self._late(res, refused),
                    # Without an allowance to draw on, the fallback could only refuse: wait for the ledger.
                    wait_longer=lambda: self._left(provider) < amount)
            except Unavailable:
                self.fallbacks += 1
            else:
                if refused is not None and self._holds_allowance_on(refused):
                    refused = await self._reserve_without_allowances(res, refused)
                if refused is not None:
                    self.refused += 1
                    self._refused(refused)
                    return None
                self.granted += 1
                self.held[res.rid] = res
                self._booked(budgets, reserved=amount)
                return res
        # A new id: should the ledger's late answer grant the first one, that one is given back by its own id.
        return self._draw(replace(res, rid=f"{res.rid}d"))

    def _holds_allowance_on(self, budget: str) -> bool:
        return any(any(b == budget for b, _ in a.budgets) for a in self.allowances.values())

    async def _reserve_without_allowances(self, res: SharedReservation, refused: str) -> str | None:
        """The ledger refused `res` on a budget that this instance's own allowances hold part of: an allowance
        is kept for the ledger's outages and must never refuse a request that fits. They are given back and the
        reservation asked again, in one round trip; the next refresh takes smaller ones if anything is left.
        Returns the refusing budget, or None when granted."""
        mine = [a for a in self.allowances.values() if any(b == refused for b, _ in a.budgets)]
        for a in mine:
            self._retire(a)
        try:
            again = await self.db.bounded(lambda c: self._give_back_and_reserve(mine, res, c),
                                          late=lambda answer: self._late(res, answer))
        except Unavailable:
            return refused  # the allowances' give-back is queued already; this request stays refused
        return again

    async def _give_back_and_reserve(self, given: list[SharedReservation], res: SharedReservation,
                                     conn: Conn) -> str | None:
        for a in given:
            await ledger.settle(conn, rid=a.rid, instance=self.instance, period=a.period, budgets=a.budgets, actual=0)
        return await self._reserve_row(res, conn)

    def _retire(self, a: SharedReservation) -> None:
        """Give an allowance back (what is left of it; draws not settled yet are charged against it or, once it is
        gone, without a hold: cr_settle_draw)."""
        provider = a.provider
        a.done = True  # no request's: `in_flight` never counts it, while its give-back is on its way
        if self.allowances.get(provider) is a:
            self.allowances.pop(provider, None)
            left = a.amount - self._drawn.pop(provider, 0)
            self._booked(a.budgets, reserved=-max(left, 0))
        self._queue_settle(a, 0)

    def in_flight(self) -> list[SharedReservation]:
        """The requests' reservations this process holds in the ledger now (allowances aside)."""
        allowances = {a.rid for a in self.allowances.values()}
        return [r for rid, r in self.held.items() if rid not in allowances and not r.done]

    def held_ids(self) -> list[str]:
        """What the heartbeat renews: the ids of every hold this process still has a use for."""
        return list(self.held)

    async def release_allowances(self) -> None:
        """A clean stop: the allowances go back now, not when their lease runs out (and no new one is taken)."""
        self._stopping = True
        # A tend in flight may be taking an allowance: it gives it back once it sees the stop, and that settle
        # must be queued before the caller drains (else it is lost and the hold waits for its lease). Bounded: a
        # ledger that does not answer fails the tend within the shared timeout.
        try:
            await asyncio.wait_for(self._tending.acquire(), TEND_WAIT_ON_STOP_S)
        except TimeoutError:
            log.warning("shared budget: an allowance being taken did not finish before the stop")
        else:
            self._tending.release()
        for a in list(self.allowances.values()):
            self._retire(a)

    def settle(self, res: Reservation | SharedReservation, actual_usd: float) -> dict | None:
        """Queue the settle; returns its record, which the request's journal row keeps (the shipper applies it
        again with the row: idempotent, and durable as the journal is)."""
        if not isinstance(res, SharedReservation):
            self.local.settle(res, actual_usd)
            return None
        if res.done:
            return None
        res.done = True
        actual = ledger.to_nano(max(float(actual_usd or 0.0), 0.0))
        # Our own move, on the cached rows at once: an allowance draw leaves the allowance's hold, a reservation
        # its own; an uncapped offline request held nothing.
        held = res.amount if (not res.offline or res.parent) else 0
        if res.offline and res.key is not None:
            # Drawn from two allowances (or none): each part settles against its own.
            records = []
            for part in self._offline_parts(res):
                held = part.amount if part.parent else 0
                self._booked(part.budgets, reserved=-held, spent=actual)
                self._queue_settle(part, actual)
                records.append(self._record(part, actual))
            first = records[0]
            if len(records) > 1:
                first["more"] = records[1:]
            return first
        self._booked(res.budgets, reserved=-held, spent=actual)
        self._queue_settle(res, actual)
        return self._record(res, actual)

    @staticmethod
    def _record(res: SharedReservation, actual: int) -> dict:
        record = {"rid": res.rid, "period": res.period, "budgets": [list(b) for b in res.budgets], "actual": actual}
        if res.parent:
            record.update(parent=res.parent, est=res.amount)
        return record

    @staticmethod
    def _offline_parts(res: SharedReservation) -> list[SharedReservation]:
        """An offline request of a team key as two settles: its provider's and the global budget against the
        provider's allowance, its key's budget against the key's."""
        mine = [b for b in res.budgets if not b[0].startswith(KEY_PREFIX)]
        keys = [b for b in res.budgets if b[0].startswith(KEY_PREFIX)]
        return [replace(res, budgets=mine, key=None, key_parent=""),
                replace(res, rid=f"{res.rid}k", budgets=keys, parent=res.key_parent, key=None, key_parent="")]

    def cancel(self, res: Reservation | SharedReservation) -> dict | None:
        if isinstance(res, SharedReservation):
            return self.settle(res, 0.0)
        self.local.cancel(res)
        return None

    def record(self, provider: str, actual_usd: float) -> None:
        if not self.local.is_billable(provider):
            self.local.record(provider, actual_usd)
            return
        period, _ = self.local.period()
        res = SharedReservation(provider, 0.0, True, rid=f"{self.instance}:{self._boot}:{next(self._ids)}",
                                period=period, budgets=self._keys(provider), offline=True)
        self.settle(res, actual_usd)

    # -- reads ----------------------------------------------------------------------------------------------

    def spent_cap(self, provider: str) -> str | None:
        if not self.local.is_billable(provider):
            return None
        _, end = self.local.period()
        for budget, _cap in self._keys(provider):
            row = self.rows.get(budget)
            if row is not None and row.cap > 0 and row.spent >= row.cap:
                name = "global" if budget == GLOBAL else repr(budget)
                resets = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M UTC")
                return (f"the {name} monthly budget (shared) is spent ({ledger.to_usd(row.spent):.2f} of "
                        f"{ledger.to_usd(row.cap):.2f} USD); it resets {resets}")
        return None

    def too_dear(self, provider: str, estimate_usd: float, *, key: str | None = None,
                 key_cap: float | None = None) -> str | None:
        """Budget.too_dear over the shared ledger's rows (settled spend only): a request that cannot fit what is
        left of a shared cap before it resets, whatever else is in flight. None when it would fit."""
        if not self.local.is_billable(provider):
            return None
        if key is not None and key_cap is not None and key_cap <= 0:
            return zero_words(key)
        est = ledger.to_nano(estimate_usd, up=True)
        _, end = self.local.period()
        resets = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M UTC")
        budgets = self._keys(provider)
        if key is not None:
            budgets.append((key_budget(key), ledger.to_nano(key_cap or 0.0)))
        for budget, known_cap in budgets:
            row = self.rows.get(budget)
            if row is None or row.cap <= 0 or row.spent + est <= row.cap:
                continue
            if budget.startswith(KEY_PREFIX) and row.cap != known_cap:
                continue  # the key's cap changed and the row has not caught up: the reservation decides
            name = budget_words(budget)
            spent, cap = ledger.to_usd(row.spent), ledger.to_usd(row.cap)
            if row.spent >= row.cap:
                return f"the {name} monthly budget (shared) is spent ({spent:.2f} of {cap:.2f} USD); it resets {resets}"
            return (f"this request may cost up to {ledger.to_usd(est):.4f} USD, more than the "
                    f"{max(cap - spent, 0.0):.4f} USD left of the {name} monthly budget (shared; {spent:.2f} of "
                    f"{cap:.2f} USD spent; lower max_tokens or wait for the reset {resets})")
        return None

    def spent(self, provider: str | None = None) -> float:
        row = self.rows.get(GLOBAL if provider is None else provider)
        return ledger.to_usd(row.spent) if row is not None else 0.0

    def snapshot(self) -> dict:
        """The shape of Budget.snapshot, from the shared ledger, plus what this instance knows of it."""
        snap = self.local.snapshot()
        for name, entry in [("*", snap["global"]), *snap["providers"].items()]:
            row = self.rows.get(GLOBAL if name == "*" else name)
            if row is None or not (name == "*" or self.local.is_billable(name)):
                continue
            cap = ledger.to_usd(row.cap)
            spent = ledger.to_usd(row.spent)
            entry.update(spent=spent, cap=cap, reserved=ledger.to_usd(row.reserved),
                         ratio=spent / cap if cap > 0 else None,
                         blocked=row.cap > 0 and row.spent + row.reserved >= row.cap)
        snap["keys"] = {b[len(KEY_PREFIX):]: {"spent": ledger.to_usd(r.spent), "cap": ledger.to_usd(r.cap),
                                              "reserved": ledger.to_usd(r.reserved)}
                        for b, r in sorted(self.rows.items()) if b.startswith(KEY_PREFIX)}
        snap["shared"] = {
            "ledger_read_at": self.rows_at,
            "offline_since": self.offline_since,
            "allowances_usd": {p: {"held": ledger.to_usd(a.amount), "drawn": ledger.to_usd(self._drawn.get(p, 0))}
                               for p, a in self.allowances.items()},
            "settles_queued": self._settles.qsize() if self._settles is not None else 0,
            # Requests' reservations held now (allowances aside): 0 when nothing is in flight (issue 41).
            "reservations_in_flight": len(self.in_flight()),
            "granted": self.granted, "refused": self.refused, "fallbacks": self.fallbacks,
        }
        return snap

    @staticmethod
    def estimate(provider_cfg: Any, input_tokens: int, max_tokens: int) -> float:
        return Budget.estimate(provider_cfg, input_tokens, max_tokens)

    # -- internals ------------------------------------------------------------------------------------------

    def _keys(self, provider: str) -> list[tuple[str, int]]:
        # Every billable request counts toward its provider's row and the global one, capped or not: the rows
        # are also the shared report of who spent what.
        return sorted([(provider, ledger.to_nano(self.local.cap(provider))),
                       (GLOBAL, ledger.to_nano(self.local.cap(GLOBAL)))])

    def _key_row(self, key: str, key_cap: float | None) -> tuple[str, int]:
        cap = ledger.to_nano(key_cap or 0.0)  # a row's 0 is "no cap" (a zero budget never reaches the ledger)
        known = self._key_caps.get(key)
        self._key_caps[key] = cap
        if known is None and cap > 0 and self._settles is not None:
            # A key seen for the first time: its allowance now, not at the next poll (the ledger may go away).
            self._tasks.spawn(self._tend_allowances(), name="shared-budget-key-allowance")
        return key_budget(key), cap

    async def _key_cap_changed(self, key: str, period: str) -> None:
        """A key's cap changed (keys update) since its row was made: the row takes the new cap before this
        reservation is guarded by it. The reservation creates a missing row itself."""
        budget, cap = key_budget(key), self._key_caps.get(key, 0)
        row = self.rows.get(budget)
        if row is None or row.cap == cap:
            return
        try:
            await self.db.bounded(lambda c: ledger.set_caps(c, period=period, caps={budget: cap}))
        except Unavailable:
            return
        self.rows[budget] = ledger.Row(budget, cap, row.spent, row.reserved)

    def _booked(self, budgets: list[tuple[str, int]], *, reserved: int = 0, spent: int = 0) -> None:
        # Our own moves, applied to the cached rows at once: `allowed()` need not wait for the next read.
        for budget, cap in budgets:
            row = self.rows.get(budget) or ledger.Row(budget, cap, 0, 0)
            self.rows[budget] = ledger.Row(budget, row.cap, row.spent + spent, max(row.reserved + reserved, 0))

    def _late(self, res: SharedReservation, refused: str | None) -> None:
        # The ledger granted a reservation this request had stopped waiting for (it went on with the offline
        # share, was refused, or its client left): give the hold back now rather than when its lease runs out.
        if refused is None:
            res.done = True  # nobody's any more: only its give-back is left to do
            self.held[res.rid] = res
            self._queue_settle(res, 0)

    def _left(self, provider: str) -> int:
        a = self.allowances.get(provider)
        if a is None or a.period != self.local.period()[0]:
            return 0
        return a.amount - self._drawn.get(provider, 0)

    def _draw(self, res: SharedReservation) -> SharedReservation | None:
        """The ledger did not answer in time: hold the request against this instance's allowance (and, for a
        team key with a cap, against the key's allowance too)."""
        res.offline = True
        mine = any(cap > 0 for b, cap in res.budgets if not b.startswith(KEY_PREFIX))
        holder = key_budget(res.key) if res.key is not None else ""
        keyed = any(cap > 0 for b, cap in res.budgets if b == holder)
        if (mine and self._left(res.provider) < res.amount) or (keyed and self._left(holder) < res.amount):
            self.refused += 1
            return None
        if mine:
            self._drawn[res.provider] = self._drawn.get(res.provider, 0) + res.amount
            res.parent = self.allowances[res.provider].rid
        if keyed:
            self._drawn[holder] = self._drawn.get(holder, 0) + res.amount
            res.key_parent = self.allowances[holder].rid
        return res  # nothing capped: nothing to protect, the settle charges the cost when it can

    def _holder_budgets(self, holder: str) -> list[tuple[str, int]]:
        """What an allowance holds: a provider's and the global budget, or one team key's budget."""
        if holder.startswith(KEY_PREFIX):
            return [(holder, self._key_caps.get(holder[len(KEY_PREFIX):], 0))]
        return self._keys(holder)

    def _allowance_target(self, provider: str) -> int:
        live = max(int(self._live() or 1), 1)
        target = None
        for budget, cap in self._holder_budgets(provider):
            if cap <= 0:
                continue
            row = self.rows.get(budget)
            left = cap - (row.spent + row.reserved if row is not None else 0)
            share = max(left, 0) // (live * ALLOWANCE_FRACTION)
            target = share if target is None else min(target, share)
        return target or 0

    async def _tend_allowances(self) -> None:
        """Keep an allowance per capped billable provider: re-taken when half drawn, too large for what is left
        (a cap nearly spent must not sit in allowances), or of a past month."""
        async with self._tending:
            await self._tend_allowances_now()

    async def _tend_allowances_now(self) -> None:
        period, _ = self.local.period()
        holders = self._billable_names() + [key_budget(k) for k, cap in sorted(self._key_caps.items()) if cap > 0]
        for provider in holders:
            if self._stopping:
                return
            if not any(cap > 0 for _, cap in self._holder_budgets(provider)):
                continue
            target = self._allowance_target(provider)
            current = self.allowances.get(provider)
            if current is not None:
                left = current.amount - self._drawn.get(provider, 0)
                if current.period == period and left * 2 >= current.amount and current.amount <= 2 * target + 1:
                    continue
                self._retire(current)
            if target <= 0:
                continue
            res = SharedReservation(provider, ledger.to_usd(target), True,
                                    rid=f"{self.instance}:{self._boot}:a{next(self._ids)}", period=period,
                                    budgets=self._holder_budgets(provider), amount=target)
            # Held (renewed) from before the statement is sent: should its answer be lost (the statement done, the
            # connection gone) the id is still ours, and is given back below rather than kept by nobody.
            self.held[res.rid] = res
            try:
                refused = await self.db.run(partial(self._reserve_row, res))
            except Unavailable:
                self._queue_settle(res, 0)  # taken or not: a settle of an id with no hold charges nothing
                return
            except BaseException:
                self._queue_settle(res, 0)  # cancelled (a stop) while the ledger answered
                raise
            if refused is not None:
                self.held.pop(res.rid, None)
            elif self._stopping:
                self._queue_settle(res, 0)  # taken while the stop gave the others back: this one goes too
            else:
                self.allowances[provider] = res
                self._drawn[provider] = 0
                self._booked(res.budgets, reserved=res.amount)

    def _queue_settle(self, res: SharedReservation, actual: int) -> None:
        if self._settles is not None:
            self._settles.put_nowait((res, actual))

    async def _drain_settles(self, q: asyncio.Queue) -> None:
        delay = 0.05
        while True:
            res, actual = await q.get()
            while True:
                try:
                    await self.db.run(partial(self._settle_one, res, actual))
                    delay = 0.05
                    self.held.pop(res.rid, None)  # settled in the ledger: nothing left to renew
                    break
                except Unavailable:
                    # Kept in order and retried: the money was spent, the ledger must hear of it.
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            q.task_done()
            if q.empty() and (self.rows_at is None or time.time() - self.rows_at > 0.5):
                # Others' spend shows at the next read; a read after every settle would double the statements.
                await self.refresh()

    async def _reserve_row(self, res: SharedReservation, conn: Conn) -> str | None:
        return await ledger.reserve(conn, rid=res.rid, instance=self.instance, period=res.period,
                                    budgets=res.budgets, amount=res.amount, lease_s=self.lease_s)

    async def _settle_one(self, res: SharedReservation, actual: int, conn: Conn) -> bool:
        if res.parent:
            return await ledger.settle_draw(conn, rid=res.rid, parent=res.parent, instance=self.instance,
                                            period=res.period, budgets=res.budgets, est=res.amount, actual=actual)
        return await ledger.settle(conn, rid=res.rid, instance=self.instance, period=res.period,
                                   budgets=res.budgets, actual=actual)

    def _db_changed(self, up: bool) -> None:
        if not up:
            self._go_offline()
        elif self.offline_since is not None:
            log.info("shared budget: ledger reachable again after %.1f s; offline spend is being charged",
                     time.time() - self.offline_since)
            self.offline_since = None
            # The queued settles of offline reservations charge the ledger; holds still open keep their share
            # accounting until they settle, so a new online reservation cannot double-count them.
            self._tasks.spawn(self.refresh(), name="shared-budget-refresh")

    def _go_offline(self) -> None:
        if self.offline_since is not None:
            return
        self.offline_since = time.time()
        log.warning("shared budget: ledger unreachable; paid requests are held against this instance's allowance "
                    "(%s)", ", ".join(f"{p}: {ledger.to_usd(a.amount - self._drawn.get(p, 0)):.4f} USD left"
                                      for p, a in self.allowances.items()) or "none: capped paid providers refused")

    def _refused(self, budget: str) -> None:
        row = self.rows.get(budget)
        if row is not None and row.cap > 0 and row.spent >= row.cap:
            self._notify("blocked", budget, row)

    def _check_notices(self) -> None:
        if self._notified_period != self.rows_period:
            self._notified_period = self.rows_period
            self._notified = {"warned": set(), "blocked": set()}
        ratio = self.local.warn_ratio
        for budget, row in self.rows.items():
            if row.cap <= 0:
                continue
            if row.spent >= row.cap * ratio:
                self._notify("warned", budget, row)
            if row.spent >= row.cap:
                self._notify("blocked", budget, row)

    def _notify(self, what: str, budget: str, row: ledger.Row) -> None:
        seen = self._notified[what]
        if budget in seen:
            return
        seen.add(budget)
        spent, cap = ledger.to_usd(row.spent), ledger.to_usd(row.cap)
        if what == "blocked":
            log.warning("budget: %s reached its shared monthly cap (%.4f of %.2f USD); skipping it", budget, spent,
                        cap)
            event: Event = BudgetBlocked(provider=budget, spent_usd=spent, cap_usd=cap)
        else:
            event = BudgetWarning(provider=budget, spent_usd=spent, cap_usd=cap, ratio=spent / cap)
        if self._publish_fn is not None:
            try:
                self._publish_fn(event)
            except Exception:
                log.exception("budget: publishing %s failed", event.kind)
