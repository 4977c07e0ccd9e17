"""How much an upstream may send us, and reading a body within that (issue 23: a 200 MB answer, an endless error
body or a gzip bomb must not become our memory). Sizes are after decompression: aiohttp inflates a chunk at a
time as we read, so stopping the read stops the inflating too.

Not configurable (SPEC names no such keys): the bounds sit far above any real answer and far below harm."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..allocator import released

if TYPE_CHECKING:
    import aiohttp

KB = 1024
MB = 1024 * KB

# A whole non-streaming answer. 128k output tokens of text are ~0.5 MB and a generated image a few MB; the bound
# is also what a hostile answer can make us hold for a moment (the soak's RSS moved by tens of MB per 64 MB).
MAX_ANSWER_BYTES = 16 * MB
MAX_SSE_LINE_BYTES = 4 * MB  # one line of an event stream still without its end
MAX_SSE_EVENT_BYTES = 4 * MB  # the data of one event (its data: lines together)
MAX_ERROR_BODY_BYTES = 64 * KB  # what an error answer's body is read for: its message
MAX_AUX_BYTES = 16 * MB  # model lists, /props, /slots, token counts, model control
MAX_IGNORED_BYTES = 64 * KB  # a body read only to free the connection (probes, slot actions)


class BodyTooLarge(ValueError):
    def __init__(self, limit: int, what: str = "answer") -> None:
        super().__init__(f"upstream {what} larger than {size_text(limit)}")
        self.limit = limit


def size_text(n: int) -> str:
    return f"{n // MB} MB" if n >= MB else f"{n // KB} KB"


async def read_capped(resp: aiohttp.ClientResponse, limit: int, what: str = "answer") -> bytes:
    """The whole body, or BodyTooLarge as soon as it passes `limit` (the connection is then closed, not pooled)."""
    declared = resp.content_length
    if declared is not None and declared > limit:  # compressed or not, it can only grow
        resp.close()
        raise BodyTooLarge(limit, what)
    if declared is not None and "content-encoding" not in resp.headers:
        released(declared)  # a big one is trimmed away once the request lets go of it (allocator.py)
        return await resp.read()  # exactly `declared` bytes, within the limit: the common case, in one read
    content = resp.content
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            resp.close()
            # The exception's traceback keeps this frame, and the request keeps the exception (as the context of
            # its UpstreamError) until the cyclic GC runs: without this, each refused answer held its 16 MB for a
            # while (the soak saw +65 MB of RSS per gzip bomb, 2 GB after 30).
            parts.clear()
            released(size)
            raise BodyTooLarge(limit, what)
        parts.append(chunk)
    released(size)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The first `limit` bytes of the body. A longer body is cut there and its connection closed: enough to read
    an error's message or to free a probe, never the whole of an endless body."""
    content = resp.content
    parts: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await content.readany()
        if not chunk:
            resp.release()
            return b"".join(parts)
        parts.append(chunk)
        size += len(chunk)
    if not content.at_eof():
        resp.close()
    else:
        resp.release()
    return b"".join(parts)[:limit]
