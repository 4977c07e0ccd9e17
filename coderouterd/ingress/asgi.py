"""The ASGI shapes the edge is written against: a scope, an event, and the receive, send and app callables.

A scope and an event are dicts whose value types depend on the key and on the event's "type"; the spec's
TypedDicts (one per event type) would have every handler narrow each message at run time, on the hot path, so
values are Any here, as in Starlette. ingress/protocol.py, which subclasses uvicorn's protocol, uses uvicorn's
own TypedDicts where it overrides uvicorn's methods."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
