"""The connector of a managed provider's pool: aiohttp's, with every resolution narrowed to the addresses its
server was verified to hold at READY (pinning.py says why and which).

The narrowing sits in `_resolve_host`, after aiohttp's DNS cache, rather than in a resolver: aiohttp asks no
resolver for an address literal (http://127.0.0.1:PORT), and a resolver's answer would be cached across a
restart of the server. So it holds for names and literals alike, and each new connection reads the current
verification from memory; `tests/unit/test_pinning.py` fails if aiohttp stops routing connections through it.
Imported with aiohttp, after start-up (pool.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from .pinning import Verified, pin

if TYPE_CHECKING:
    from aiohttp.abc import ResolveResult
    from aiohttp.tracing import Trace


class PinnedConnector(aiohttp.TCPConnector):
    def __init__(self, provider: str, verified: Callable[[], Verified | None], **kw: Any) -> None:
        super().__init__(**kw)
        self._provider = provider
        self._verified = verified

    async def _resolve_host(self, host: str, port: int,
                            traces: Sequence[Trace] | None = None) -> list[ResolveResult]:
        resolved = await super()._resolve_host(host, port, traces)
        kept = pin(host, port, [r["host"] for r in resolved], self._verified(), self._provider)
        return [r for r in resolved if r["host"] in kept]
