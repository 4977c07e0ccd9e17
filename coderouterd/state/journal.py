"""Request journal: one metadata row per request (never bodies): its columns, its DDL, the row an event becomes,
how a stored row decodes, and the export formats.

The store owns writing (in the event writer thread); journal_reader.py owns reading (one reader, SQLite or the
shared PostgreSQL journal behind it).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from coderouterd.state.events import RequestFinished

JOURNAL_COLUMNS: tuple[str, ...] = (
    "ts",
    "request_id",
    "ingress",
    "profile",
    "provider",
    "attempts",
    "model_requested",
    "model_used",
    "status",
    "error_class",
    "latency_ms",
    "ttfb_ms",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_usd",
    "streaming",
    "fallback_count",
    "race_outcome",
    "session_key",
    "session",
    "lane",
    "slot",
    "predicted_tokens",
    "cache_bust",
    # 1 when some of the row's tokens are our estimate, not the upstream's count: a stream cut before the upstream
    # reported its usage (the client left, the upstream broke); its spend was settled with that estimate.
    "usage_estimated",
    "key_name",
)

JOURNAL_DDL = (
    "CREATE TABLE IF NOT EXISTS journal ("
    " id INTEGER PRIMARY KEY,"
    " ts REAL NOT NULL, request_id TEXT, ingress TEXT, profile TEXT, provider TEXT,"
    " attempts TEXT, model_requested TEXT, model_used TEXT, status INTEGER, error_class TEXT,"
    " latency_ms REAL, ttfb_ms REAL, input_tokens INTEGER, output_tokens INTEGER,"
    " cache_read_tokens INTEGER, cache_write_tokens INTEGER, cost_usd REAL, streaming INTEGER,"
    " fallback_count INTEGER, race_outcome TEXT)",
    "CREATE INDEX IF NOT EXISTS journal_ts ON journal(ts)",
    "CREATE INDEX IF NOT EXISTS journal_provider_ts ON journal(provider, ts)",
    "CREATE INDEX IF NOT EXISTS journal_profile_ts ON journal(profile, ts)",
)

# Prefix affinity's columns, added by a migration so existing journals keep their rows.
JOURNAL_AFFINITY_DDL = (
    "ALTER TABLE journal ADD COLUMN session TEXT",
    "ALTER TABLE journal ADD COLUMN lane TEXT",
    "ALTER TABLE journal ADD COLUMN slot INTEGER",
    "ALTER TABLE journal ADD COLUMN predicted_tokens INTEGER",
    "ALTER TABLE journal ADD COLUMN cache_bust TEXT",
)

# Written locally but not read back by the journal's readers: the budget settles of a request on a shared ledger
# (reservation id, period, budgets, real cost), which the journal shipper re-applies with the row, so the shared
# ledger gets every settle the journal has even when the instance died before its own settle reached it.
STORED_COLUMNS: tuple[str, ...] = (*JOURNAL_COLUMNS, "settles")
JOURNAL_SETTLES_DDL = ("ALTER TABLE journal ADD COLUMN settles TEXT",)
JOURNAL_USAGE_ESTIMATED_DDL = ("ALTER TABLE journal ADD COLUMN usage_estimated INTEGER NOT NULL DEFAULT 0",)
# Who spent what (issue 41): the name of the team key a request came with (never its secret), and the index that
# `corectl usage --by key` and `journal --key` read by.
JOURNAL_KEY_DDL = (
    "ALTER TABLE journal ADD COLUMN key_name TEXT",
    "CREATE INDEX IF NOT EXISTS journal_key_ts ON journal(key_name, ts)",
)
# A request's outcome as a filter: the same split as replay.is_error (an HTTP error, or a status-less failure).
_ERROR_SQL = "(COALESCE(status, 0) >= 400 OR (COALESCE(status, 0) = 0 AND COALESCE(error_class, '') != ''))"
OUTCOMES: dict[str, str] = {
    "ok": f"NOT {_ERROR_SQL}",
    "error": _ERROR_SQL,
    "fallback": "fallback_count > 0",
}

INSERT_SQL = (
    f"INSERT INTO journal ({', '.join(STORED_COLUMNS)}) VALUES ({', '.join('?' for _ in STORED_COLUMNS)})"
)


def row_from_event(ev: RequestFinished) -> tuple:
    return (
        ev.ts,
        ev.request_id,
        ev.ingress,
        ev.profile,
        ev.provider,
        orjson.dumps(ev.attempts or [], default=str).decode(),
        ev.model_requested,
        ev.model_used,
        ev.status,
        ev.error_class,
        ev.latency_ms,
        ev.ttfb_ms,
        ev.input_tokens,
        ev.output_tokens,
        ev.cache_read_tokens,
        ev.cache_write_tokens,
        ev.cost_usd,
        1 if ev.streaming else 0,
        ev.fallback_count,
        ev.race_outcome,
        ev.session_key,
        ev.session,
        ev.lane,
        ev.slot,
        ev.predicted_tokens,
        ev.cache_bust,
        1 if ev.usage_estimated else 0,
        ev.key_name,
        orjson.dumps(ev.settles).decode() if ev.settles else None,
    )


def epoch(value: datetime | float | int | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            # Naive datetimes are taken as UTC, the only zone the journal knows.
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    return float(value)


def decode_row(raw: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(JOURNAL_COLUMNS, raw, strict=True))
    try:
        row["attempts"] = orjson.loads(row["attempts"]) if row["attempts"] else []
    except orjson.JSONDecodeError:
        row["attempts"] = []
    row["streaming"] = bool(row["streaming"])
    row["usage_estimated"] = bool(row["usage_estimated"])
    return row


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def export_rows(rows: list[dict[str, Any]], fmt: str = "jsonl") -> str:
    """Render journal rows as JSON Lines or CSV, with `ts` as ISO 8601 UTC."""
    if fmt == "jsonl":
        lines = [orjson.dumps({**r, "ts": _iso(r["ts"])}).decode() for r in rows]
        return "".join(line + "\n" for line in lines)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(JOURNAL_COLUMNS)
        for r in rows:
            out = []
            for col in JOURNAL_COLUMNS:
                value = r.get(col)
                if col == "ts":
                    value = _iso(r["ts"])
                elif col == "attempts":
                    value = orjson.dumps(value or []).decode()
                elif value is None:
                    value = ""
                out.append(value)
            writer.writerow(out)
        return buf.getvalue()
    raise ValueError(f"unknown export format {fmt!r}; expected 'jsonl' or 'csv'")
