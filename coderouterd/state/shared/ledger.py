"""The shared budget ledger's statements: reserve, settle, reclaim, read. Amounts are nano-USD integers.

Rows are keyed by (budget, period): a new month is a new row, so no reset job exists to race with spend
(a late reset erasing a new month's spend is a failure mode of shared ledgers that reset in place)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .db import scalar

if TYPE_CHECKING:
    from .db import Conn

NANO = 1_000_000_000


def to_nano(usd: float, *, up: bool = False) -> int:
    """USD as nano-USD; estimates round up (a reservation never holds less than it may cost)."""
    v = float(usd) * NANO
    return int(math.ceil(v - 1e-6)) if up else int(round(v))


def to_usd(nano: int) -> float:
    return nano / NANO


@dataclass(frozen=True, slots=True)
class Row:
    budget: str
    cap: int
    spent: int
    reserved: int


async def reserve(conn: Conn, *, rid: str, instance: str, period: str, budgets: list[tuple[str, int]], amount: int,
                  lease_s: float) -> str | None:
    """Hold `amount` on every (budget, cap) at once, or on none. None when granted, else the budget refusing."""
    budgets = sorted(budgets)
    cur = await conn.execute("SELECT cr_reserve(%s, %s, %s, %s, %s, %s, %s)",
                             (rid, instance, period, [b for b, _ in budgets], [c for _, c in budgets], amount,
                              float(lease_s)))
    return await scalar(cur)


async def settle(conn: Conn, *, rid: str, instance: str, period: str, budgets: list[tuple[str, int]],
                 actual: int) -> bool:
    """Move the hold to spent with the real cost (0 = cancelled). False when this id was settled before."""
    budgets = sorted(budgets)
    cur = await conn.execute("SELECT cr_settle(%s, %s, %s, %s, %s, %s)",
                             (rid, instance, period, [b for b, _ in budgets], [c for _, c in budgets], actual))
    return bool(await scalar(cur))


async def settle_draw(conn: Conn, *, rid: str, parent: str, instance: str, period: str, budgets: list[tuple[str, int]],
                      est: int, actual: int) -> bool:
    """Settle a request held against the allowance `parent` (the ledger was unreachable or slow for it)."""
    budgets = sorted(budgets)
    cur = await conn.execute("SELECT cr_settle_draw(%s, %s, %s, %s, %s, %s, %s, %s)",
                             (rid, parent, instance, period, [b for b, _ in budgets], [c for _, c in budgets], est,
                              actual))
    return bool(await scalar(cur))


def _flat(records: list[dict]) -> list[dict]:
    """A record with "more" (an offline team-key request: its key's part settles against the key's allowance)
    stands for itself and those."""
    return [x for r in records for x in (r, *(r.get("more") or ()))]


async def apply(conn: Conn, instance: str, record: dict) -> bool:
    """A settle as the journal keeps it (budget.py's record), applied again: the shipper's backstop."""
    for more in record.get("more") or ():
        await apply(conn, instance, more)
    budgets = [(str(b), int(c)) for b, c in record["budgets"]]
    if record.get("parent"):
        return await settle_draw(conn, rid=record["rid"], parent=record["parent"], instance=instance,
                                 period=record["period"], budgets=budgets, est=int(record.get("est") or 0),
                                 actual=int(record["actual"]))
    return await settle(conn, rid=record["rid"], instance=instance, period=record["period"], budgets=budgets,
                        actual=int(record["actual"]))


async def apply_many(conn: Conn, instance: str, records: list[dict]) -> None:
    """`apply` for a batch, pipelined (executemany): one round trip's wait for the lot, not one per settle."""
    plain, draws = [], []
    for r in _flat(records):
        budgets = sorted((str(b), int(c)) for b, c in r["budgets"])
        names, caps = [b for b, _ in budgets], [c for _, c in budgets]
        if r.get("parent"):
            draws.append((r["rid"], r["parent"], instance, r["period"], names, caps, int(r.get("est") or 0),
                          int(r["actual"])))
        else:
            plain.append((r["rid"], instance, r["period"], names, caps, int(r["actual"])))
    cur = conn.cursor()
    if plain:
        await cur.executemany("SELECT cr_settle(%s, %s, %s, %s, %s, %s)", plain)
    if draws:
        await cur.executemany("SELECT cr_settle_draw(%s, %s, %s, %s, %s, %s, %s, %s)", draws)


async def reclaim(conn: Conn) -> int:
    """Give back the holds whose lease ran out; any instance may run it. Returns how many."""
    cur = await conn.execute("SELECT cr_reclaim()")
    return int(await scalar(cur))


async def renew(conn: Conn, *, instance: str, ids: list[str], lease_s: float) -> int:
    """Extend the leases of the holds this process still has a use for (a long stream keeps its hold while the
    process lives). By id, never "every open row of this instance": a hold its process lost track of (a bug, an
    answer lost with its connection) would be renewed for as long as the process lives, lowering what is left
    for everyone; not renewed, it runs out with its lease and a peer (or this instance) reclaims it."""
    if not ids:
        return 0
    cur = await conn.execute(
        "UPDATE cr_reservation SET lease_until = now() + make_interval(secs => %s)"
        " WHERE instance = %s AND id = ANY(%s) AND settled_at IS NULL AND reclaimed_at IS NULL",
        (float(lease_s), instance, ids))
    return cur.rowcount


async def set_caps(conn: Conn, *, period: str, caps: dict[str, int]) -> None:
    """The configured caps for this period (a reload on any instance changes them for all: one ledger)."""
    for budget, cap in sorted(caps.items()):
        await conn.execute(
            "INSERT INTO cr_ledger (budget, period, cap) VALUES (%s, %s, %s)"
            " ON CONFLICT (budget, period) DO UPDATE SET cap = EXCLUDED.cap WHERE cr_ledger.cap <> EXCLUDED.cap",
            (budget, period, cap))


async def rows(conn: Conn, period: str) -> dict[str, Row]:
    cur = await conn.execute("SELECT budget, cap, spent, reserved FROM cr_ledger WHERE period = %s", (period,))
    return {r[0]: Row(*r) for r in await cur.fetchall()}


async def purge_done(conn: Conn, *, older_than_days: float = 7.0) -> int:
    """Settled and reclaimed reservation rows are kept a while (a repeated settle must find its row), then go."""
    cur = await conn.execute(
        "DELETE FROM cr_reservation WHERE (settled_at IS NOT NULL OR reclaimed_at IS NOT NULL)"
        " AND created_at < now() - make_interval(days => %s)", (int(older_than_days),))
    return cur.rowcount
