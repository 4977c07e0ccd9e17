"""Team keys in this machine's state store ([state] backend = "sqlite", the default): one JSON record per key
in the `team_keys` namespace, and the hash key in `keys_meta`. The store writes from its own thread within its
flush interval; nothing here blocks the event loop. The in-memory registry is the only reader on the request
path."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from .hashing import new_hash_key
from .record import KeyRecord
from .registry import KeyRegistry

NS_KEYS = "team_keys"
NS_META = "keys_meta"


def load_hash_key(store: Any, namespace: str = NS_META) -> bytes:
    """The store's hash key, made (and kept) on first use."""
    held = store.get(namespace, "hash_key")
    if isinstance(held, str):
        try:
            key = bytes.fromhex(held)
            if len(key) >= 16:
                return key
        except ValueError:
            pass
    key = new_hash_key()
    store.set(namespace, "hash_key", key.hex())
    return key


def records_from(items: dict[str, Any]) -> list[KeyRecord]:
    out = []
    for value in items.values():
        try:
            out.append(KeyRecord.from_dict(value if isinstance(value, dict) else orjson.loads(value)))
        except (KeyError, TypeError, ValueError):
            continue  # a record this version cannot read: skipped (never half-used)
    return out


class LocalKeyStorage:
    kind = "sqlite"

    def __init__(self, store: Any, registry: KeyRegistry) -> None:
        self.store = store
        self.registry = registry

    def load(self) -> None:
        self.registry.set_hash_key(load_hash_key(self.store))
        self.registry.replace(records_from(self.store.items(NS_KEYS)))

    async def save(self, rec: KeyRecord, *, previous: KeyRecord | None) -> KeyRecord:
        self.store.set(NS_KEYS, rec.name, rec.to_dict())
        return rec

    async def delete(self, rec: KeyRecord) -> None:
        self.store.delete(NS_KEYS, rec.name)

    async def fresh(self) -> list[KeyRecord] | None:
        return None

    async def write_used(self, used: dict[str, float]) -> None:
        for name, ts in used.items():
            rec = self.registry.get(name)
            if rec is None or (rec.last_used is not None and rec.last_used >= ts):
                continue
            rec = replace(rec, last_used=ts)
            self.store.set(NS_KEYS, name, rec.to_dict())
            self.registry.put(rec)

    async def claim_expiry(self, rec: KeyRecord) -> bool:
        rec = replace(rec, expiry_noted=True)
        self.store.set(NS_KEYS, rec.name, rec.to_dict())
        self.registry.put(rec)
        return True
