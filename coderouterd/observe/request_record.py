"""A finished request as events: the journal's RequestFinished (with its cost), ToolRepaired, FallbackUsed,
and the prompt-cache heuristic. Built on the event loop in O(attempts); every write happens in the bus's
writer thread. The typed skips and attempts become JSON here, at the journal's edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..ids import MAX_STORED_CHARS, clip
from ..state import FallbackUsed, RequestFinished, cost_usd
from ..state.events import ToolRepaired, moved_past
from .cache_watch import CacheWatch

if TYPE_CHECKING:
    from ..routing.executor import Exchange


class RequestRecorder:
    def __init__(self, publish: Callable[[object], None]) -> None:
        self._publish = publish
        self.cache = CacheWatch(publish)

    def record(self, ex: Exchange, latency_s: float) -> None:
        u = ex.usage or {}
        provider = ex.served_by
        cost = 0.0
        if provider is not None:
            cfg = ex.runtime.providers[provider].cfg
            if cfg.cost.input or cfg.cost.output or cfg.cost.cache_read or cfg.cost.cache_write:
                cost = cost_usd(u, cfg.cost)
        ex.cost_usd = cost
        fallback_count = len(moved_past(ex.attempts, provider is not None))
        attempts = [_bounded(r.as_dict(message=False)) for r in ex.skips_and_attempts()]
        publish = self._publish
        publish(RequestFinished(
            request_id=ex.req.request_id, ingress=ex.req.ingress, profile=ex.profile_name, provider=provider,
            attempts=attempts, model_requested=clip(ex.req.model), model_used=clip(ex.model_used or ""),
            status=ex.status,
            error_class=ex.error_class, latency_ms=round(latency_s * 1000, 3),
            ttfb_ms=round(ex.ttfb * 1000, 3) if ex.ttfb is not None else None,
            input_tokens=u.get("input_tokens") or 0, output_tokens=u.get("output_tokens") or 0,
            cache_read_tokens=u.get("cache_read_input_tokens") or 0,
            cache_write_tokens=u.get("cache_creation_input_tokens") or 0,
            cost_usd=cost, streaming=ex.req.stream, fallback_count=fallback_count, race_outcome=ex.race_outcome,
            overhead_ms=round(max(0.0, latency_s - ex.upstream_wait_s) * 1000, 3),
            session_key=_clip_opt(ex.req.session_key()),
            **_affinity_fields(ex.affinity),
            tool_repair=ex.repair_applied, settles=ex.settles,
        ))
        if ex.tools_repaired and provider is not None:
            publish(ToolRepaired(request_id=ex.req.request_id, provider=provider,
                                 model=ex.model_used or "", calls=ex.tools_repaired,
                                 formats=sorted(set(ex.repair_formats)), streaming=ex.req.stream))
        if fallback_count:
            publish(FallbackUsed(request_id=ex.req.request_id, profile=ex.profile_name, chain=attempts))
        if provider is not None:
            self.cache.observe(provider, ex.profile_name, u, ex.runtime.providers[provider].cfg.cost)


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
