"""The client sink: the only way routing talks to the client. Ingress implements it; routing never imports ingress.

Routing decides *what* the client gets (which provider, a stream or a whole body, an error and its kind);
the sink decides *how* it looks on the client's wire (Anthropic, OpenAI Chat, the Responses API, ...).

The contract, in the order a request uses it:

- `start_stream(headers, opening)` sends the 200 and the SSE headers. `opening` is given only when routing
  commits before any upstream event arrived (the stream hold expired): a sink whose wire needs an opening event
  (Anthropic's `message_start`) writes its own from it, and must then say so with `opens_stream_itself = True`
  so routing tells the upstream translation to drop the upstream's own opening. Sinks of wires with no
  opening event ignore it.
- `event(data)` writes bytes already in the client's wire (the upstream translation produced them).
- `ping()` keeps an idle stream alive, in the wire's own way.
- `error(status, message, kind=..., headers=..., extra=...)` ends the request with an error: before
  `start_stream` as an HTTP error in the caller's shape, after it as a well-formed in-band error and a clean end.
  `kind` is an error kind from `wire.errors` (None: derived from the status, in the wire's own vocabulary);
  `code` a machine code for wires that carry one (OpenAI's `error.code`, e.g. `context_length_exceeded`).
- `finish(body=None, headers=...)` ends the request successfully: with `body`, a whole non-streaming 200 answer;
  without, the end of the stream.

`headers` are the routing headers (`x-coderouter-provider`, `-profile`, `-attempts`) as a plain mapping;
they matter only where the status line is still to be written. Every method may raise `ClientGone` (or any
exception) when the client went away; routing treats `ClientGone` like a cancellation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class ClientGone(Exception):
    """The client closed its connection; nothing more can be sent. Raised by sinks, handled by routing like a
    cancellation (the attempt's resources are given back, nothing counts against the provider)."""


@dataclass(frozen=True, slots=True)
class StreamOpening:
    """What a sink needs to open a stream itself before the upstream said anything."""

    model: str
    message_id: str
    input_tokens: int


class ClientSink(Protocol):
    opens_stream_itself: bool

    @property
    def headers_sent(self) -> bool: ...

    @property
    def finished(self) -> bool: ...

    async def start_stream(self, headers: Mapping[str, str], opening: StreamOpening | None = None) -> None: ...

    async def event(self, data: bytes) -> None: ...

    async def ping(self) -> None: ...

    async def error(self, status: int, message: str, *, kind: str | None = None,
                    headers: Mapping[str, str] | None = None, extra: dict | None = None,
                    code: str | None = None) -> None: ...

    async def finish(self, body: bytes | None = None, headers: Mapping[str, str] | None = None) -> None: ...
