"""The history view-model: this month's spend, latency and cache trends, the journal's last requests, and one
request's decision trace, each as the admin API's model (apitype.py). The admin API (GET /v1/history/...) returns
these models and the dashboard serialises the very same ones (ui/app.py), so the two cannot drift apart.

The journal is read through the one journal reader (state/journal_reader.py), this daemon's SQLite file: each
answer's reads run in one worker thread (one `to_thread` per answer), never on the loop. With [state] disabled
there is no journal: trends are empty and the requests come from the traces kept in memory.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..guards.budget import month_bounds
from ..observe.traces import trace_from_row
from ..state.journal import OUTCOMES
from ..state.journal_reader import JournalReader, SqliteJournal
from ..state.replay import is_error
from ..state.trends import month_days, provider_series
from . import apitype

if TYPE_CHECKING:  # the daemon hands itself in; history reads it, never imports it at run time
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

# A window and its bucket: about 60 points per chart, whatever the window.
RANGES: dict[str, tuple[float, float]] = {
    "1h": (3_600.0, 60.0),
    "6h": (21_600.0, 360.0),
    "24h": (86_400.0, 1_800.0),
    "7d": (604_800.0, 10_800.0),
    "30d": (2_592_000.0, 43_200.0),
}
DEFAULT_RANGE = "24h"
MAX_REQUESTS = 500

# A request as the list shows it: metadata only (no attempts, no session key; the trace has the route).
_BRIEF = ("ts", "request_id", "ingress", "profile", "provider", "model_requested", "model_used", "status",
          "error_class", "latency_ms", "ttfb_ms", "input_tokens", "output_tokens", "cache_read_tokens",
          "cache_write_tokens", "cost_usd", "streaming", "fallback_count", "cache_bust", "key_name")


def journal(daemon: Daemon) -> JournalReader | None:
    """This daemon's journal, or None with [state] disabled."""
    path = daemon.telemetry.journal_path
    return SqliteJournal(path) if path is not None else None


async def spend(daemon: Daemon, now: float | None = None) -> apitype.SpendAnswer:
    """Cost per UTC day of this month per provider (from the journal), next to the budget ledger's spent,
    reserved-in-flight and cap for each (the same ledger `corectl budget` shows)."""
    now = time.time() if now is None else now
    month, start, end = month_bounds(now)
    reader = journal(daemon)
    per_day = await asyncio.to_thread(reader.daily_cost, start, end) if reader is not None else {}
    days = month_days(start, end)
    today = int((now - start) // 86_400)
    ledger = daemon.budget.snapshot()  # the ledger alone: the skips views.budget adds are not charted
    booked = ledger.get("providers") or {}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(per_day) | set(booked)):
        costs = per_day.get(name, {})
        b = booked.get(name) or {}
        if not any(costs.values()) and not (b.get("cap") or b.get("spent") or b.get("reserved")):
            continue  # a free provider: nothing to chart
        out[name] = {"daily": [costs.get(i, 0.0) if i <= today else None for i in range(len(days))],
                     "spent": b.get("spent"), "reserved": b.get("reserved", 0.0), "cap": b.get("cap") or None,
                     "ratio": b.get("ratio"), "blocked": b.get("blocked", False)}
    return apitype.SpendAnswer.model_validate({"month": month, "days": days, "today": today, "providers": out,
                                               "global": ledger.get("global"), "journal": reader is not None})


async def trends(daemon: Daemon, range_name: str = DEFAULT_RANGE, now: float | None = None) -> apitype.TrendsAnswer:
    """Latency (time to first byte and total, p50/p95) and prefix-cache hit ratio per provider over the window,
    and the newest cache-busts with the segment that changed."""
    span, step = RANGES[range_name]
    now = time.time() if now is None else now
    since = now - span
    reader = journal(daemon)

    def read(reader: JournalReader) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return reader.series_rows(since, now), reader.cache_busts()

    rows, busts = await asyncio.to_thread(read, reader) if reader is not None else ([], [])
    # The oldest request in the window: the page opens at the last hour while nothing is older (issue 43, E9).
    first = min((r["ts"] for r in rows if r.get("ts") is not None), default=None)
    return apitype.TrendsAnswer.model_validate({**provider_series(rows, since, now, step), "range": range_name,
                                                "busts": busts, "journal": reader is not None, "first_ts": first})


_MAX_WHY_PARTS = 3


