"""The Keys view-model (the dashboard's Keys view, GET /ui/api/keys): for each team key, this month's spend
against its cap, requests and refusals over time, its rate now against its limits, last use and expiry, and the
keys that need attention (over 80% of the cap, blocked, expiring within 7 days).

Built from the journal first (spend, requests, refusals, the rate of the last 60 s): it holds every key that ever
made a request. With `[state] backend = "postgres"` that is the shared journal, every instance's rows (a key's cap
holds across instances, so its spend must too); while the shared database cannot be read, this machine's journal,
and the answer says so (`source`). What the journal cannot know -- a key's cap, limits, expiry, a key
not used yet -- comes from the key directory the daemon hands in (the key registry, coderouterd/keys), read through
the narrow `KeyDirectory` protocol; without one, the view shows the journal's figures alone.

The rate "now" is the journal's: requests and tokens of the rows written in the last 60 s (a request is journaled
when it ends, so one in flight is not counted yet)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..keys.model import TeamKey
from ..state.journal_reader import JournalUnreadable
from ..state.refusals import KEY_BUDGET, KEY_CONCURRENCY, KEY_RPM, KEY_TPM
from ..state.trends import buckets
from ..state.usage import month_window
from . import apitype

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only
    from ..state.journal_reader import JournalReader

NEAR_CAP = 0.8  # a key this far into its monthly cap needs attention
EXPIRING_S = 7 * 86_400.0  # a key expiring within this needs attention
RATE_WINDOW_S = 60.0
BLOCKED_RECENT_S = 300.0  # a key refused for its budget or rate this recently is blocked now
# Refusal reasons that block a key now, and how the strip says it. `rate_limited` is the key guard's (the rate
# limits' 429 before routing, guards/key_limits.py); the key_* ones are state/refusals.py's.
_BLOCKING = {KEY_BUDGET: "its monthly budget", KEY_RPM: "its rpm limit", KEY_TPM: "its tpm limit",
             KEY_CONCURRENCY: "its concurrency limit", "rate_limited": "its rate limits",
             # a budget refusal in routing (402): the key's own budget, a provider's or the global cap
             "billing_error": "a spent budget (its own, a provider's or the global cap)"}


class KeyEntry(Protocol):
    """One key as the directory holds it: the key itself and when it was last used (None: never, or not known)."""

    @property
    def key(self) -> TeamKey: ...

    @property
    def last_used(self) -> float | None: ...


class KeyDirectory(Protocol):
    """What this view reads of the key registry: every key (revoked and expired ones too)."""

    def records(self) -> Sequence[KeyEntry]: ...


async def daemon_keys(d: Daemon, range_name: str) -> apitype.KeyUsageAnswer:
    """The view for a daemon: its journal (history.journal) and its key registry, over one of history.RANGES
    (ValueError for another)."""
    from .history import RANGES, journal

    if range_name not in RANGES:
        raise ValueError(f"unknown range {range_name!r}; expected one of {', '.join(RANGES)}")
    span, step = RANGES[range_name]
    return await keys_answer(journal(d), d.keys, span=span, step=step, range_name=range_name,
                             shared=shared_journal(d))


def shared_journal(d: Daemon) -> JournalReader | None:
    """The shared journal with `[state] backend = "postgres"` (None otherwise, or without a DSN to read it with)."""
    state = d.runtime.config.state
    if state.backend != "postgres":
        return None
    from ..state.shared.dsn import DsnMissing, redact, resolve
    from ..state.shared.journal_read import PostgresJournal

    try:
        dsn = resolve(state)
    except DsnMissing:
        return None
    return PostgresJournal(dsn, where=redact(dsn))


def _read(reader: JournalReader, start: float, end: float, since: float, now: float,
          step: float) -> tuple[dict, dict, dict]:
    """Every journal read of the view, in one worker thread: the month, the window's series, the last minute."""
    month = reader.usage_by_key(start, end)
    series = reader.key_series(since, now, step)
    minute = reader.usage_by_key(now - RATE_WINDOW_S, now + 1e-3, last_used=False)
    return month, series, minute


def _limit(value: int | float | None) -> int | float | None:
    return value if value else None


