"""Errors in the caller's API vocabulary: one table per ingress, status -> type/code (docs/protocols.md, "Errors
coderouterd sends", holds the same tables and tests/unit/test_error_vocabulary.py walks them).

Routing names what went wrong with an error kind (wire/errors.py: Anthropic's type names); an upstream's error passed
on may carry its own wire's type. Here each is said in the caller's words: an OpenAI client never reads
`overloaded_error`, an Anthropic client never reads `server_error`."""

from __future__ import annotations

import orjson

from ..wire.errors import error_kind

# -- Anthropic ------------------------------------------------------------------------------------------------------

ANTHROPIC_TYPES = frozenset({"invalid_request_error", "authentication_error", "billing_error", "permission_error",
                             "not_found_error", "request_too_large", "rate_limit_error", "api_error",
                             "overloaded_error", "timeout_error"})


def anthropic_type(status: int, kind: str | None = None) -> str:
    """`kind` when it is one of Anthropic's types (routing's kinds are), else the type the status means."""
    if kind in ANTHROPIC_TYPES:
        return kind  # type: ignore[return-value]  # kind is a str when it is in the set
    if status == 503:
        return "overloaded_error"  # "busy, retry": Anthropic's word for it (its own 503s say overloaded)
    return error_kind(status)


def anthropic_error_body(status: int, message: str, *, error_type: str | None = None, extra: dict | None = None,
                         request_id: str | None = None) -> bytes:
    err = {"type": anthropic_type(status, error_type), "message": message}
    if extra:
        err.update(extra)
    body: dict = {"type": "error", "error": err}
    if request_id:
        body["request_id"] = request_id
    return orjson.dumps(body)


def anthropic_error_event(error_type: str, message: str, status: int = 500) -> dict:
    return {"type": "error", "error": {"type": anthropic_type(status, error_type), "message": message}}


# -- OpenAI (Chat Completions and the Responses API) ----------------------------------------------------------------

# status -> (error.type, error.code) when routing said nothing more specific. OpenAI's own: 401 invalid_api_key,
# 429 rate_limit_exceeded, 402-like spend refusals insufficient_quota, 5xx server_error.
OPENAI_BY_STATUS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    402: ("insufficient_quota", "insufficient_quota"),
    403: ("permission_error", None),
    404: ("not_found_error", None),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", None),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
    431: ("invalid_request_error", "request_too_large"),
    500: ("server_error", None),
    502: ("server_error", None),
    503: ("server_error", "server_is_overloaded"),
    504: ("server_error", "timeout"),
    529: ("server_error", "server_is_overloaded"),
}
# Routing's kinds (Anthropic's names) in OpenAI's words.
OPENAI_BY_KIND: dict[str, tuple[str, str | None]] = {
    "invalid_request_error": ("invalid_request_error", None),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "permission_error": ("permission_error", None),
    "not_found_error": ("not_found_error", None),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "billing_error": ("insufficient_quota", "insufficient_quota"),
    "rate_limit_error": ("rate_limit_exceeded", "rate_limit_exceeded"),
    "overloaded_error": ("server_error", "server_is_overloaded"),
    "timeout_error": ("server_error", "timeout"),
    "api_error": ("server_error", None),
}
# Types OpenAI's API itself answers with (an OpenAI upstream's error passed on keeps its own): kept as they are.
OPENAI_NATIVE = frozenset({"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                           "rate_limit_exceeded", "insufficient_quota", "server_error", "requests", "tokens"})


def _openai_status(status: int) -> tuple[str, str | None]:
    got = OPENAI_BY_STATUS.get(status)
    if got is not None:
        return got
    return ("server_error", None) if status >= 500 else ("invalid_request_error", None)


def openai_type(status: int, kind: str | None = None, code: str | None = None) -> tuple[str, str | None]:
    """(error.type, error.code) for an OpenAI-wire client. The status decides the family (a 5xx is never an
    invalid request, whatever kind was named); within it a known kind refines it; an explicit code wins."""
    by_status = _openai_status(status)
    by_kind = OPENAI_BY_KIND.get(kind or "")
    if by_kind is not None and (by_kind[0] == "server_error") == (status >= 500):
        chosen = by_kind
    elif kind in OPENAI_NATIVE and (kind == "server_error") == (status >= 500):
        chosen = (kind, by_status[1])  # type: ignore[assignment]  # kind is a str when it is in the set
    else:
        chosen = by_status
    # The status's own code where the kind named none in the same type (a 405 or 408 invalid request).
    return chosen[0], code or chosen[1] or (by_status[1] if chosen[0] == by_status[0] else None)


def openai_error_body(status: int, message: str, *, error_type: str | None = None, param: str | None = None,
                      code: str | None = None, extra: dict | None = None) -> bytes:
    etype, ecode = openai_type(status, error_type, code)
    err = {"message": message, "type": etype, "param": param, "code": ecode}
    if extra:
        err.update(extra)
    return orjson.dumps({"error": err})


# What a Responses stream's `response.failed` carries as `error.code` (Codex and the SDK read it).
RESPONSES_FAILED_CODES = {"server_is_overloaded": "server_is_overloaded", "rate_limit_exceeded": "rate_limit_exceeded",
                          "insufficient_quota": "insufficient_quota", "context_length_exceeded":
                              "context_length_exceeded"}


def responses_failed_code(status: int, kind: str | None, code: str | None) -> str:
    """`response.failed`'s error.code: the specific code when there is one Codex knows, else by family."""
    etype, ecode = openai_type(status, kind, code)
    if ecode is not None and ecode in RESPONSES_FAILED_CODES:
        return ecode
    if code:
        return code
    return "server_error" if etype == "server_error" else "invalid_prompt" if status == 400 else etype


def status_of_kind(kind: str | None) -> int:
    """The status an error kind stands for, for an error written after the status line went out (mid-stream)."""
    return {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
            "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "rate_limit_exceeded": 429,
            "insufficient_quota": 429, "overloaded_error": 529, "timeout_error": 504}.get(kind or "", 500)


# -- Gemini ---------------------------------------------------------------------------------------------------------

# HTTP status -> google.rpc status name, as Google's APIs pair them. 529 is Anthropic's: a Gemini client gets 503.
GEMINI_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 402: "FAILED_PRECONDITION", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 405: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT",
                 415: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 431: "INVALID_ARGUMENT", 499: "CANCELLED",
                 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
                 504: "DEADLINE_EXCEEDED"}


def gemini_http_status(status: int) -> int:
    return 503 if status == 529 else status


# Refusals no retry can help, said as Google says "not in a state to do this" (always with HTTP 400): Gemini CLI
# retries 429 and 5xx answers on its own, whatever headers say, and stops at a 400.
GEMINI_FINAL_REASONS = frozenset({"budget_exceeded", "backend_cannot_start"})


def gemini_status(status: int, reason: str | None = None) -> str:
    status = gemini_http_status(status)
    if status == 400 and reason in GEMINI_FINAL_REASONS:
        return "FAILED_PRECONDITION"
    return GEMINI_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")


# -- any wire, by name ----------------------------------------------------------------------------------------------

def wire_status(ingress: str, status: int) -> int:
    """The HTTP status a wire's client is answered with: 529 is Anthropic's alone, everyone else gets 503."""
    return status if status != 529 or ingress == "anthropic" else 503
