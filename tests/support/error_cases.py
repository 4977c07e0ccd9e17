"""Every error coderouterd makes itself, as its makers make it, per ingress: the cases docs/protocols.md ("Errors
coderouterd sends") tabulates and tests/unit/test_error_vocabulary.py walks. Each case returns what its maker hands
the ingress's responder: (status, kind, code, extra headers), taken from the maker itself where it is a function
(routing/replies.py, ingress/auth.py) and as its call site passes it otherwise."""

from __future__ import annotations

from collections.abc import Callable

from coderouterd.guards.key_limits import rate_headers
from coderouterd.ingress.auth import KeyRefusal
from coderouterd.keys.limits import Refusal
from coderouterd.providers.errors import OVERFLOW, UpstreamError, http_error
from coderouterd.routing import replies
from coderouterd.routing.planner import Skip

INGRESSES = ("anthropic", "openai", "responses", "gemini")

Made = tuple[int, str | None, str | None, dict[str, str]]


def _reply(r: replies.Reply) -> Made:
    return r.status, r.kind, r.code, dict(r.headers or {})


def _failed(status: int) -> UpstreamError:
    return http_error(status, f"upstream said {status}", retry_after=7.0 if status == 429 else None)


def _key_rate(ingress: str) -> Made:
    refusal = Refusal(key="alice", message="key 'alice' is over its rpm", limit="rpm", allowed=3, retry_after_s=12.2,
                      requests=(3, 0, 12.2), tokens=None)
    return 429, "rate_limit_error", "rate_limit_exceeded", rate_headers(refusal, ingress, now=0.0)


_ARGS = {"profile": "default", "summary": "a: why"}

CASES: dict[str, Callable[[str], Made]] = {
    "invalid request": lambda i: (400, "invalid_request_error", None, {}),
    "prompt too long": lambda i: _reply(replies.overflow(UpstreamError(OVERFLOW, status=400, message="m",
                                                                       overflow=(9000, 8192)), ingress=i)),
    "output does not fit": lambda i: _reply(replies.overflow(UpstreamError(OVERFLOW, status=400, message="m",
                                                                           overflow=(2000, 8192)), ingress=i,
                                                             max_tokens=32000)),
    "no provider can serve it": lambda i: _reply(replies.nothing_attempted([Skip("a", "tools", "no tools")],
                                                                           ingress=i, **_ARGS)),
    "no or wrong key": lambda i: (401, KeyRefusal(401, "m", "unknown").error_type, None, {}),
    "key outside its scope": lambda i: (403, KeyRefusal(403, "m", "scope").error_type, None, {}),
    "browser refused": lambda i: (403, "permission_error", None, {}),
    "unknown endpoint": lambda i: (404, "not_found_error", None, {}),
    "method not allowed": lambda i: (405, "invalid_request_error", None, {}),
    "body too large": lambda i: (413, "request_too_large", None, {}),
    "body not JSON-typed": lambda i: (415, "invalid_request_error", None, {}),
    "key rate limit": _key_rate,
    "every provider rate-limited": lambda i: _reply(replies.all_failed([_failed(429)], ingress=i, **_ARGS)),
    "budget spent": lambda i: _reply(replies.budget_spent(["cap reached"], ingress=i, profile="default")),
    "model cannot start": lambda i: _reply(replies.cannot_start(["file missing"], ingress=i, profile="default")),
    "internal error": lambda i: (500, "api_error", None, {}),
    "every provider failed": lambda i: _reply(replies.all_failed([_failed(500)], ingress=i, **_ARGS)),
    "every provider busy": lambda i: _reply(replies.all_failed([_failed(503)], ingress=i, **_ARGS)),
    "nothing available now": lambda i: _reply(replies.nothing_attempted(
        [Skip("a", "breaker_open", "breaker open", retry_in_s=4.2)], ingress=i, **_ARGS)),
}


# Answered at the connection, before any handler (ingress/protocol.py, ingress/guard.py), from the path alone:
# case -> (status, the type protocol.py names for an Anthropic path, for a chat path).
EDGE_PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions", "responses": "/v1/responses",
              "gemini": "/v1beta/models/m:generateContent"}
EDGE_CASES: dict[str, tuple[int, str, str]] = {
    "connection limit": (503, "overloaded_error", "server_error"),
    "body not received in time": (408, "timeout_error", "invalid_request_error"),
    "headers too large": (431, "invalid_request_error", "invalid_request_error"),
    "internal error at the edge": (500, "api_error", "api_error"),
}

# Errors after the stream began (the status line already said 200): case -> (status, kind) as the executor's
# `_fail_committed` and the guards hand them to the responder.
MID_STREAM: dict[str, tuple[int, str]] = {
    "upstream failed mid-stream": (502, "api_error"),
    "upstream overloaded mid-stream": (529, "overloaded_error"),
    "upstream rate-limited mid-stream": (429, "rate_limit_error"),
    "internal error mid-stream": (500, "api_error"),
}
