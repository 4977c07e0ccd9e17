"""Applying a team key's rate limits to a live request: admit before routing, give back when it ends.

A request without a key pays one attribute check. A refused one gets a 429 in its caller's shape with
`retry-after` in whole seconds and the rate-limit headers its clients read (Anthropic's `anthropic-ratelimit-*`,
OpenAI's `x-ratelimit-*`); a request that can never fit (its estimate alone is over the key's tpm) also gets
`x-should-retry: false` and no `retry-after`, which both official SDKs (and so Claude Code and Codex) obey:
retrying cannot help it."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from inspect import isawaitable
from typing import TYPE_CHECKING, Protocol

from ..keys.limits import Admission, Refusal, estimate_tokens
from ..state.events import Event, KeyRateLimited

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..keys.model import TeamKey
    from ..routing.executor import Exchange
    from ..routing.request import ClientRequest

RATE_LIMITED = "rate_limited"  # the record's error class (journal, metrics)


class Limiter(Protocol):
    """keys.limits.KeyLimits (one instance), or cluster.key_limits.SharedKeyLimits (the key's limits across
    instances), whose admission may wait for a lease from the database."""

    def limited(self, key: TeamKey) -> bool: ...

    def admit(self, key: TeamKey, tokens: int) -> Admission | Refusal | Awaitable[Admission | Refusal]: ...

    def release(self, adm: Admission, actual_tokens: int | None) -> None: ...

    def usage(self, key: TeamKey) -> dict: ...


def _reset_duration(seconds: float) -> str:
    """OpenAI's reset format: "1s", "6m0s", "20ms"."""
    if seconds < 1:
        return f"{max(int(seconds * 1000), 0)}ms"
    s = math.ceil(seconds)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def _reset_time(seconds: float, now: float) -> str:
    """Anthropic's reset format: the RFC 3339 time the window is whole again."""
    return datetime.fromtimestamp(now + seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def rate_headers(r: Refusal, ingress: str, now: float | None = None) -> dict[str, str]:
    """The refusal's headers for the caller's wire."""
    now = time.time() if now is None else now
    # A request that can never fit says so and names no time: a Retry-After would invite the retry that cannot help.
    h = {"x-should-retry": "false"} if r.final else {"retry-after": str(r.retry_after_header())}
    if ingress == "anthropic":
        for name, part in (("requests", r.requests), ("tokens", r.tokens)):
            if part is not None:
                limit, remaining, reset = part
                h[f"anthropic-ratelimit-{name}-limit"] = str(limit)
                h[f"anthropic-ratelimit-{name}-remaining"] = str(remaining)
                h[f"anthropic-ratelimit-{name}-reset"] = _reset_time(reset, now)
    else:
        for name, part in (("requests", r.requests), ("tokens", r.tokens)):
            if part is not None:
                limit, remaining, reset = part
                h[f"x-ratelimit-limit-{name}"] = str(limit)
                h[f"x-ratelimit-remaining-{name}"] = str(remaining)
                h[f"x-ratelimit-reset-{name}"] = _reset_duration(reset)
    return h


def request_tokens(req: ClientRequest) -> int:
    body = req.body
    return estimate_tokens(req.estimated_tokens(), body.get("max_tokens") or body.get("max_completion_tokens"))


def used_tokens(usage: dict | None) -> int | None:
    """Input (cached or not) plus output, as the upstream reported them; None when nothing was reported."""
    if not usage:
        return None
    total = 0
    for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        v = usage.get(name)
        if isinstance(v, int) and v > 0:
            total += v
    return total


class KeyGuard:
    def __init__(self, limiter: Limiter, publish: Callable[[Event], None] | None = None) -> None:
        self.limiter = limiter
        self._publish = publish

    async def admit(self, ex: Exchange) -> bool:
        """Before routing: True when the request was refused (answered with a 429 here)."""
        req = ex.req
        key = req.key
        if key is None or not self.limiter.limited(key):
            return False
        got = self.limiter.admit(key, request_tokens(req))
        if isawaitable(got):
            got = await got
        if isinstance(got, Admission):
            req.limits = got
            return False
        if self._publish is not None:
            self._publish(KeyRateLimited(key=key.name, limit=got.limit, allowed=got.allowed,
                                         retry_after_s=-1.0 if got.final else round(got.retry_after_s, 3),
                                         request_id=req.request_id, message=got.message))
        ex.record.end(429, RATE_LIMITED)
        await ex.sink.error(429, got.message, kind="rate_limit_error", code="rate_limit_exceeded",
                            headers={"x-coderouter-profile": ex.profile_name, **rate_headers(got, req.ingress)})
        return True

    def release(self, req: ClientRequest, usage: dict | None, *, upstream: bool = True) -> None:
        """The request ended (answered, failed or its client gone): its slot is free, its tokens settled.
        `upstream` False: no upstream was asked (refused by a guard, every provider skipped): it used no token."""
        adm = req.limits
        if isinstance(adm, Admission):
            self.limiter.release(adm, used_tokens(usage) if upstream else 0)

    def usage(self, key: TeamKey) -> dict:
        """The key's rate now against its limits on this instance (status, the dashboard's Keys view)."""
        return self.limiter.usage(key)
