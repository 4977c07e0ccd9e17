"""The budget guard over the shared ledger: what the request path calls when budgets are shared.

Reserve is one round trip (`ledger.reserve`), bounded by `[state] shared_timeout_ms`. Settle never makes a
request wait: it goes on a queue drained in order by one task, retried until the database takes it (a settle
is idempotent by reservation id, so a retry after a lost answer cannot charge twice).

When the database is down (or too slow for this request), a paid request is held against a conservative local
share: what the ledger had left when it was last seen, divided by the instances alive then. Spent offline is
charged to the ledger when it returns (the queued settles), so the ledger ends up with every cent; the share is
what keeps N instances, each blind to the others, from spending N times the remainder meanwhile. Nothing is
known before the first contact: then paid providers are refused until the ledger has been read once.

Every instance reads the ledger every `poll_s` (and after its own settles), which is what `allowed()` and the
status answer from; the reservation itself is the only check that counts."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ...guards.budget import GLOBAL, Budget
from ..events import BudgetBlocked, BudgetWarning, Event
from . import ledger
from .db import Database, Unavailable

log = logging.getLogger("coderouterd.shared")


@dataclass(slots=True, eq=False)
class SharedReservation:
    provider: str
    estimate_usd: float
    billable: bool
    rid: str = ""
    period: str = ""
    budgets: list[tuple[str, int]] = field(default_factory=list)
    amount: int = 0
    offline: bool = False  # held against the local share, not the ledger
    done: bool = False


class SharedBudget:
    def __init__(self, local: Budget, db: Database, *, instance: str, lease_s: float, tasks,
                 live_instances: Callable[[], int], publish: Callable[[Event], None] | None = None) -> None:
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
        self._boot = f"{int(time.time() * 1000):x}{os.getpid():x}"
        self.rows: dict[str, ledger.Row] = {}
        self.rows_period = ""
        self.rows_at: float | None = None
        self._settles: asyncio.Queue | None = None
        self._notified: dict[str, set[str]] = {"warned": set(), "blocked": set()}
        self._notified_period = ""
        # The offline share: budget -> nano-USD this instance may still hold, and what it holds against it.
        self._share: dict[str, int] = {}
        self._offline_used: dict[str, int] = {}
        self.offline_since: float | None = None
        self.refused = 0
        self.granted = 0
        self.fallbacks = 0
        db.on_change(self._db_changed)

    # -- configuration --------------------------------------------------------------------------------------

    def configure(self, providers, *, global_cap_usd: float, warn_ratio: float) -> None:
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
        self._settles = asyncio.Queue()
        await self._push_caps()
        await self.refresh()
        self._tasks.spawn(self._drain_settles(), name="shared-budget-settle")

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

    # -- the request path -----------------------------------------------------------------------------------

    def allowed(self, provider: str) -> bool:
        if not self.local.is_billable(provider):
            return True
        for budget, cap in self._keys(provider):
            if cap <= 0:
                continue
            if self.offline_since is not None or self.rows_at is None:
                if self._offline_used.get(budget, 0) >= self._share_of(budget):
                    return False
                continue
            row = self.rows.get(budget)
            if row is not None and row.spent + row.reserved >= row.cap > 0:
                return False
        return True

    async def reserve(self, provider: str, estimate_usd: float):
        """A SharedReservation, or None when a cap would be exceeded."""
        if not self.local.is_billable(provider):
            return self.local.reserve(provider, estimate_usd)
        period, _ = self.local.period()
        amount = ledger.to_nano(estimate_usd, up=True)
        budgets = self._keys(provider)
        res = SharedReservation(provider, estimate_usd, True, rid=f"{self.instance}:{self._boot}:{next(self._ids)}",
                                period=period, budgets=budgets, amount=amount)
        if self.offline_since is None:
            try:
                refused = await self.db.bounded(
                    lambda c: ledger.reserve(c, rid=res.rid, instance=self.instance, period=period, budgets=budgets,
                                             amount=amount, lease_s=self.lease_s),
                    late=lambda refused: self._late(res, refused))
            except Unavailable:
                self.fallbacks += 1
            else:
                if refused is not None:
                    self.refused += 1
                    self._refused(refused)
                    return None
                self.granted += 1
                self._booked(budgets, reserved=amount)
                return res
        return self._reserve_offline(res)

    def settle(self, res, actual_usd: float) -> None:
        if not isinstance(res, SharedReservation):
            self.local.settle(res, actual_usd)
            return
        if res.done:
            return
        res.done = True
        actual = ledger.to_nano(max(float(actual_usd or 0.0), 0.0))
        if res.offline:
            for budget, _ in res.budgets:
                self._offline_used[budget] = self._offline_used.get(budget, 0) - res.amount + actual
        else:
            self._booked(res.budgets, reserved=-res.amount, spent=actual)
        self._queue_settle(res, actual)

    def cancel(self, res) -> None:
        self.settle(res, 0.0) if isinstance(res, SharedReservation) else self.local.cancel(res)

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
        snap["shared"] = {
            "ledger_read_at": self.rows_at,
            "offline_since": self.offline_since,
            "offline_share_usd": {k: ledger.to_usd(v) for k, v in self._share.items()} if self.offline_since else {},
            "offline_used_usd": ({k: ledger.to_usd(v) for k, v in self._offline_used.items()}
                                 if self.offline_since else {}),
            "settles_queued": self._settles.qsize() if self._settles is not None else 0,
            "granted": self.granted, "refused": self.refused, "fallbacks": self.fallbacks,
        }
        return snap

    @staticmethod
    def estimate(provider_cfg, input_tokens: int, max_tokens: int) -> float:
        return Budget.estimate(provider_cfg, input_tokens, max_tokens)

    # -- internals ------------------------------------------------------------------------------------------

    def _keys(self, provider: str) -> list[tuple[str, int]]:
        # Every billable request counts toward its provider's row and the global one, capped or not: the rows
        # are also the shared report of who spent what.
        return sorted([(provider, ledger.to_nano(self.local.cap(provider))),
                       (GLOBAL, ledger.to_nano(self.local.cap(GLOBAL)))])

    def _booked(self, budgets, *, reserved: int = 0, spent: int = 0) -> None:
        # Our own moves, applied to the cached rows at once: `allowed()` need not wait for the next read.
        for budget, cap in budgets:
            row = self.rows.get(budget) or ledger.Row(budget, cap, 0, 0)
            self.rows[budget] = ledger.Row(budget, row.cap, row.spent + spent, max(row.reserved + reserved, 0))

    def _late(self, res: SharedReservation, refused: str | None) -> None:
        # The ledger granted a reservation this request had stopped waiting for (it went on with the offline
        # share): give the hold back now rather than when its lease runs out.
        if refused is None:
            self._queue_settle(res, 0)

    def _share_of(self, budget: str) -> int:
        """What this instance may hold without the ledger: fixed when the database went down; for a database
        that is only slow, the same division over the newest rows read (ours included)."""
        if self.offline_since is not None:
            return self._share.get(budget, 0)
        row = self.rows.get(budget)
        if row is None or self.rows_at is None:
            return 0
        if row.cap <= 0:
            return 1 << 62
        return max(row.cap - row.spent - row.reserved, 0) // max(int(self._live() or 1), 1)

    def _reserve_offline(self, res: SharedReservation):
        for budget, cap in res.budgets:
            if cap > 0 and self._offline_used.get(budget, 0) + res.amount > self._share_of(budget):
                self.refused += 1
                return None
        for budget, _ in res.budgets:
            self._offline_used[budget] = self._offline_used.get(budget, 0) + res.amount
        res.offline = True
        return res

    def _queue_settle(self, res: SharedReservation, actual: int) -> None:
        if self._settles is not None:
            self._settles.put_nowait((res, actual))

    async def _drain_settles(self) -> None:
        q = self._settles
        delay = 0.05
        while True:
            res, actual = await q.get()
            while True:
                try:
                    await self.db.run(lambda c, r=res, a=actual: ledger.settle(
                        c, rid=r.rid, instance=self.instance, period=r.period, budgets=r.budgets, actual=a))
                    delay = 0.05
                    break
                except Unavailable:
                    # Kept in order and retried: the money was spent, the ledger must hear of it.
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            q.task_done()
            if q.empty():
                await self.refresh()

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
        live = max(int(self._live() or 1), 1)
        share = {}
        if self.rows_at is not None:
            for budget, row in self.rows.items():
                if row.cap > 0:
                    share[budget] = max(row.cap - row.spent - row.reserved, 0) // live
                else:
                    share[budget] = 1 << 62  # uncapped: only a report, nothing to protect
        self._share = share
        self._offline_used = {}
        log.warning("shared budget: ledger unreachable; this instance holds paid requests against 1/%d of what "
                    "was left (%s)", live, ", ".join(f"{k}: {ledger.to_usd(v):.4f} USD" for k, v in share.items()
                                                     if v < 1 << 62) or "nothing capped")

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
