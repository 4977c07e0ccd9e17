"""A team key as it is stored: the TeamKey every layer reads, plus what only storage and the check need (the
secret's keyed hash, the previous hash during a rotation's grace, last use, whether its expiry was recorded).

Stored as one JSON object per key (the local state store's `team_keys` namespace, the shared `cr_key` table's
`record` column). Never holds a secret: `digest` and `prev_digest` are HMAC-SHA256 hex digests (hashing.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from .model import TeamKey

# The limits and scope `create` and `update` set (corectl keys create/update options, the admin API's fields).
SETTINGS = ("monthly_usd", "rpm", "tpm", "concurrency", "profiles", "models", "expires_at", "note")
_KEY_FIELDS = tuple(f.name for f in fields(TeamKey))


class KeySettingsError(ValueError):
    """A limit, scope or expiry that cannot be: the message names the field."""


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key: TeamKey
    digest: str  # HMAC-SHA256 (hex) of the current secret
    prev_digest: str | None = None  # the secret before the last rotation, accepted until prev_until
    prev_until: float | None = None
    updated_at: float = 0.0
    last_used: float | None = None  # written behind (registry.py), never per request
    expiry_noted: bool = False  # the audit line for its expiry was written (once)
    version: int = 0  # the shared table's row version (0 in the local store)

    @property
    def name(self) -> str:
        return self.key.name

    def to_dict(self) -> dict[str, Any]:
        k = self.key
        out: dict[str, Any] = {f: getattr(k, f) for f in _KEY_FIELDS}
        out["profiles"] = list(k.profiles)
        out["models"] = list(k.models)
        out.update(digest=self.digest, prev_digest=self.prev_digest, prev_until=self.prev_until,
                   updated_at=self.updated_at, last_used=self.last_used, expiry_noted=self.expiry_noted)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, version: int = 0) -> KeyRecord:
        kw = {f: d[f] for f in _KEY_FIELDS if f in d}
        kw["profiles"] = tuple(d.get("profiles") or ())
        kw["models"] = tuple(d.get("models") or ())
        return cls(key=TeamKey(**kw), digest=str(d["digest"]), prev_digest=d.get("prev_digest"),
                   prev_until=d.get("prev_until"), updated_at=float(d.get("updated_at") or 0.0),
                   last_used=d.get("last_used"), expiry_noted=bool(d.get("expiry_noted")), version=version)

    def public(self, now: float) -> dict[str, Any]:
        """What `corectl keys list/show` and the admin API show: everything but the hashes."""
        k = self.key
        out = {f: getattr(k, f) for f in _KEY_FIELDS}
        out["profiles"] = list(k.profiles)
        out["models"] = list(k.models)
        out["state"] = state_word(self, now)
        out["scope"] = k.scope_words()
        out["last_used"] = self.last_used
        out["updated_at"] = self.updated_at
        out["previous_secret_until"] = self.prev_until if self.prev_until and self.prev_until > now else None
        return out


def state_word(rec: KeyRecord, now: float) -> str:
    if rec.key.revoked_at is not None:
        return "revoked"
    if rec.key.expired(now):
        return "expired"
    return "active"


def with_settings(key: TeamKey, changes: dict[str, Any]) -> TeamKey:
    """`key` with the settings in `changes` (a field given as None clears it), each checked."""
    clean: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in SETTINGS:
            raise KeySettingsError(f"{name}: not a key setting")
        clean[name] = _checked(name, value)
    return replace(key, **clean)


def _checked(name: str, value: Any) -> Any:
    if name == "note":
        if value is None:
            return ""
        if not isinstance(value, str) or len(value) > 500:
            raise KeySettingsError("note: at most 500 characters")
        return value
    if name in ("profiles", "models"):
        if value is None:
            return ()
        if isinstance(value, str) or not all(isinstance(v, str) and v and len(v) <= 200 for v in value):
            raise KeySettingsError(f"{name}: a list of non-empty names")
        if len(value) > 100:
            raise KeySettingsError(f"{name}: at most 100 entries")
        return tuple(dict.fromkeys(value))
    if value is None:
        return None
    if name in ("monthly_usd", "expires_at"):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise KeySettingsError(f"{name}: a finite number >= 0")
        if name == "monthly_usd" and value > 1e9:
            raise KeySettingsError("monthly_usd: at most 1e9")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > 10**9:
        raise KeySettingsError(f"{name}: a whole number from 1 to 1e9")
    return value


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_expiry(text: str) -> float | None:
    """An ISO-8601 date or date-time as epoch seconds; `never`/`none`/"" -> None. A date alone means the end of
    that day, UTC (a key "expires 2026-12-31" still works on the 31st); a date-time without a zone is UTC."""
    t = text.strip()
    if t.lower() in ("", "never", "none"):
        return None
    try:
        if len(t) == 10:
            day = datetime.fromisoformat(t).replace(tzinfo=UTC)
            return day.timestamp() + 86400.0
        dt = datetime.fromisoformat(t.replace("Z", "+00:00") if t.endswith("Z") else t)
    except ValueError:
        raise KeySettingsError(f"expires: {text!r} is not an ISO-8601 date (2026-12-31) or date-time "
                               "(2026-12-31T18:00:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
