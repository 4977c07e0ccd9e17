"""Managing team keys: create, update, rotate, revoke, list, show (what the admin API and `corectl keys` call),
plus the background chores: last use written behind, and each expiry recorded once.

Storage is handed in (`KeyStorage`): the local state store (keys/local.py) or the shared database
(cluster/keys.py). The service changes the registry this instance checks requests against at once; storage
takes the change to every other instance."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from ..state.events import KeyChanged
from .hashing import Hasher, display_prefix, name_problem, new_secret
from .model import TeamKey
from .record import SETTINGS, KeyRecord, iso, with_settings
from .registry import KeyRegistry

log = logging.getLogger("coderouterd.keys")

USED_FLUSH_S = 10.0  # last use reaches storage this often at most, one write per key that was used
EXPIRY_SCAN_S = 1.0
MAX_GRACE_S = 30 * 86400.0


class KeyProblem(Exception):
    """A key operation refused: `status` is the admin API's answer (404 unknown, 409 exists or changed
    meanwhile, 400 bad settings, 503 storage unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KeyStorage(Protocol):
    kind: str

    def load(self) -> None:
        """Fill the registry with what this machine holds (at start, before the proxy serves)."""
        ...

    async def save(self, rec: KeyRecord, *, previous: KeyRecord | None) -> KeyRecord:
        """Write `rec` (a new key when `previous` is None, else a change of `previous`, refused with
        KeyProblem(409) if it changed meanwhile). Returns what was written (with its new version)."""
        ...

    async def delete(self, rec: KeyRecord) -> None:
        """Remove a revoked key's record (refused with KeyProblem(409) if it changed meanwhile)."""
        ...

    async def fresh(self) -> list[KeyRecord] | None:
        """The newest records for a listing (None: the registry is as fresh as it gets)."""
        ...

    async def write_used(self, used: dict[str, float]) -> None: ...

    async def claim_expiry(self, rec: KeyRecord) -> bool:
        """Mark `rec`'s expiry as recorded; True for the one instance that did (it writes the audit line)."""
        ...


