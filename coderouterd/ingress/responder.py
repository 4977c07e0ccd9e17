"""Writing the answer to the client over ASGI, in the client's wire (Anthropic or OpenAI)."""

from __future__ import annotations

from ..protocol.sse import DONE, encode_data, encode_event
from .errors import anthropic_error_body, anthropic_error_event, openai_error_body

_JSON = (b"content-type", b"application/json")
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_ANTHROPIC_PING = encode_event({"type": "ping"})
_OPENAI_PING = b": ping\n\n"


class ClientGone(Exception):
    """The client closed its connection; nothing more can be sent."""


class Responder:
    def __init__(self, send, ingress: str, request_id: str) -> None:
        self._send = send
        self.ingress = ingress
        self.request_id = request_id
        self.headers_sent = False
        self.finished = False
        self.status = 0
        self.bytes_sent = 0
        self.extra_headers: list[tuple[bytes, bytes]] = []

    def add_header(self, name: str, value: str) -> None:
        self.extra_headers.append((name.encode(), value.encode("latin-1", "replace")))

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
        self.bytes_sent += len(data)
        if not more:
            self.finished = True
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": more})
        except OSError as e:
            raise ClientGone(str(e)) from None

    async def json(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await self._start(status, [_JSON, (b"content-length", str(len(body)).encode())] + (headers or []))
        await self._body(body, False)

    async def error(self, status: int, message: str, *, error_type: str | None = None, extra: dict | None = None,
                    headers: list[tuple[bytes, bytes]] | None = None, param: str | None = None) -> None:
        if self.ingress == "anthropic":
            body = anthropic_error_body(status, message, error_type=error_type, extra=extra,
                                        request_id=self.request_id)
        else:
            body = openai_error_body(status, message, error_type=error_type, extra=extra, param=param)
        await self.json(status, body, headers)

    async def start_stream(self) -> None:
        await self._start(200, list(_SSE))

    async def chunk(self, data: bytes) -> None:
        if data:
            await self._body(data, True)

    async def ping(self) -> None:
        await self._body(_ANTHROPIC_PING if self.ingress == "anthropic" else _OPENAI_PING, True)

    async def stream_error(self, error_type: str, message: str, *, code: str | None = None) -> None:
        """End a stream that can no longer be completed with a well-formed error, then close it cleanly."""
        if self.ingress == "anthropic":
            data = encode_event(anthropic_error_event(error_type, message))
        else:
            data = encode_data({"error": {"message": message, "type": error_type, "param": None, "code": code}}) + DONE
        await self._body(data, False)

    async def end(self) -> None:
        await self._body(b"", False)

    def prologue(self, model: str, message_id: str, input_tokens: int) -> bytes:
        """What an Anthropic client gets when we commit to a stream before any upstream event arrived."""
        if self.ingress != "anthropic":
            return b""
        start = {
            "type": "message_start",
            "message": {
                "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0},
            },
        }
        return encode_event(start) + _ANTHROPIC_PING
