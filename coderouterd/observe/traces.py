"""The decision traces of the most recent requests, kept in memory for `corectl explain`; the journal keeps
the rest."""

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
