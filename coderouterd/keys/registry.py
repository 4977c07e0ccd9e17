"""The team keys this instance knows, in memory: what the request path checks a presented secret against.

No I/O here. Storage (keys/local.py; cluster/keys.py with the shared database) fills it with `replace` and
`put`; the request path calls `check`, which costs one HMAC, one dict lookup and one constant-time compare.

Unknown and wrong secrets take the same path: the presented secret is always hashed, the lookup always happens,
and `hmac.compare_digest` always runs (against a fixed dummy digest when nothing was found), so the time of a
refusal does not depend on how close the secret was to a real one (tests/unit/test_keys_registry.py)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable
from enum import Enum

from .hashing import Hasher
from .model import TeamKey
from .record import KeyRecord


class Check(Enum):
    OK = "ok"
    NO_KEY = "no_key"
    UNKNOWN = "unknown"
    REVOKED = "revoked"
    EXPIRED = "expired"


# Compared against when a digest has no entry, so a miss runs compare_digest like a hit does.
_NO_DIGEST = bytes(32)


class KeyRegistry:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.hasher: Hasher | None = None
        # digest -> (the digest again, the record, until when it is accepted or None): the current secret's
        # digest and, during a rotation's grace, the previous one.
        self._index: dict[bytes, tuple[bytes, KeyRecord, float | None]] = {}
        self._records: dict[str, KeyRecord] = {}
        # name -> last use (epoch s), written by `check` and drained by the storage's write-behind.
        self.used: dict[str, float] = {}
        # Any key exists (revoked ones included: revoking a team's last key must not open the door it closed):
        # every request must carry a valid key, loopback included.
        self.required = False
        self.loaded = False  # storage has filled it at least once
        self.generation = 0  # bumped on every change (the dashboard's cookies, tests waiting for a refresh)
        self._listeners: list[Callable[[], None]] = []

    # -- filled by storage ---------------------------------------------------------------------------------

    def set_hash_key(self, key: bytes) -> None:
        self.hasher = Hasher(key)

    def replace(self, records: Iterable[KeyRecord]) -> None:
        """Every key at once (a load or a refresh): built aside, then swapped in."""
        self._swap({r.name: r for r in records})

    def put(self, record: KeyRecord) -> None:
        """One key created or changed here."""
        self._swap({**self._records, record.name: record})

    def _swap(self, records: dict[str, KeyRecord]) -> None:
        index: dict[bytes, tuple[bytes, KeyRecord, float | None]] = {}
        for rec in records.values():
            d = bytes.fromhex(rec.digest)
            index[d] = (d, rec, None)
            if rec.prev_digest and rec.prev_until:
                p = bytes.fromhex(rec.prev_digest)
                index[p] = (p, rec, rec.prev_until)
        self._records = records
        self._index = index
        self.required = bool(records)
        self.loaded = True
        self.generation += 1
        for fn in self._listeners:
            fn()

    def close_until_loaded(self) -> None:
        """Storage cannot tell yet whether any key exists (the shared database not reached, nothing cached): every
        request needs a key meanwhile (an operator key; no team key can be checked before the hash key is known).
        The first `replace` decides."""
        if not self.loaded:
            self.required = True

    def on_change(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    # -- read ----------------------------------------------------------------------------------------------

    def get(self, name: str) -> KeyRecord | None:
        return self._records.get(name)

    def records(self) -> list[KeyRecord]:
        return sorted(self._records.values(), key=lambda r: r.name)

    def counts(self, now: float | None = None) -> dict[str, int]:
        now = self._clock() if now is None else now
        out = {"active": 0, "expired": 0, "revoked": 0}
        for r in self._records.values():
            if r.key.revoked_at is not None:
                out["revoked"] += 1
            elif r.key.expired(now):
                out["expired"] += 1
            else:
                out["active"] += 1
        return out

    # -- the request path ----------------------------------------------------------------------------------

    def check(self, secret: str, now: float) -> tuple[Check, TeamKey | None]:
        """What a presented secret is: (OK, its key), or why not (with the key when one was recognised, so a
        refusal can name it)."""
        if not secret:
            return Check.NO_KEY, None
        hasher = self.hasher
        if hasher is None:  # keys exist only once storage set the hash key; nothing to match
            return Check.UNKNOWN, None
        d = hasher.digest(secret)
        entry = self._index.get(d)
        same = hmac.compare_digest(entry[0] if entry is not None else _NO_DIGEST, d)
        if entry is None or not same:
            return Check.UNKNOWN, None
        _d, rec, until = entry
        key = rec.key
        if until is not None and now >= until:
            return Check.UNKNOWN, None  # a rotated-away secret after its grace: as good as never issued
        if key.revoked_at is not None:
            return Check.REVOKED, key
        if key.expired(now):
            return Check.EXPIRED, key
        self.used[key.name] = now
        return Check.OK, key

    def verify_name_digest(self, name: str, digest_hex: str) -> TeamKey | None:
        """The key named `name` if `digest_hex` is its current secret's digest, or its previous one's while the
        rotation's grace lasts, and it may be used now (the dashboard's cookie holds a MAC of these, never the
        secret: it opens what the secret it was made from opens, no longer)."""
        rec = self._records.get(name)
        if rec is None:
            return None
        now = self._clock()
        current = hmac.compare_digest(rec.digest, digest_hex)
        graced = rec.prev_digest is not None and rec.prev_until is not None and now < rec.prev_until \
            and hmac.compare_digest(rec.prev_digest, digest_hex)
        if not (current or graced):
            return None
        key = rec.key
        if key.revoked_at is not None or key.expired(now):
            return None
        return key

    def take_used(self) -> dict[str, float]:
        """The last uses noted since the previous call (for the write-behind)."""
        used, self.used = self.used, {}
        return used
