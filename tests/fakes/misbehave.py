"""Wire-neutral hostile answers: what any upstream, whatever its kind, can send instead of an answer (issue 23).

Each is a behaviour (see behaviour.py) that every fake serves on its generation endpoints:

- ``redirect;status=307;to=URL``: a redirect (307/308 keep the method and body) to another origin;
- ``big_json;mb=N``: a well-formed JSON object of N MB, sent in 1 MB writes;
- ``endless_error;status=500``: an error status with a body that never ends (on every endpoint, probes too);
- ``sse_no_newline``: a 200 event stream that is one line that never ends;
- ``sse_no_blank``: a 200 event stream of ``data:`` lines with no blank line, so no event ever ends;
- ``gzip_bomb;mb=N``: a 200 JSON answer, gzip-encoded, that inflates to N MB of NUL bytes;
- ``raw;status=200;ctype=TYPE;hex=HEX``: exactly these bytes (the property tests' garbage).

Endless bodies stop when the reader leaves, or after ``mb`` MB (default ``ENDLESS_CAP``) so a fake never runs for
ever.
"""

from __future__ import annotations

import asyncio
import zlib
from functools import lru_cache
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:  # behaviour.py imports this module
    from .behaviour import Call

MISBEHAVIOURS = frozenset({"redirect", "big_json", "endless_error", "sse_no_newline", "sse_no_blank",
                           "gzip_bomb", "raw"})
MB = 1024 * 1024
ENDLESS_CAP = 1024 * MB


@lru_cache(maxsize=4)
def _gzip_zeros(mb: int) -> bytes:
    """N MB of NUL bytes, gzipped a megabyte at a time (about 1 KB per MB; never N MB in memory here)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    zeros = bytes(MB)
    return b"".join(z.compress(zeros) for _ in range(mb)) + z.flush()


async def _endless(call: Call, status: int, ctype: str, piece: bytes, *, head: bytes = b"") -> web.StreamResponse:
    resp = web.StreamResponse(status=status, headers={"content-type": ctype})
    await resp.prepare(call.request)
    sent = 0
    cap = call.behaviour.integer("mb", 0) * MB or ENDLESS_CAP
    try:
        if head:
            await resp.write(head)
        while sent < cap:
            await resp.write(piece)  # waits while the reader does not read: no more than the socket buffers
            sent += len(piece)
            if call.state is not None:
                call.state.endless_sent += len(piece)
            await asyncio.sleep(0)
    except (ConnectionError, RuntimeError):  # the reader left: what a bound is for
        call.close_connection()
    return resp


async def misbehave(call: Call) -> web.StreamResponse:
    b = call.behaviour
    name = b.name
    if name == "redirect":
        status = b.integer("status", 307)
        return web.Response(status=status, headers={"location": b.get("to", "http://127.0.0.1:9/")},
                            text="moved")
    if name == "big_json":
        total = b.integer("mb", 80) * MB
        resp = web.StreamResponse(status=200, headers={"content-type": "application/json"})
        await resp.prepare(call.request)
        try:
            await resp.write(b'{"id":"big","pad":"')
            for _ in range(total // MB):
                await resp.write(b"x" * MB)
            await resp.write(b'"}')
        except (ConnectionError, RuntimeError):
            call.close_connection()
        return resp
    if name == "endless_error":
        return await _endless(call, b.integer("status", 500), "application/json", b"e" * MB,
                              head=b'{"error": {"message": "')
    if name == "sse_no_newline":
        return await _endless(call, 200, "text/event-stream", b"x" * MB, head=b"data: ")
    if name == "sse_no_blank":
        return await _endless(call, 200, "text/event-stream", b"data: " + b"x" * (MB - 7) + b"\n")
    if name == "gzip_bomb":
        return web.Response(status=200, body=_gzip_zeros(b.integer("mb", 200)),
                            headers={"content-type": "application/json", "content-encoding": "gzip"})
    if name == "raw":
        return web.Response(status=b.integer("status", 200), body=bytes.fromhex(b.get("hex", "")),
                            headers={"content-type": b.get("ctype", "application/json")})
    raise ValueError(f"not a misbehaviour: {name}")