class KeyService:
    def __init__(self, registry: KeyRegistry, storage: KeyStorage, publish: Callable[[Any], None], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self.storage = storage
        self._publish = publish
        self._clock = clock
        self._seen: dict[str, float] = {}  # name -> the last use seen here (storage's may be older)
        self._claiming: set[str] = set()

    def now(self) -> float:
        return self._clock()

    # -- operations ------------------------------------------------------------------------------------------

    async def create(self, name: str, settings: dict[str, Any]) -> tuple[KeyRecord, str]:
        problem = name_problem(name)
        if problem:
            raise KeyProblem(400, f"invalid key name {name!r}: {problem}")
        previous = self.registry.get(name)
        if previous is not None and previous.key.revoked_at is None:
            raise KeyProblem(409, f"key {name!r} exists; use `corectl keys update` or `rotate`, or revoke it first")
        hasher = self._hasher()
        now = self._clock()
        secret = new_secret()
        key = _settings(TeamKey(name=name, prefix=display_prefix(secret), created_at=now), settings)
        rec = KeyRecord(key=key, digest=hasher.hex(secret), updated_at=now)
        saved = await self.storage.save(rec, previous=previous)
        self.registry.put(saved)
        self._seen.pop(name, None)
        self._publish(KeyChanged(name=name, action="created", prefix=key.prefix, detail=_shown(key)))
        log.info("key %s created (%s)", name, key.prefix)
        return saved, secret

    async def update(self, name: str, changes: dict[str, Any]) -> KeyRecord:
        rec = self._live(name)
        key = _settings(rec.key, changes)
        noted = rec.expiry_noted and key.expires_at == rec.key.expires_at
        new = replace(rec, key=key, updated_at=self._clock(), expiry_noted=noted)
        saved = await self.storage.save(new, previous=rec)
        self.registry.put(saved)
        self._publish(KeyChanged(name=name, action="updated", prefix=key.prefix,
                                 detail={k: _field(getattr(key, k)) for k in changes}))
        return saved

    async def rotate(self, name: str, grace_s: float) -> tuple[KeyRecord, str]:
        if not 0 <= grace_s <= MAX_GRACE_S:
            raise KeyProblem(400, f"grace: 0 to {MAX_GRACE_S:.0f} seconds")
        rec = self._live(name)
        hasher = self._hasher()
        now = self._clock()
        secret = new_secret()
        key = replace(rec.key, prefix=display_prefix(secret))
        new = replace(rec, key=key, digest=hasher.hex(secret), updated_at=now,
                      prev_digest=rec.digest if grace_s > 0 else None,
                      prev_until=now + grace_s if grace_s > 0 else None)
        saved = await self.storage.save(new, previous=rec)
        self.registry.put(saved)
        self._publish(KeyChanged(name=name, action="rotated", prefix=key.prefix,
                                 detail={"grace_s": grace_s, "old_prefix": rec.key.prefix,
                                         "old_until": iso(new.prev_until) if grace_s > 0 else "now"}))
        return saved, secret

    async def revoke(self, name: str) -> KeyRecord:
        rec = self.registry.get(name)
        if rec is None:
            raise self._unknown(name)
        if rec.key.revoked_at is not None:
            return rec
        now = self._clock()
        new = replace(rec, key=replace(rec.key, revoked_at=now), updated_at=now, prev_digest=None, prev_until=None)
        saved = await self.storage.save(new, previous=rec)
        self.registry.put(saved)
        self._publish(KeyChanged(name=name, action="revoked", prefix=rec.key.prefix))
        return saved

    async def delete(self, name: str) -> None:
        """Forget a revoked key for good (its name may then be reused; journal rows keep the name). Once no key is
        left at all, keys are no longer required."""
        rec = self.registry.get(name)
        if rec is None:
            raise self._unknown(name)
        if rec.key.revoked_at is None:
            raise KeyProblem(409, f"key {name!r} is not revoked; revoke it first (`corectl keys revoke {name}`)")
        await self.storage.delete(rec)
        self.registry.replace([r for r in self.registry.records() if r.name != name])
        self._seen.pop(name, None)
        self._publish(KeyChanged(name=name, action="deleted", prefix=rec.key.prefix))

    async def listing(self) -> list[dict[str, Any]]:
        fresh = await self.storage.fresh()
        records = sorted(fresh, key=lambda r: r.name) if fresh is not None else self.registry.records()
        now = self._clock()
        return [self.public(r, now) for r in records]

    async def show(self, name: str) -> dict[str, Any]:
        for item in await self.listing():
            if item["name"] == name:
                return item
        raise self._unknown(name)

    def public(self, rec: KeyRecord, now: float) -> dict[str, Any]:
        out = rec.public(now)
        seen = max(self._seen.get(rec.name, 0.0), self.registry.used.get(rec.name, 0.0)) or None
        if seen is not None and (out["last_used"] is None or seen > out["last_used"]):
            out["last_used"] = seen
        return out

    def _hasher(self) -> Hasher:
        hasher = self.registry.hasher
        if hasher is None:  # the shared database was never reached: its hash key is not known here yet
            raise KeyProblem(503, "the key store is not reachable yet; try again once it is")
        return hasher

    def _live(self, name: str) -> KeyRecord:
        rec = self.registry.get(name)
        if rec is None:
            raise self._unknown(name)
        if rec.key.revoked_at is not None:
            raise KeyProblem(409, f"key {name!r} was revoked at {iso(rec.key.revoked_at)}; create it again "
                                  "(`corectl keys create`) for a new secret")
        return rec

    def _unknown(self, name: str) -> KeyProblem:
        names = [r.name for r in self.registry.records()]
        return KeyProblem(404, f"no key named {name!r}; keys: {', '.join(names) if names else 'none yet'}")

    # -- background ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Expiries recorded (within EXPIRY_SCAN_S) and last uses written behind (every USED_FLUSH_S)."""
        last_flush = time.monotonic()
        while True:
            await asyncio.sleep(EXPIRY_SCAN_S)
            try:
                await self.note_expiries()
                if time.monotonic() - last_flush >= USED_FLUSH_S:
                    last_flush = time.monotonic()
                    await self.flush_used()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # storage trouble: the next round tries again
                log.debug("keys: background round failed: %s", e)

    async def flush_used(self) -> None:
        used = self.registry.take_used()
        if not used:
            return
        self._seen.update(used)
        try:
            await self.storage.write_used(used)
        except Exception:
            for name, ts in used.items():  # kept for the next round; a newer use wins
                self.registry.used[name] = max(ts, self.registry.used.get(name, 0.0))
            raise

    async def note_expiries(self) -> None:
        now = self._clock()
        for rec in self.registry.records():
            key = rec.key
            if rec.expiry_noted or key.revoked_at is not None or not key.expired(now) or rec.name in self._claiming:
                continue
            self._claiming.add(rec.name)
            try:
                if await self.storage.claim_expiry(rec):
                    assert key.expires_at is not None
                    self._publish(KeyChanged(name=rec.name, action="expired", prefix=key.prefix,
                                             detail={"expired_at": iso(key.expires_at)}, source="expiry"))
                    log.info("key %s expired at %s", rec.name, iso(key.expires_at))
            finally:
                self._claiming.discard(rec.name)


def _settings(key: TeamKey, settings: dict[str, Any]) -> TeamKey:
    from .record import KeySettingsError

    try:
        return with_settings(key, settings)
    except KeySettingsError as e:
        raise KeyProblem(400, str(e)) from None


def _field(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _shown(key: TeamKey) -> dict[str, Any]:
    """The settings an audit line records (note included: it is the operator's own text)."""
    return {k: _field(getattr(key, k)) for k in SETTINGS if getattr(key, k) not in (None, (), "")}
