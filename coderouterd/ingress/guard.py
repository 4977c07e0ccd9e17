"""The last line of the edge: an exception no handler expected still gets an answer in the caller's API shape
(500 api_error), and one log line that names where it happened but carries no request values.

Exception messages are left out on purpose: `float("hot")` puts the client's string in the message, and a
traceback's messages would do the same. File, line and function are enough to find the bug."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

import orjson

from ..ids import new_id
from .errors import anthropic_error_body, openai_error_body
from .gemini import error_body as gemini_error_body
from .gemini import is_gemini_call

if TYPE_CHECKING:
    from .asgi import Receive, Scope, Send

# Frames named in the log line, innermost last.
_FRAMES = 6


class ClientLeft(Exception):
    """The client disconnected before its request was read: nothing to answer, nothing to log."""


class BodyTooLarge(Exception):
    pass


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole ASGI request body, or BodyTooLarge past `limit` bytes, or ClientLeft (the proxy and the
    dashboard's login form both read with this)."""
    chunks = []
    size = 0
    more = True
    while more:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientLeft
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        more = msg.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def describe_exception(e: BaseException) -> str:
    """`ValueError at translate/x.py:12 in f <- ingress/dispatch.py:40 in g ...` without the exception's message."""
    frames = traceback.extract_tb(e.__traceback__)[-_FRAMES:]
    where = " <- ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))
    return f"internal {type(e).__name__}" + (f" at {where}" if where else "") + " (values omitted)"


def _short(filename: str) -> str:
    i = filename.rfind("coderouterd/")
    return filename[i:] if i >= 0 else filename.rsplit("/", 1)[-1]


def caller_ingress(path: str) -> str:
    """Whose error shape a path's caller expects: OpenAI for the OpenAI-style routes, Anthropic otherwise."""
    return "openai" if path.startswith(("/v1/chat/", "/v1/responses", "/v1/completions")) else "anthropic"


def error_body(path: str, status: int, message: str, error_type: str) -> bytes:
    if is_gemini_call(path):  # Google's shape (ingress/gemini.py)
        return orjson.dumps(gemini_error_body(status, message))
    if caller_ingress(path) == "openai":
        return openai_error_body(status, message, error_type=error_type)
    return anthropic_error_body(status, message, error_type=error_type, request_id=new_id("req"))


async def answer_internal_error(scope: Scope, send: Send, response_started: bool) -> None:
    if response_started:
        return  # too late for a status: the server closes the connection, which the client sees as an error
    body = error_body(scope.get("path", ""), 500, "internal error in coderouterd", "api_error")
    try:
        await send({"type": "http.response.start", "status": 500,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    except Exception:  # the client is gone; nothing else to do
        pass
