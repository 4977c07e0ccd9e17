"""The requests being served now, one by one (the dashboard's Live card; GET /v1/now/requests): each with its id,
ingress, profile, the model asked for, how long it has run, and the provider it is on.

The ingress keeps each request's record in `daemon.requests_now` from the moment it is planned until it ends
(ingress/dispatch.py); this view reads it on the loop, so it never races the request it describes. The provider it
is on: the one serving it once chosen, else the next in its plan after the attempts that ended (in fallback order,
the one being tried), else none yet (still planning or waiting for a start)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .apitype import Answer

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

MAX_SHOWN = 100  # a burst of thousands is a count, not a table


class InFlightRequest(Answer):
    request_id: str
    ingress: str | None = None
    profile: str | None = None
    model: str | None = None  # as the client asked for it
    key: str | None = None  # the team key's name
    provider: str | None = None  # the provider it is on now; None: none chosen yet
    attempts: int = 0  # attempts that already ended (failed over from)
    started: float  # epoch seconds
    elapsed_s: float
    stream: bool | None = None


class InFlightAnswer(Answer):
    requests: list[InFlightRequest]  # oldest first
    total: int  # all in flight, also those beyond the shown ones
    now: float


def provider_now(record: Any) -> str | None:
    if record.served_by is not None:
        return str(record.served_by)
    plan = record.plan
    if plan is None:
        return None
    tried = len(record.attempts)
    return str(plan.candidates[tried]) if tried < len(plan.candidates) else None


def answer(d: Daemon, now: float | None = None) -> InFlightAnswer:
    now = time.time() if now is None else now
    records = list(d.requests_now.values())
    out = []
    for record in records[:MAX_SHOWN]:
        req = record.req
        out.append(InFlightRequest(
            request_id=req.request_id, ingress=req.ingress, profile=record.profile_name, model=req.model,
            key=req.key.name if req.key is not None else None, provider=provider_now(record),
            attempts=len(record.attempts), started=req.wall_started,
            elapsed_s=round(max(0.0, now - req.wall_started), 3), stream=req.stream))
    return InFlightAnswer(requests=out, total=len(records), now=now)
