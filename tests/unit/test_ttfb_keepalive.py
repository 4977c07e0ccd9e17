"""Time to first byte is the time to the first event that carries content (issue 43). llama-server sends an SSE
comment (`:`) every 30 s while it reads a long prompt; counting the first of them as the first byte put a TTFB of
30.0 s in the journal for a first token at about 65 s. A fake upstream over loopback sends comments, then the answer,
each only when the test lets it; the clock is injected, and advanced by the test between the two."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from coderouterd.config import parse_config_text
from coderouterd.providers.call import Call
from coderouterd.providers.provider import Provider
from coderouterd.providers.strategies import OpenAIPassthrough

CFG = """
[providers.p]
kind = "openai"
base_url = "http://127.0.0.1:%d/v1"
[profiles.default]
providers = ["p"]
"""


def chunk(delta: dict, finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}) + b"\n\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SteppedUpstream:
    """Streams one answer in parts: each part is written only once the test puts it on `parts`."""

    def __init__(self) -> None:
        self.parts: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        while (part := await self.parts.get()) is not None:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()


async def _stream(parts_at: list[tuple[float, bytes]]) -> tuple[float | None, list[float | None]]:
    """Each part is sent at its clock time and read by the call; returns the call's ttfb and what it said after
    each read."""
    up = SteppedUpstream()
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    provider = Provider("p", parse_config_text(CFG % port, "t").providers["p"])
    clock = Clock()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "a long prompt"}]}
    call = Call(provider, OpenAIPassthrough(model="m", skip_prologue=False, client_body=body),
                raw_body=orjson.dumps(body), stream=True, client_headers={}, clock=clock)
    seen: list[float | None] = []
    try:
        await call.open()
        for at, part in parts_at:
            clock.now = 1000.0 + at
            up.parts.put_nowait(part)
            await call.read(30)  # one part per read: each was written alone, after the previous was read
            seen.append(call.ttfb)
        up.parts.put_nowait(None)
        while await call.read(30) is not None:
            pass
        return call.ttfb, seen
    finally:
        call.close()
        await provider.close()
        server.close()
        await server.wait_closed()


def test_keep_alive_comments_are_not_the_first_byte():
    ttfb, seen = asyncio.run(_stream([
        (30.0, b": keep-alive\n\n"),
        (60.0, b":\n\n"),
        (65.0, chunk({"role": "assistant", "content": "Hel"})),
        (66.0, chunk({"content": "lo"}, finish="stop") + b"data: [DONE]\n\n"),
    ]))
    assert seen == [None, None, 65.0, 65.0]
    assert ttfb == 65.0


def test_a_role_only_opening_is_not_content_either():
    """OpenAI-style servers may open with a role-only delta before the first token: that is not the first byte."""
    ttfb, seen = asyncio.run(_stream([
        (0.5, chunk({"role": "assistant"})),
        (12.0, chunk({"reasoning_content": "hmm"})),
        (20.0, chunk({"content": "ok"}, finish="stop") + b"data: [DONE]\n\n"),
    ]))
    assert seen == [None, 12.0, 12.0] and ttfb == 12.0  # reasoning is content: the model is producing


@pytest.mark.parametrize("end", [b"data: [DONE]\n\n", b""])
def test_a_stream_without_content_counts_from_its_first_event(end):
    """An empty answer (only a finish) still gets a TTFB: its first event, not a comment before it."""
    parts = [(5.0, b": ping\n\n"), (9.0, chunk({"role": "assistant"}, finish="stop") + end)]
    ttfb, _ = asyncio.run(_stream(parts))
    assert ttfb == 9.0
