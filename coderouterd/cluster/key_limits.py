"""Team keys' rate limits across instances sharing PostgreSQL: a limit belongs to the key, not to the instance.

rpm and tpm: an instance takes a *chunk* of the key's window from the database (`cr_rate_take`) and serves from
it without asking again while the chunk lasts. A chunk may be used for CHUNK_LIFE_S seconds from its grant; the
database counts it for 60 s beyond that (its window spans WINDOW_S + CHUNK_LIFE_S), so a request served from it
at any moment of its life is counted for the whole minute after: the key's requests in any 60-second window, on
all instances together, never exceed the limit. What a chunk did not use goes back when its life is over. A chunk
is a share of the limit per live instance (CHUNK_DIV), at least what the request needs: most requests of a busy
key take nothing from the database; a request that needs a new chunk waits one round trip, at most the shared
timeout (decisions.md, "Team keys' rate limits across instances", has the measurement).

concurrency: an instance holds slots of the key under a lease (`cr_slot_take`), renewed while it lives; a request
uses a held slot that is free or takes one more. Slots idle for SLOT_LINGER_S go back, so another instance can
take them; a dead instance's slots count for nothing once its lease runs out.

The local windows (keys/limits.py) run beside: what this instance alone has used is refused without asking
anyone, and they give the rate-limit headers and the dashboard's "rate now".

When the database is down or slow: the rule of the shared budget (cluster/budget.py). What this instance holds in
advance (a live chunk, slots under a live lease) is used; past that, the key's requests are refused (429) until
the database answers again, and before the first contact nothing is held. No number of instances cut off at once
can together exceed a key's limit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from ..keys.limits import CONCURRENCY, RPM, TPM, WINDOW_S, Admission, KeyLimits, Refusal
from ..state.shared.db import Database, Unavailable, scalar

if TYPE_CHECKING:
    from ..keys.model import TeamKey
    from ..state.shared.db import Conn
    from ..tasks import TaskSet

log = logging.getLogger("coderouterd.shared")

CHUNK_LIFE_S = 5.0
SPAN_S = WINDOW_S + CHUNK_LIFE_S
# A chunk is the limit divided by (live instances × CHUNK_DIV), at least what the request needs.
CHUNK_DIV = 4
SLOT_LINGER_S = 2.0
TEND_EVERY_S = 1.0
# What a refusal asks a client to wait when the database cannot be asked (it is down or slow).
OFFLINE_RETRY_S = 2.0
# After the database refused a key's chunk, this instance refuses that key by itself for this long at most (or
# until the wait the database gave is over): a client hammering a spent window costs the database one round trip
# a second per instance, not one per request.
REFUSED_MEMO_S = 1.0


@dataclass(slots=True, eq=False)
class Chunk:
    grant_id: int
    amount: int
    left: int
    until: float  # this instance's clock: the chunk is not used after this
    returned: bool = False


@dataclass(slots=True)
class KeySlots:
    held: int = 0
    busy: int = 0
    until: float = 0.0  # this instance's clock: the lease's end as last renewed
    idle_since: float = 0.0
    limit: int = 0


@dataclass(slots=True, eq=False)
class SharedPart:
    """What a request took from the shared limits, given back or corrected when it ends."""

    key: str
    slot: bool = False
    tokens: Chunk | None = None
    overage: list[int] = field(default_factory=list)


class SharedKeyLimits:
    def __init__(self, db: Database, *, instance: str, lease_s: float, tasks: TaskSet,
                 live_instances: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.local = KeyLimits(clock)
        self.db = db
        self.instance = instance
        self.lease_s = lease_s
        self._tasks = tasks
        self._live = live_instances
        self.clock = clock
        self.chunks: dict[tuple[str, str], Chunk] = {}
        # (key, kind) -> (refuse by ourselves until, the database's wait ends at), both on this instance's clock
        self._refused_until: dict[tuple[str, str], tuple[float, float]] = {}
        self.slots: dict[str, KeySlots] = {}
        self._started = False
        self.asked = 0  # round trips the request path waited for (bench, status)
        self.refused_offline = 0

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._tasks.spawn(self._tend_loop(), name="shared-key-limits")

    async def stop(self) -> None:
        """A clean stop: held slots and chunks' unused parts go back now, not when their lease runs out."""
        for chunk in list(self.chunks.values()):
            await self._give_back_chunk(chunk)
        self.chunks.clear()
        for key, s in list(self.slots.items()):
            if s.held:
                await self._give_slots(key, s.held)
        self.slots.clear()

    # -- the request path -----------------------------------------------------------------------------------

    def limited(self, key: TeamKey) -> bool:
        return self.local.limited(key)

    async def admit(self, key: TeamKey, tokens: int) -> Admission | Refusal:
        refused = self.local.check(key, tokens)  # this instance alone is over: nobody else need be asked
        if refused is not None:
            return refused
        part = SharedPart(key.name)
        if key.concurrency is not None:
            refused = await self._take_slot(key)
            if refused is not None:
                return refused
            part.slot = True
        if key.rpm is not None:
            got = await self._take(key, "r", key.rpm, 1)
            if isinstance(got, Refusal):
                self._undo(part, key)
                return got
        if key.tpm is not None:
            got = await self._take(key, "t", key.tpm, tokens)
            if isinstance(got, Refusal):
                self._undo(part, key, rpm=key.rpm is not None)
                return got
            part.tokens = got
        adm = self.local.book(key, tokens)
        adm.shared = part
        return adm

    def release(self, adm: Admission, actual_tokens: int | None) -> None:
        if adm.done:
            return
        self.local.release(adm, actual_tokens)
        part = adm.shared
        if not isinstance(part, SharedPart):
            return
        if part.slot:
            s = self.slots.get(part.key)
            if s is not None:
                s.busy = max(s.busy - 1, 0)
                if s.busy < s.held:
                    s.idle_since = self.clock()
        if actual_tokens is not None and part.tokens is not None:
            diff = actual_tokens - adm.estimate
            chunk = part.tokens
            if diff < 0 and not chunk.returned and self.clock() < chunk.until:
                chunk.left -= diff  # what the estimate held too much is the chunk's again
            elif diff > 0:
                # The estimate was low: the rest is counted now (a grant taken without a check).
                self._tasks.spawn(self._charge(part.key, diff), name="shared-key-charge")

    def usage(self, key: TeamKey) -> dict:
        return self.local.usage(key)

    def status(self) -> dict:
        """What `corectl status` shows of the shared limits: round trips the request path waited for, refusals
        while the database could not be asked, chunks and slots held now."""
        return {"asked": self.asked, "refused_offline": self.refused_offline,
                "chunks": {f"{k}/{'rpm' if kind == 'r' else 'tpm'}": c.left for (k, kind), c in self.chunks.items()
                           if not c.returned},
                "slots": {k: {"held": s.held, "busy": s.busy} for k, s in self.slots.items()}}

    # -- rpm / tpm chunks -----------------------------------------------------------------------------------

    async def _take(self, key: TeamKey, kind: str, limit: int, need: int) -> Chunk | Refusal:
        chunk = self._usable(key.name, kind, need)
        if chunk is not None:
            chunk.left -= need
            return chunk
        memo = self._refused_until.get((key.name, kind))
        if memo is not None:
            if self.clock() < memo[0]:
                return self._refused(key, RPM if kind == "r" else TPM, limit, max(memo[1] - self.clock(), 1.0))
            del self._refused_until[(key.name, kind)]
        live = max(int(self._live() or 1), 1)
        want = max(need, limit // (live * CHUNK_DIV))
        self.asked += 1
        sent = self.clock()
        try:
            granted, grant_id, wait = await self.db.bounded(
                partial(self._rate_take, key.name, kind, limit, want, need),
                late=partial(self._late_chunk, key.name, kind), wait_longer=lambda: True)
        except Unavailable:
            self.refused_offline += 1
            return self._offline(key, RPM if kind == "r" else TPM)
        if not granted:
            wait_s = float(wait or 0.0) or 1.0
            now = self.clock()
            if len(self._refused_until) > 10_000:  # keys are few; a bound all the same
                self._refused_until.clear()
            self._refused_until[(key.name, kind)] = (now + min(wait_s, REFUSED_MEMO_S), now + wait_s)
            return self._refused(key, RPM if kind == "r" else TPM, limit, wait_s)
        old = self.chunks.get((key.name, kind))
        if old is not None:
            self._tasks.spawn(self._give_back_chunk(old), name="shared-key-chunk-back")
        # Its life counts from before the question was sent: never longer than the database's own count.
        chunk = Chunk(int(grant_id), int(granted), int(granted) - need, sent + CHUNK_LIFE_S)
        self.chunks[(key.name, kind)] = chunk
        return chunk

    def _usable(self, name: str, kind: str, need: int) -> Chunk | None:
        chunk = self.chunks.get((name, kind))
        if chunk is None or chunk.returned or self.clock() >= chunk.until or chunk.left < need:
            return None
        return chunk

    async def _rate_take(self, key: str, kind: str, limit: int, want: int, need: int, conn: Conn) -> tuple:
        cur = await conn.execute("SELECT granted, grant_id, wait_s FROM cr_rate_take(%s, %s, %s, %s, %s, %s, %s)",
                                 (key, kind, self.instance, limit, want, need, SPAN_S))
        row = await cur.fetchone()
        return tuple(row) if row else (0, None, SPAN_S)

    def _late_chunk(self, key: str, kind: str, result: tuple) -> None:
        # Granted after the request stopped waiting: nobody uses it, so it all goes back.
        granted, grant_id, _ = result
        if granted:
            chunk = Chunk(int(grant_id), int(granted), int(granted), 0.0)
            self._tasks.spawn(self._give_back_chunk(chunk), name="shared-key-chunk-back")

    async def _give_back_chunk(self, chunk: Chunk) -> None:
        if chunk.returned:
            return
        chunk.returned = True
        if chunk.left <= 0:
            return
        left = chunk.left
        try:
            await self.db.run(lambda c: c.execute(
                "UPDATE cr_rate_grant SET amount = greatest(amount - %s, 0) WHERE id = %s", (left, chunk.grant_id)))
        except Unavailable:
            pass  # counted whole until it leaves the window: never less than was used

    async def _charge(self, key: str, tokens: int) -> None:
        try:
            await self.db.run(lambda c: c.execute(
                "INSERT INTO cr_rate_grant (key, kind, instance, amount) VALUES (%s, 't', %s, %s)",
                (key, self.instance, tokens)))
        except Unavailable:
            pass

    # -- concurrency ----------------------------------------------------------------------------------------

    async def _take_slot(self, key: TeamKey) -> Refusal | None:
        assert key.concurrency is not None
        s = self.slots.get(key.name)
        if s is None:
            s = self.slots[key.name] = KeySlots()
        s.limit = key.concurrency
        now = self.clock()
        if s.busy < s.held and now < s.until:
            s.busy += 1
            return None
        self.asked += 1
        sent = now
        try:
            ok = await self.db.bounded(partial(self._slot_take, key.name, key.concurrency),
                                       late=partial(self._late_slot, key.name), wait_longer=lambda: True)
        except Unavailable:
            self.refused_offline += 1
            return self._offline(key, CONCURRENCY)
        if not ok:
            return self._refused(key, CONCURRENCY, key.concurrency, 1.0)
        if now >= s.until:
            s.held = s.busy  # the lease had run out: what it held is no longer ours (the database said so too)
        s.held += 1
        s.busy += 1
        s.until = sent + self.lease_s
        return None

    async def _slot_take(self, key: str, limit: int, conn: Conn) -> bool:
        cur = await conn.execute("SELECT cr_slot_take(%s, %s, %s, %s, %s)",
                                 (key, self.instance, limit, 1, float(self.lease_s)))
        return bool(await scalar(cur))

    def _late_slot(self, key: str, ok: bool) -> None:
        if ok:
            self._tasks.spawn(self._give_slots(key, 1), name="shared-key-slot-back")

    async def _give_slots(self, key: str, n: int) -> None:
        try:
            await self.db.run(lambda c: c.execute(
                "UPDATE cr_key_slot SET held = greatest(held - %s, 0) WHERE key = %s AND instance = %s",
                (n, key, self.instance)))
        except Unavailable:
            pass  # the lease runs out by itself

    # -- refusals and undo ----------------------------------------------------------------------------------

    def _undo(self, part: SharedPart, key: TeamKey, *, rpm: bool = False) -> None:
        """A later limit refused the request: what the earlier ones took for it is theirs again."""
        if part.slot:
            s = self.slots.get(key.name)
            if s is not None:
                s.busy = max(s.busy - 1, 0)
                s.idle_since = self.clock()
        if rpm:
            chunk = self.chunks.get((key.name, "r"))
            if chunk is not None and not chunk.returned:
                chunk.left += 1

    def _refused(self, key: TeamKey, limit: str, allowed: int, wait: float) -> Refusal:
        what = "is at its concurrency limit" if limit == CONCURRENCY else f"is over its {limit} limit"
        requests = (key.rpm, 0, wait) if key.rpm is not None and limit == RPM else None
        tokens = (key.tpm, 0, wait) if key.tpm is not None and limit == TPM else None
        words = {RPM: f"{allowed} requests per minute", TPM: f"{allowed} tokens per minute",
                 CONCURRENCY: f"{allowed} requests in flight"}[limit]
        return Refusal(key.name, limit, allowed, wait,
                       f"team key '{key.name}' {what} ({words}, across all instances); retry in "
                       f"{max(1, int(wait + 0.999))} s", requests=requests, tokens=tokens)

    def _offline(self, key: TeamKey, limit: str) -> Refusal:
        allowed = {RPM: key.rpm, TPM: key.tpm, CONCURRENCY: key.concurrency}[limit] or 0
        refusal = self._refused(key, limit, allowed, OFFLINE_RETRY_S)  # its headers: none left, until the retry
        refusal.message = (f"team key '{key.name}' has limits shared by every instance, and the shared database "
                           f"cannot be asked now: this instance has used what it held of them; retry in "
                           f"{int(OFFLINE_RETRY_S)} s")
        return refusal

    # -- background -----------------------------------------------------------------------------------------

    async def _tend_loop(self) -> None:
        last_renew = self.clock()
        while True:
            await asyncio.sleep(TEND_EVERY_S)
            try:
                await self._tend(renew=self.clock() - last_renew >= self.lease_s / 3)
            except Exception:  # the loop must outlive one bad turn
                log.exception("shared key limits: tending failed")
            else:
                last_renew = self.clock() if self.clock() - last_renew >= self.lease_s / 3 else last_renew

    async def _tend(self, *, renew: bool) -> None:
        now = self.clock()
        for k, chunk in list(self.chunks.items()):
            if now >= chunk.until:
                self.chunks.pop(k, None)
                await self._give_back_chunk(chunk)
        for key, s in list(self.slots.items()):
            idle = s.held - s.busy
            if idle > 0 and now - s.idle_since >= SLOT_LINGER_S:
                s.held -= idle
                await self._give_slots(key, idle)
            if s.held == 0 and s.busy == 0:
                self.slots.pop(key, None)
        if renew and any(s.held for s in self.slots.values()):
            sent = self.clock()
            try:
                renewed = await self.db.run(self._renew)
            except Unavailable:
                return
            for key in renewed:  # only leases the database still held for us (one run out is taken anew)
                held = self.slots.get(key)
                if held is not None and held.held:
                    held.until = sent + self.lease_s

    async def _renew(self, conn: Conn) -> list[str]:
        cur = await conn.execute(
            "UPDATE cr_key_slot SET lease_until = now() + make_interval(secs => %s)"
            " WHERE instance = %s AND held > 0 AND lease_until > now() RETURNING key",
            (float(self.lease_s), self.instance))
        return [r[0] for r in await cur.fetchall()]
