"""Errors in the caller's API shape (Anthropic or OpenAI)."""

from __future__ import annotations

import orjson

from ..wire.errors import error_kind

OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    return error_kind(status)


def anthropic_error_body(status: int, message: str, *, error_type: str | None = None, extra: dict | None = None,
                         request_id: str | None = None) -> bytes:
    err = {"type": error_type or anthropic_type(status), "message": message}
    if extra:
        err.update(extra)
    body: dict = {"type": "error", "error": err}
    if request_id:
        body["request_id"] = request_id
    return orjson.dumps(body)


def anthropic_error_event(error_type: str, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def openai_error_body(status: int, message: str, *, error_type: str | None = None, param: str | None = None,
                      code: str | None = None, extra: dict | None = None) -> bytes:
    err = {
        "message": message,
        "type": error_type or OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
        "param": param,
        "code": code,
    }
    if extra:
        err.update(extra)
    return orjson.dumps({"error": err})
