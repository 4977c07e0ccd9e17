"""The journal, shipped: each instance writes its journal to its own SQLite first (a request never waits on
the network to be recorded), and this ships the rows in batches to the shared journal.

A batch is COPYed into a session-local staging table, then `INSERT ... ON CONFLICT (instance, seq) DO NOTHING`,
in one transaction. The high-water mark (the last local row id shipped) moves only after that commit, and at
start it is read back from the shared journal itself: a batch whose commit was lost is sent again and its rows
that did land are skipped; nothing is lost, nothing is there twice, whichever side was killed."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from ..journal import JOURNAL_COLUMNS
from . import ledger
from .db import Database, Unavailable, scalar

if TYPE_CHECKING:
    from .db import Conn

log = logging.getLogger("coderouterd.shared")

BATCH = 2000
_COLS = ", ".join(JOURNAL_COLUMNS)
_STAGE = ("CREATE TEMP TABLE IF NOT EXISTS cr_journal_stage (LIKE cr_journal INCLUDING DEFAULTS)"
          " ON COMMIT DELETE ROWS")


def read_local(db_path: Path, after: int, limit: int = BATCH) -> list[tuple]:
    """(seq, *columns) of local journal rows after `after`, oldest first (in a thread: sqlite3 blocks)."""
    if not db_path.is_file():
        return []
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        return conn.execute(f"SELECT id, {_COLS}, settles FROM journal WHERE id > ? ORDER BY id LIMIT ?",
                            (after, limit)).fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
    finally:
        conn.close()


async def high_water(conn: Conn, instance: str) -> int:
    cur = await conn.execute("SELECT coalesce(max(seq), 0) FROM cr_journal WHERE instance = %s", (instance,))
    return int(await scalar(cur))


async def ship(conn: Conn, instance: str, rows: list[tuple]) -> int:
    """One batch in one transaction; returns how many rows were new to the shared journal. Rows are
    (seq, *columns, settles): the budget settles a row carries are applied in the same transaction (a settle is
    idempotent by reservation id, so one the instance made itself changes nothing; one that died with it, killed
    between the answer and its settle, reaches the ledger with the row)."""
    async with conn.transaction():
        await conn.execute(_STAGE)
        cur = conn.cursor()
        async with cur.copy(f"COPY cr_journal_stage (instance, seq, {_COLS}) FROM STDIN") as copy:
            for row in rows:
                await copy.write_row((instance, *row[:-1]))
        cur = await conn.execute(f"INSERT INTO cr_journal (instance, seq, {_COLS})"
                                 f" SELECT instance, seq, {_COLS} FROM cr_journal_stage"
                                 " ON CONFLICT (instance, seq) DO NOTHING")
        inserted = cur.rowcount
        await ledger.apply_many(conn, instance, [s for row in rows for s in _settles(row[-1])])
        return inserted


def _settles(raw: str | bytes | None) -> list[dict]:
    if not raw:
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return [s for s in value if isinstance(s, dict) and {"rid", "period", "budgets", "actual"} <= s.keys()] \
        if isinstance(value, list) else []


async def _ship_as(instance: str, rows: list[tuple], conn: Conn) -> int:
    return await ship(conn, instance, rows)


class Shipper:
    def __init__(self, db: Database, local_db: Path, *, instance: str, interval_s: float) -> None:
        self.db = db
        self.local_db = local_db
        self.instance = instance
        self.interval_s = interval_s
        self.hwm: int | None = None  # None: not read back from the shared journal yet
        self.shipped = 0
        self.last_ship: float | None = None
        self.behind = 0  # local rows known not shipped yet (lag, for status)
        self.problem: str | None = None

    def status(self) -> dict:
        return {"shipped": self.shipped, "high_water": self.hwm, "behind": self.behind,
                "last_ship": self.last_ship, "problem": self.problem}

    async def ship_once(self, *, final: bool = False) -> int:
        """Ship everything local that is newer than the high-water mark; returns rows shipped."""
        total = 0
        try:
            if self.hwm is None:
                self.hwm = await self.db.run(lambda c: high_water(c, self.instance))
            while True:
                rows = await asyncio.to_thread(read_local, self.local_db, self.hwm)
                if not rows:
                    self.behind = 0
                    break
                await self.db.run(partial(_ship_as, self.instance, rows), timeout_s=2.0 if final else 30.0)
                self.hwm = rows[-1][0]  # only now: the batch is committed
                total += len(rows)
                self.behind = len(rows) if len(rows) == BATCH else 0
                if len(rows) < BATCH:
                    break
            self.problem = None
        except Unavailable as e:
            self.problem = str(e)[:200]
        except sqlite3.Error as e:
            self.problem = f"local journal: {e}"[:200]
        if total:
            self.shipped += total
            self.last_ship = time.time()
        return total

    async def run(self) -> None:
        while True:
            await self.ship_once()
            await asyncio.sleep(self.interval_s)
