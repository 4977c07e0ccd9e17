"""Writing the answer to the client over ASGI, in the client's wire (Anthropic or OpenAI).

`Responder` is the `ClientSink` (routing/sink.py) of these two wires: routing decides, this writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..routing.sink import ClientGone, StreamOpening
from ..wire.anthropic import message_start
from ..wire.errors import error_kind
from ..wire.sse import DONE, encode_data, encode_event
from .errors import (
    anthropic_error_body,
    anthropic_error_event,
    openai_error_body,
    openai_type,
    status_of_kind,
    wire_status,
)

if TYPE_CHECKING:
    from .asgi import Send

_JSON = (b"content-type", b"application/json")
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_ANTHROPIC_PING = encode_event({"type": "ping"})
_OPENAI_PING = b": ping\n\n"


__all__ = ["ClientGone", "Responder"]


class Responder:
    def __init__(self, send: Send, ingress: str, request_id: str) -> None:
        self._send = send
        self.ingress = ingress
        # An Anthropic stream opens with message_start, a Responses stream with response.created: when routing
        # commits early we write our own. Chat streams have no opening event.
        self.opens_stream_itself = ingress != "openai"
        self.request_id = request_id
        self.headers_sent = False
        self.finished = False
        self.status = 0
        self.extra_headers: list[tuple[bytes, bytes]] = []

    def add_header(self, name: str, value: str) -> None:
        self.extra_headers.append((name.encode(), value.encode("latin-1", "replace")))

    def _add_headers(self, headers: Mapping[str, str] | None) -> None:
        if not headers:
            return
        # dict first: routing sends plain dicts on every request, and an ABC isinstance check is not free.
        items = headers.items() if isinstance(headers, dict | Mapping) else headers
        for k, v in items:
            if isinstance(k, bytes):
                self.extra_headers.append((k, v))
            else:
                self.add_header(k, v)

    async def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers_sent = True
        rid = self.request_id.encode()
        hs = headers + self.extra_headers + [(b"x-request-id", rid)]
        if self.ingress == "anthropic":
            hs.append((b"request-id", rid))
        try:
            await self._send({"type": "http.response.start", "status": status, "headers": hs})
        except OSError as e:
            raise ClientGone(str(e)) from None

    async def _body(self, data: bytes, more: bool) -> None:
        if not more:
            self.finished = True
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": more})
        except OSError as e:
            raise ClientGone(str(e)) from None

    async def json(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await self._start(status, [_JSON, (b"content-length", str(len(body)).encode())] + (headers or []))
        await self._body(body, False)

    async def error(self, status: int, message: str, *, kind: str | None = None, error_type: str | None = None,
                    extra: dict | None = None, headers: Mapping[str, str] | None = None, param: str | None = None,
                    code: str | None = None) -> None:
        """An error in the caller's shape and vocabulary (ingress/errors.py): an HTTP error before the stream
        started, an in-band one after."""
        kind = kind or error_type
        if self.headers_sent:
            if not self.finished:
                await self.stream_error(kind or error_kind(status), message, code=code, status=status)
            return
        self._add_headers(headers)
        status = wire_status(self.ingress, status)
        if self.ingress == "anthropic":
            body = anthropic_error_body(status, message, error_type=kind, extra=extra,
                                        request_id=self.request_id)
        else:
            body = openai_error_body(status, message, error_type=kind, extra=extra, param=param, code=code)
        await self.json(status, body)

    async def start_stream(self, headers: Mapping[str, str] | None = None,
                           opening: StreamOpening | None = None) -> None:
        self._add_headers(headers)
        await self._start(200, list(_SSE))
        if opening is not None and self.opens_stream_itself:
            await self.event(self.prologue(opening.model, opening.message_id, opening.input_tokens))

    async def event(self, data: bytes) -> None:
        if data:
            await self._body(data, True)

    async def finish(self, body: bytes | None = None, headers: Mapping[str, str] | None = None) -> None:
        if body is None:
            await self.end()
            return
        self._add_headers(headers)
        await self.json(200, body)

    async def ping(self) -> None:
        await self._body(_ANTHROPIC_PING if self.ingress == "anthropic" else _OPENAI_PING, True)

    async def stream_error(self, error_type: str, message: str, *, code: str | None = None,
                           status: int | None = None) -> None:
        """End a stream that can no longer be completed with a well-formed error, then close it cleanly. The error
        is in the caller's vocabulary: routing's kind (Anthropic's names) is translated for an OpenAI client."""
        status = status or status_of_kind(error_type)
        if self.ingress == "anthropic":
            data = encode_event(anthropic_error_event(error_type, message, status))
        else:
            etype, ecode = openai_type(status, error_type, code)
            data = encode_data({"error": {"message": message, "type": etype, "param": None, "code": ecode}}) + DONE
        await self._body(data, False)

    async def end(self) -> None:
        await self._body(b"", False)

    def prologue(self, model: str, message_id: str, input_tokens: int) -> bytes:
        """What an Anthropic client gets when we commit to a stream before any upstream event arrived."""
        if self.ingress != "anthropic":
            return b""
        start = message_start(message_id, model, input_tokens)
        return encode_event(start) + _ANTHROPIC_PING
