"""Who spent what: the journal's rows summed per team key over a calendar month (UTC, the budgets' period), for
`corectl usage --by key` and the dashboard's Keys view. The sums are the database's (journal_reader.usage_by_key);
this only picks the month and shapes the entries."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from .journal_reader import JournalReader

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def month_window(month: str | None = None, now: float | None = None) -> tuple[str, float, float]:
    """(YYYY-MM, start, end) of a UTC calendar month, epoch seconds; `month` None: the one `now` is in.
    Raises ValueError for anything but YYYY-MM."""
    if month is None:
        d = datetime.fromtimestamp(time.time() if now is None else now, UTC)
        year, mon = d.year, d.month
    else:
        m = _MONTH.match(month.strip())
        if m is None or not 1 <= int(m.group(2)) <= 12 or int(m.group(1)) < 1970:
            raise ValueError(f"{month!r} is not a month: write YYYY-MM, e.g. 2026-06")
        year, mon = int(m.group(1)), int(m.group(2))
    start = datetime(year, mon, 1, tzinfo=UTC)
    end = datetime(year + (mon == 12), mon % 12 + 1, 1, tzinfo=UTC)
    return f"{year:04d}-{mon:02d}", start.timestamp(), end.timestamp()


def iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z") \
        if ts is not None else None


def _entry(row: dict[str, Any] | None, name: str) -> dict[str, Any]:
    row = row or {}
    return {"name": name, "requests": row.get("requests", 0), "refused": row.get("refused", 0),
            "input_tokens": row.get("input_tokens", 0), "output_tokens": row.get("output_tokens", 0),
            "cached_tokens": row.get("cached_tokens", 0), "cache_write_tokens": row.get("cache_write_tokens", 0),
            "spend_usd": round(row.get("spend_usd", 0.0), 9), "refusals": dict(sorted((row.get("refusals") or {})
                                                                                   .items())),
            "last_used": iso(row.get("last_used")), "last_used_ts": row.get("last_used")}


def usage_by_key(reader: JournalReader, month: str | None = None, *, now: float | None = None,
                 keys: Iterable[str] = ()) -> dict[str, Any]:
    """{month, since, until, keys: [one entry per key, by name], no_key: the requests no team key came with (None
    when there were none)}. `keys`: names known to exist (the key registry), listed even with no request yet."""
    name, start, end = month_window(month, now)
    rows = reader.usage_by_key(start, end)
    names = sorted({n for n in rows if n is not None} | set(keys))
    keyless = rows.get(None)
    return {"month": name, "since": iso(start), "until": iso(end),
            "keys": [_entry(rows.get(n), n) for n in names],
            "no_key": _entry(keyless, "-") if keyless and keyless.get("requests") else None}
