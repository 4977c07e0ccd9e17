"""A finished request's record (routing/record.py) as events: the journal's RequestFinished (with its cost),
ToolRepaired, FallbackUsed, and the prompt-cache heuristic. Built on the event loop in O(attempts); every write
happens in the bus's writer thread. The typed skips and attempts become JSON here, at the journal's edge. The
record is only read: its cost is `request_cost(record)`, computed by the caller and handed in."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..ids import MAX_STORED_CHARS, clip
from ..state import FallbackUsed, RequestFinished, cost_usd
from ..state.events import ToolRepaired, moved_past
from .cache_watch import CacheWatch

if TYPE_CHECKING:
    from ..routing.record import RequestRecord


def request_cost(record: RequestRecord) -> float:
    """What the answer cost in USD, priced with the provider's costs in the configuration it was served under
    (0 when nobody served it or the provider is free). A stream cut before its end cost what its provider
    produced until then (`record.cut`), and is priced the same way."""
    provider = record.served_by or record.answered_by
    if provider is None:
        return 0.0
    cost = record.runtime.providers[provider].cfg.cost
    if cost.input or cost.output or cost.cache_read or cost.cache_write:
        return cost_usd(record.usage or {}, cost)
    return 0.0


class RequestRecorder:
    def __init__(self, publish: Callable[[object], None]) -> None:
        self._publish = publish
        self.cache = CacheWatch(publish)

    def record(self, record: RequestRecord, latency_s: float, cost: float) -> None:
        """The request's events; `cost` is `request_cost(record)`."""
        u = record.usage or {}
        req = record.req
        provider = record.served_by
        fallback_count = len(moved_past(record.attempts, provider is not None))
        attempts = [_bounded(r.as_dict(message=False)) for r in record.skips_and_attempts()]
        publish = self._publish
        # A provider's own error answer (a context overflow that reached it) names that provider too.
        named = provider or record.answered_by
        publish(RequestFinished(
            request_id=req.request_id, ingress=req.ingress, profile=record.profile_name, provider=named,
            attempts=attempts, model_requested=clip(req.model), model_used=clip(record.model_used or "") if named else "",
            status=record.status,
            error_class=record.error_class, latency_ms=round(latency_s * 1000, 3),
            ttfb_ms=round(record.ttfb * 1000, 3) if record.ttfb is not None else None,
            input_tokens=u.get("input_tokens") or 0, output_tokens=u.get("output_tokens") or 0,
            cache_read_tokens=u.get("cache_read_input_tokens") or 0,
            cache_write_tokens=u.get("cache_creation_input_tokens") or 0,
            cost_usd=cost, streaming=req.stream, fallback_count=fallback_count, race_outcome=record.race_outcome,
            overhead_ms=round(max(0.0, latency_s - record.upstream_wait_s) * 1000, 3),
            session_key=_clip_opt(req.session_key()),
            **_affinity_fields(record.affinity),
            tool_repair=record.repair_applied, settles=record.settles, usage_estimated=record.usage_estimated,
            key_name=req.key.name if req.key is not None else None,
        ))
        if record.tools_repaired and provider is not None:
            publish(ToolRepaired(request_id=req.request_id, provider=provider,
                                 model=record.model_used or "", calls=record.tools_repaired,
                                 formats=sorted(set(record.repair_formats)), streaming=req.stream))
        if fallback_count:
            publish(FallbackUsed(request_id=req.request_id, profile=record.profile_name, chain=attempts))
        if provider is not None:
            self.cache.observe(provider, record.profile_name, u, record.runtime.providers[provider].cfg.cost)


def _affinity_fields(ticket) -> dict:
    if ticket is None:
        return {}
    return {"session": ticket.session.hashed, "lane": ticket.lane_label, "slot": ticket.slot,
            "predicted_tokens": ticket.predicted_tokens,
            "cache_bust": ticket.bust.segment if ticket.bust is not None else None}


def _clip_opt(s: str | None) -> str | None:
    return clip(s) if isinstance(s, str) else s


def _bounded(record: dict) -> dict:
    """An attempt record as stored: an upstream's error message can echo the client's input (a 3 MB model
    name), so every string in it is cut like the other client strings."""
    for k, v in record.items():
        if isinstance(v, str) and len(v) > MAX_STORED_CHARS:
            record[k] = clip(v)
    return record
