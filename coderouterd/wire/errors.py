"""Error kinds: the vocabulary routing uses to say what went wrong, independent of the client's wire.

The names are Anthropic's error types (the richest of the wires we speak); each ingress maps them onto its own
shape. Routing picks a kind, ingress writes it: this table is shared so neither imports the other."""

from __future__ import annotations

ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_kind(status: int) -> str:
    """The error kind a status means when nobody said more."""
    return ERROR_KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")
