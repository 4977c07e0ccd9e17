"""The decision traces of the most recent requests, kept in memory for `corectl explain` and the dashboard; the
journal keeps the rest (`trace_from_row` reads one of its rows as a trace)."""

from __future__ import annotations

from collections import OrderedDict

from ..ids import MAX_STORED_CHARS, clip

RECENT_TRACES = 500


class RecentTraces(OrderedDict):
    """request id -> decision trace (JSON-ready), newest last, at most `limit` of them."""

    def __init__(self, limit: int = RECENT_TRACES) -> None:
        super().__init__()
        self.limit = limit

    def add(self, request_id: str, trace: dict) -> None:
        if len(trace.get("model_requested") or "") > MAX_STORED_CHARS:  # 500 kept traces x a 3 MB model name
            trace["model_requested"] = clip(trace["model_requested"])
        self[request_id] = trace
        if len(self) > self.limit:
            self.popitem(last=False)


def trace_from_row(row: dict) -> dict:
    """The journal row in the shape of a decision trace; what the journal does not keep is None."""
    steps = row.get("attempts") or []
    return {
        "request_id": row["request_id"], "ts": row["ts"], "ingress": row.get("ingress"), "key": row.get("key_name"),
        "stream": row.get("streaming"), "model_requested": row.get("model_requested"),
        "model_used": row.get("model_used"), "profile": row.get("profile"), "mode": None,
        "candidates": None, "effective_order": None, "order_notes": None,
        "skips": [{"provider": s["provider"], "reason": s.get("reason"), "message": ""}
                  for s in steps if s.get("outcome") == "skipped"],
        "attempts": [a for a in steps if a.get("outcome") != "skipped"],
        # The journal's provider also names one whose own error ended the request: it served only with an ok.
        "served_by": row.get("provider") if any(a.get("outcome") == "ok" for a in steps) else None,
        "status": row.get("status"), "error_class": row.get("error_class"),
        "race_outcome": row.get("race_outcome"), "latency_ms": row.get("latency_ms"), "ttfb_ms": row.get("ttfb_ms"),
        "usage": {"input_tokens": row.get("input_tokens"), "output_tokens": row.get("output_tokens"),
                  "cache_read_input_tokens": row.get("cache_read_tokens"),
                  "cache_creation_input_tokens": row.get("cache_write_tokens")},
        "usage_estimated": bool(row.get("usage_estimated")),
        "cost_usd": row.get("cost_usd"),
        # The journal keeps a guard's stop as the error class, not its detail.
        "guards": [{"guard": "tool_loop", "action": "break"}] if row.get("error_class") == "tool_loop" else [],
        "affinity": {"session": row.get("session"), "lane": row.get("lane"), "slot": row.get("slot"),
                     "predicted_tokens": row.get("predicted_tokens"), "cached_tokens": row.get("cache_read_tokens"),
                     "cache_bust": {"segment": row["cache_bust"]} if row.get("cache_bust") else None}
        if row.get("lane") else None,
    }
