"""How the admin API refuses: every error is `{"error": "<one line>", ...fields that help}` with its status,
never FastAPI's `{"detail": ...}` nor its 422 list, because corectl shows `error` as the one line the user
reads. Also the API version header on every answer, errors included, and JSON as the default body type."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import apitype
from .context import AdminError
from .version import API_VERSION, API_VERSION_HEADER

__all__ = ["AdminError", "error_answer", "install"]

log = logging.getLogger("coderouterd.admin")


class JSONAnswer(Response):
    """A JSON answer serialised by orjson (which, unlike json.dumps, also takes a NaN in a snapshot)."""

    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content)


def error_answer(status: int, message: str, headers: Mapping[str, str] | None = None, **extra: Any) -> JSONAnswer:
    return JSONAnswer({"error": message, **extra}, status_code=status, headers=headers)


# Every route (api.py and ops.py): answers are validated against their model, and only the fields the handler set are sent.
ANSWER: dict[str, Any] = {"response_model_exclude_unset": True}
REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": apitype.ErrorAnswer} for code in (400, 404, 409, 422, 500, 502, 503)}


class AdminRoute(APIRoute):
    """A route whose unexpected exception becomes a 500 answer naming it, logged once with its traceback.

    Not an exception handler for Exception: Starlette runs those in its outermost middleware and re-raises
    afterwards, so uvicorn would log every such error a second time."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (AdminError, RequestValidationError, StarletteHTTPException):
                raise  # answered by the handlers below
            except Exception as e:  # a bug in one admin call must not take the socket down
                log.exception("admin request failed: %s %s", request.method, request.url.path)
                return error_answer(500, f"internal error in coderouterd: {type(e).__name__}: {e}")

        return guarded


# Field hints for messages, from the request models' descriptions: "name: field required (a profile name ...)".
_HINTS = {name: f.description for model in (apitype.UseProfileRequest, apitype.ProcessActionRequest,
                                             apitype.ModelControlRequest)
          for name, f in model.model_fields.items() if f.description}


def validation_message(errors: list[dict]) -> str:
    """One line for the caller from pydantic's errors, naming each field that is wrong."""
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ())]
        where, field = (loc[0] if loc else "body"), loc[1:]
        kind = err.get("type", "")
        if kind == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            parts.append(f"request body is not valid JSON{': ' + detail if detail else ''}")
        elif where == "body" and not field:
            parts.append("request body must be a JSON object")
        else:
            name = ".".join(field) or where
            msg = err.get("msg", "invalid")
            msg = msg[:1].lower() + msg[1:]
            hint = _HINTS.get(field[0]) if where == "body" and field else None
            if where == "query" and kind.startswith("int"):
                msg += f", got {err.get('input')!r}"
            parts.append(f"{name}: {msg}" + (f" ({hint})" if hint else ""))
    return "; ".join(dict.fromkeys(parts)) or "invalid request"


def _json_and_version(app: ASGIApp) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """Pure-ASGI middleware: the API version header on every answer (404/405 and errors included), so a client
    can refuse a daemon it would misread (see apitype.py); and a body sent without a content-type is read as
    JSON, the only thing this API speaks (FastAPI would otherwise not parse it)."""
    header = (API_VERSION_HEADER.encode(), str(API_VERSION).encode())

    async def admin_http(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if not any(k == b"content-type" for k, _ in scope["headers"]):
            scope = {**scope, "headers": [*scope["headers"], (b"content-type", b"application/json")]}

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await app(scope, receive, send_with_version)

    return admin_http


def install(app: FastAPI) -> None:
    """Error answers in the admin API's shape, and the version header on every answer."""

    @app.exception_handler(AdminError)
    async def admin_error(_request: Request, exc: AdminError) -> Response:
        return error_answer(exc.status, str(exc), **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> Response:
        # FastAPI would answer 422 with a list; a malformed admin request is the caller's mistake: 400, one line.
        return error_answer(400, validation_message(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        method, path = request.method, request.url.path
        if exc.status_code == 404:
            return error_answer(404, f"no such admin endpoint: {method} {path}")
        if exc.status_code == 405:
            return error_answer(405, f"method {method} not allowed on {path}", headers=exc.headers)
        return error_answer(exc.status_code, str(exc.detail), headers=exc.headers)

    app.add_middleware(_json_and_version)