def why(skips: list[dict[str, Any]], attempts: list[dict[str, Any]]) -> str:
    """A short why for the Requests table, from what was skipped and tried: "fast http_500, paid skipped
    (budget)"; empty when the first provider tried served it and nothing was skipped."""
    parts = [f"{s.get('provider') or '?'} skipped ({s.get('reason') or '?'})" for s in skips]
    for a in attempts:
        outcome = a.get("outcome")
        if outcome == "ok":
            continue
        what = a.get("reason") or outcome or "?"
        parts.append(f"{a.get('provider') or '?'} {what}" + (" (panic)" if a.get("panic") else ""))
    if len(parts) > _MAX_WHY_PARTS:
        parts = [*parts[:_MAX_WHY_PARTS], f"+{len(parts) - _MAX_WHY_PARTS} more"]
    return ", ".join(parts)


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    steps = row.get("attempts") or []
    return {**{k: row.get(k) for k in _BRIEF},
            "reason": why([s for s in steps if s.get("outcome") == "skipped"],
                          [s for s in steps if s.get("outcome") != "skipped"])}


def _brief_from_trace(t: dict[str, Any]) -> dict[str, Any]:
    u = t.get("usage") or {}
    aff = t.get("affinity") or {}
    return {"ts": t.get("ts"), "request_id": t.get("request_id"), "ingress": t.get("ingress"),
            "profile": t.get("profile"), "provider": t.get("served_by"), "model_requested": t.get("model_requested"),
            "model_used": t.get("model_used"), "status": t.get("status"), "error_class": t.get("error_class"),
            "latency_ms": t.get("latency_ms"), "ttfb_ms": t.get("ttfb_ms"), "input_tokens": u.get("input_tokens"),
            "output_tokens": u.get("output_tokens"), "cache_read_tokens": u.get("cache_read_input_tokens"),
            "cache_write_tokens": u.get("cache_creation_input_tokens"), "cost_usd": t.get("cost_usd"),
            "streaming": t.get("stream"), "fallback_count": None, "key_name": t.get("key"),
            "cache_bust": (aff.get("cache_bust") or {}).get("segment"),
            "reason": why(t.get("skips") or [], t.get("attempts") or [])}


def _matches(b: dict[str, Any], profile: str | None, provider: str | None, outcome: str | None) -> bool:
    if profile is not None and b["profile"] != profile:
        return False
    if provider is not None and b["provider"] != provider:
        return False
    if outcome == "error":
        return is_error(b)
    if outcome == "ok":
        return not is_error(b)
    return True


async def requests(daemon: Daemon, *, profile: str | None = None, provider: str | None = None,
                   outcome: str | None = None, limit: int = 50,
                   before: float | None = None, key: str | None = None,
                   since: float | None = None) -> apitype.HistoryRequestsAnswer:
    """The last requests, newest first, filtered by profile, provider and outcome (ok | error | fallback);
    with `before` (epoch seconds), the ones older than it: the next page of a list whose oldest is `before`;
    with `since` (epoch seconds), none older than it (the time filter)."""
    if outcome is not None and outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
    limit = max(1, min(int(limit), MAX_REQUESTS))
    reader = journal(daemon)
    if reader is not None:
        rows = await asyncio.to_thread(reader.rows, provider=provider, profile=profile, outcome=outcome,
                                       limit=limit, until=before, key=key, since=since)
        rows.reverse()
        return apitype.HistoryRequestsAnswer.model_validate({"source": "journal",
                                                             "requests": [_brief(r) for r in rows]})
    out = []
    if outcome != "fallback":  # memory traces do not count fallbacks the journal's way; say nothing rather than guess
        for rid in reversed(daemon.recent):
            b = _brief_from_trace(daemon.recent[rid])
            if before is not None and (b["ts"] or 0) >= before:
                continue
            if since is not None and (b["ts"] or 0) < since:
                break  # newest first: every one after this is older still
            if _matches(b, profile, provider, outcome) and (key is None or (b["key_name"] or "-") == key):
                out.append(b)
                if len(out) >= limit:
                    break
    return apitype.HistoryRequestsAnswer.model_validate({"source": "memory", "requests": out})


async def trace(daemon: Daemon, request_id: str) -> apitype.DashboardTrace | None:
    """The trace as `corectl explain` finds it: the full trace from memory while the daemon holds it, else the
    journal's row read as a trace (source "journal"); None when neither has it."""
    t = daemon.recent.get(request_id)
    if t is not None:
        return apitype.DashboardTrace.model_validate({"trace": _order_as_run(t), "source": "memory"})
    reader = journal(daemon)
    if reader is None:
        return None
    row = await asyncio.to_thread(reader.row, request_id)
    if row is None:
        return None
    return apitype.DashboardTrace.model_validate({"trace": _order_as_run(trace_from_row(row)), "source": "journal"})


def _order_as_run(t: dict[str, Any]) -> dict[str, Any]:
    """The trace with its order as it ran: a provider the plan listed and then skipped at its turn (the budget's
    worst case over what was left, a start that could not happen) is in the Skipped table, not in the order
    (issue 43, E11). The plan's own order stays as `planned_order`."""
    order = t.get("effective_order")
    skipped = {s.get("provider") for s in t.get("skips") or []}
    if not order or not skipped & set(order):
        return t
    return {**t, "effective_order": [p for p in order if p not in skipped], "planned_order": list(order)}
