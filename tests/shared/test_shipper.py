"""The journal shipper on a real PostgreSQL: rows shipped once whatever is retried, the high-water mark read
back from the shared journal, and the settles a row carries applied with it (the instance that made them may
have died before its own settle reached the ledger)."""

from __future__ import annotations

import asyncio
import time

import psycopg

from coderouterd.state.events import RequestFinished
from coderouterd.state.shared import ledger
from coderouterd.state.shared.db import Database
from coderouterd.state.shared.schema import migrate
from coderouterd.state.shared.shipper import Shipper
from coderouterd.state.store import Store
from coderouterd.tasks import TaskSet


def _journal(path, events):
    store = Store(path)
    store.open()
    store.journal_sink()(events)
    store.close()


def _event(i, settles=()):
    return RequestFinished(request_id=f"r{i}", ingress="openai", profile="default", provider="paid", ts=time.time(),
                           cost_usd=0.5, settles=list(settles))


def test_rows_ship_once_and_carry_their_settles(pg_dsn, tmp_path):
    db_path = tmp_path / "state.db"
    b = [("*", 10 * ledger.NANO)]

    async def go():
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as c:
            await migrate(c)
            # A reservation whose instance died after the answer, before its settle reached the ledger.
            assert await ledger.reserve(c, rid="dead:1:0", instance="a", period="2026-12", budgets=b,
                                        amount=ledger.NANO, lease_s=30) is None
        settle = {"rid": "dead:1:0", "period": "2026-12", "budgets": [["*", 10 * ledger.NANO]],
                  "actual": ledger.NANO // 2}
        _journal(db_path, [_event(0, [settle]), *(_event(i) for i in range(1, 5))])
        tasks = TaskSet()
        db = Database(pg_dsn, timeout_s=1, tasks=tasks)
        await db.open()
        try:
            first = Shipper(db, db_path, instance="a", interval_s=1)
            n1 = await first.ship_once()
            # A restart that lost its high-water mark (it only lives in memory): read back, nothing resent.
            again = Shipper(db, db_path, instance="a", interval_s=1)
            n2 = await again.ship_once()
            # Even a shipper that resends everything (its commit's answer lost) doubles nothing.
            from coderouterd.state.shared.shipper import read_local, ship

            rows = read_local(db_path, 0)
            dup = await db.run(lambda c: ship(c, "a", rows))
            _journal(db_path, [_event(5)])
            n3 = await again.ship_once()
        finally:
            await tasks.close()
            await db.close()
        return n1, n2, dup, n3, again.hwm

    n1, n2, dup, n3, hwm = asyncio.run(go())
    assert (n1, n2, dup, n3, hwm) == (5, 0, 0, 1, 6)
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT count(*), count(DISTINCT seq) FROM cr_journal").fetchone() == (6, 6)
        spent, reserved = c.execute("SELECT spent, reserved FROM cr_ledger WHERE budget = '*'").fetchone()
        # Applied once, though the row was shipped (and its settle applied) twice.
        assert (spent, reserved) == (ledger.NANO // 2, 0)