async def keys_answer(reader: JournalReader | None, directory: KeyDirectory | None, *, span: float, step: float,
                      range_name: str, now: float | None = None,
                      shared: JournalReader | None = None) -> apitype.KeyUsageAnswer:
    """`reader`: this machine's journal; `shared`: the shared one, read first when there is one."""
    now = time.time() if now is None else now
    month, start, end = month_window(None, now)
    t = buckets(now - span, now, step)  # aligned to the step, as the trends' charts are
    source = "none"
    used: dict = {}
    series: dict = {}
    minute: dict = {}
    if shared is not None:
        try:
            used, series, minute = await asyncio.to_thread(_read, shared, start, end, t[0], now, step)
            source = "shared"
        except JournalUnreadable:
            source = "local: the shared journal cannot be read"
    if source != "shared" and reader is not None:
        used, series, minute = await asyncio.to_thread(_read, reader, start, end, t[0], now, step)
        source = "local" if source == "none" else source
    known: dict[str, KeyEntry] = {e.key.name: e for e in directory.records()} if directory is not None else {}
    n = len(t)
    names = sorted({k for k in used if k is not None} | set(known) | {k for k in series if k is not None})
    keys = [_key_row(name, known.get(name), used.get(name) or {}, series.get(name) or {}, minute.get(name) or {},
                     n, now) for name in names]
    attention = [a for k in keys for a in _attention(k, now)]
    return apitype.KeyUsageAnswer.model_validate({
        "month": month, "range": range_name, "t": t, "step_s": step,
        "keys": keys, "attention": attention, "journal": reader is not None or shared is not None,
        "registry": directory is not None, "now": now, "source": source})


def _key_row(name: str, entry: KeyEntry | None, month: dict[str, Any], series: dict[int, tuple[int, int, float]],
             minute: dict[str, Any], n: int, now: float) -> dict[str, Any]:
    key = entry.key if entry is not None else None
    spend = float(month.get("spend_usd") or 0.0)
    cap = _limit(key.monthly_usd) if key is not None else None
    ratio = spend / cap if cap else None
    refusals = dict(month.get("refusals") or {})
    recent = minute.get("refusals") or {}
    # Blocked: the cap is spent, or the last minute's requests were refused for the key's budget or rate.
    blocked_by = ("its monthly cap" if ratio is not None and ratio >= 1 else
                  next((r for r in _BLOCKING if recent.get(r)), None))
    served_now = int(minute.get("requests") or 0) - int(minute.get("refused") or 0)
    last_journal = month.get("last_used")
    last_dir = entry.last_used if entry is not None else None
    last = max((t for t in (last_journal, last_dir) if t is not None), default=None)
    state = ("unknown" if key is None else "revoked" if key.revoked_at is not None else
             "expired" if key.expired(now) else "active")
    return {
        "name": name, "state": state, "spend_usd": round(spend, 9), "cap_usd": cap, "ratio": ratio,
        "requests": int(month.get("requests") or 0), "refused": int(month.get("refused") or 0),
        "refusals": refusals, "input_tokens": int(month.get("input_tokens") or 0),
        "output_tokens": int(month.get("output_tokens") or 0), "cached_tokens": int(month.get("cached_tokens") or 0),
        "series": {"requests": [series.get(i, (0, 0, 0.0))[0] for i in range(n)],
                   "refusals": [series.get(i, (0, 0, 0.0))[1] for i in range(n)]},
        "rate": {"rpm": served_now, "rpm_limit": _limit(key.rpm) if key else None,
                 "tpm": int(minute.get("input_tokens") or 0) + int(minute.get("output_tokens") or 0),
                 "tpm_limit": _limit(key.tpm) if key else None,
                 "concurrency_limit": _limit(key.concurrency) if key else None,
                 "refused_last_minute": int(minute.get("refused") or 0)},
        "blocked": blocked_by is not None, "blocked_by": blocked_by,
        "last_used": last, "expires_at": key.expires_at if key is not None else None,
        "revoked_at": key.revoked_at if key is not None else None,
    }


def _attention(k: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """What the "needs attention" strip says of one key: a key set aside on purpose (revoked) says nothing."""
    if k["state"] == "revoked":
        return []
    out = []
    name = k["name"]
    if k["blocked"]:
        why = k["blocked_by"]
        words = _BLOCKING.get(why, why)
        out.append({"kind": "key_blocked", "key": name,
                    "text": f"key {name} is blocked by {words}" + (
                        f" ({k['spend_usd']:.2f} of {k['cap_usd']:.2f} USD)" if why == "its monthly cap" else "")})
    elif k["ratio"] is not None and k["ratio"] >= NEAR_CAP:
        out.append({"kind": "key_cap", "key": name,
                    "text": f"key {name} has used {k['ratio'] * 100:.0f}% of its monthly cap "
                            f"({k['spend_usd']:.2f} of {k['cap_usd']:.2f} USD)"})
    exp = k["expires_at"]
    if exp is not None and now < exp <= now + EXPIRING_S:
        days = (exp - now) / 86_400.0
        when = f"in {days:.0f} day{'s' if round(days) != 1 else ''}" if days >= 1 else \
            f"in {max(1, round((exp - now) / 3600))} h"
        out.append({"kind": "key_expiring", "key": name, "text": f"key {name} expires {when}", "expires_at": exp})
    return out
