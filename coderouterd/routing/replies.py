"""What the client is told when nobody served its request: pure, from the failures and skips collected.

The policy in one place: a 429 as the last failure stays a 429 with the soonest retry-after of the chain;
failures the request itself caused everywhere come back as the client's 4xx; otherwise overloaded
(529 Anthropic / 503 OpenAI) when every failure said "busy", else 502. Nothing attempted: 529/503 when
something was skipped for a passing reason; a final "budget spent" when the only thing standing in the way is a
cap that resets next month; else 400 (no provider can serve this request)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..providers.errors import UpstreamError
from ..servers import overflow as context_overflow
from .planner import Skip

OVERLOAD_STATUSES = frozenset({429, 503, 529})
_WAIT_SKIPS = frozenset({"breaker_open", "memory_cooldown", "unhealthy", "not_ready", "budget"})


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    message: str
    kind: str | None  # an error kind (wire/errors.py); None: the sink derives it from the status
    headers: dict[str, str] | None = None
    code: str | None = None  # a machine code some wires carry (OpenAI's error.code)


def retry_after_value(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def requested_output(body: dict) -> int:
    """The output tokens a request asked for (0: it did not say), in the canonical body of any ingress (the
    Responses and Gemini ingresses' bodies are their chat translations, which carry max_tokens)."""
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def overflow(e: UpstreamError, *, ingress: str = "anthropic", max_tokens: int = 0) -> Reply:
    """In each wire's own words (servers/overflow.client_message): Claude Code compacts on "prompt is too long"
    and lowers max_tokens on "input length and `max_tokens` exceed context limit: P + M > L"; Codex reads the
    code. The numbers are the server's (and `max_tokens` the request's): ones it did not give are said to be
    unknown, never estimated here."""
    n, m = e.overflow or (0, 0)
    # OpenAI-shaped clients (Codex) recognise the overflow by its code and compact their history.
    return Reply(400, context_overflow.client_message(n, m, e.message, max_tokens=max_tokens, wire=ingress),
                 "invalid_request_error", code="context_length_exceeded")


def passed_on(e: UpstreamError) -> Reply:
    """An upstream error that ends the request, passed to the client as it came."""
    headers = {"retry-after": retry_after_value(e.retry_after)} if e.retry_after else None
    return Reply(e.status or 502, e.message, e.error_type, headers)


def all_failed(errors: list[UpstreamError], *, ingress: str, profile: str, summary: str,
               skips: list[Skip] | tuple[Skip, ...] = ()) -> Reply:
    """`skips`: the providers not attempted; a known time one of them passes (a breaker's reopening) counts towards
    an overload's Retry-After as an upstream's own retry-after does."""
    last = errors[-1]
    retry = [e.retry_after for e in errors if e.retry_after]
    if all(e.status in OVERLOAD_STATUSES for e in errors):
        retry += [s.retry_in_s for s in skips if s.reason in _WAIT_SKIPS and s.retry_in_s]
    headers = {"retry-after": retry_after_value(min(retry))} if retry else None
    message = f"all providers failed for profile {profile!r}: {summary}"
    if last.status == 429:
        # Rate limits reach the client as rate limits, with the soonest retry-after of the chain, so the SDKs
        # back off for the right time instead of retrying an "overloaded" at once.
        return Reply(429, message, "rate_limit_error", headers)
    if all(e.caused_by_request for e in errors):
        # Every provider refused the request itself: it is the client's to fix, in the client's status.
        return Reply(last.status or 400, f"{last.message} ({summary})", "invalid_request_error")
    if all(e.status in OVERLOAD_STATUSES for e in errors):
        return Reply(529 if ingress == "anthropic" else 503, message, "overloaded_error", headers)
    return Reply(502, message, "api_error", headers)


# A spent budget must not be retried and must be shown (protocols.md, checked with the real clients):
# Claude Code makes one attempt on a 402 `billing_error` and prints its message (529 was retried unseen);
# Codex retries 402/403 five times and replaces a 429 `insufficient_quota` with its own words, but stops at
# once on a 400 and prints the body. `x-should-retry: false` stops the Anthropic and OpenAI SDKs whatever the
# status. Chat Completions clients are those SDKs: 402, as the Anthropic side. Gemini CLI retries 429 and 5xx
# whatever the headers say and stops at a 400: FAILED_PRECONDITION, Google's 400 for "not in a state to".
_SPENT_STATUS = {"anthropic": 402, "openai": 402, "responses": 400, "gemini": 400}
_SPENT_KIND = {402: "billing_error", 400: "invalid_request_error"}
NO_RETRY = {"x-should-retry": "false"}


def budget_spent(spent: list[str], *, ingress: str, profile: str) -> Reply:
    status = _SPENT_STATUS.get(ingress, 402)
    return Reply(status, f"profile {profile!r} has no provider left this month: " + "; ".join(spent),
                 _SPENT_KIND[status], dict(NO_RETRY), code="budget_exceeded")


# A managed process that cannot start (binary or model file missing, a crash loop ended FATAL, no room in the
# memory budget) will not fix itself between retries: Claude Code retried a 529/503 11 times over 172 s, then
# called it "usually temporary". Any status with `x-should-retry: false` is one attempt for Claude Code and the
# Anthropic and OpenAI SDKs, and a 500 `api_error` says the fault is the server's; Codex retries any non-2xx
# but a 400, which it prints and stops at (protocols.md), so the Responses wire gets a 400.
_CANNOT_START_STATUS = {"anthropic": 500, "openai": 500, "responses": 400, "gemini": 400}
_CANNOT_START_KIND = {500: "api_error", 400: "invalid_request_error"}


def cannot_start(reasons: list[str], *, ingress: str, profile: str) -> Reply:
    status = _CANNOT_START_STATUS.get(ingress, 500)
    return Reply(status, f"profile {profile!r} has no provider that can start: " + "; ".join(reasons),
                 _CANNOT_START_KIND[status], dict(NO_RETRY), code="backend_cannot_start")


def _soonest_retry(skips: list[Skip]) -> dict[str, str] | None:
    """Retry-After for a refusal that passes: the soonest time one of the skipped providers is known to take
    traffic again (a breaker's reopening, a memory cooldown, a start's remaining time); None when nobody knows."""
    known = [s.retry_in_s for s in skips if s.reason in _WAIT_SKIPS and s.retry_in_s is not None]
    return {"retry-after": retry_after_value(min(known))} if known else None


def _over_every_window(skips: list[Skip], ingress: str) -> Reply | None:
    """Every provider was skipped because the prompt does not fit its window: the prompt is too long, said the
    way the client's own API says it (Claude Code compacts on "prompt is too long: N tokens > M maximum")."""
    if not skips or not all(s.reason == "context" and s.window and s.tokens for s in skips):
        return None
    widest = max(skips, key=lambda s: s.window)
    return Reply(400, context_overflow.client_message(widest.tokens, widest.window, wire=ingress),
                 "invalid_request_error", code="context_length_exceeded")


def nothing_attempted(skips: list[Skip], *, ingress: str, profile: str, summary: str,
                      spent: dict[str, str] | None = None) -> Reply:
    """`spent`: provider → why its budget skip lasts until the cap resets (the others clear by themselves)."""
    spent = spent or {}
    unable = [s.message for s in skips if s.reason == "cannot_start"]
    if unable and not any(s.reason in _WAIT_SKIPS for s in skips):
        return cannot_start(list(dict.fromkeys(unable)), ingress=ingress, profile=profile)
    if spent and not any(s.reason in _WAIT_SKIPS and s.provider not in spent for s in skips):
        return budget_spent(list(dict.fromkeys(spent.values())), ingress=ingress, profile=profile)
    if any(s.reason in _WAIT_SKIPS for s in skips):
        return Reply(529 if ingress == "anthropic" else 503,
                     f"no provider available in profile {profile!r}: {summary}", "overloaded_error",
                     _soonest_retry(skips))
    too_long = _over_every_window(skips, ingress)
    if too_long is not None:
        return Reply(too_long.status, f"{too_long.message} (no provider of profile {profile!r} has room: {summary})",
                     too_long.kind, code=too_long.code)
    return Reply(400, f"no provider in profile {profile!r} can serve this request: {summary}",
                 "invalid_request_error")
