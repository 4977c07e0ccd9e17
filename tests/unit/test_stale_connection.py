"""A pooled upstream connection the server closed without saying so (llama-server closes every connection after a
streamed answer, with no `Connection: close`): the next request on it gets no response at all. It is sent once
more on a fresh connection, and nothing else is retried."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from coderouterd.config import parse_config_text
from coderouterd.providers.call import Call
from coderouterd.providers.errors import CONNECT, UpstreamError
from coderouterd.providers.provider import Provider
from coderouterd.providers.strategies import OpenAIPassthrough
from tests.support.ports import dead_port

CFG = """
[providers.p]
kind = "openai"
base_url = "http://127.0.0.1:%d/v1"
[profiles.default]
providers = ["p"]
"""

ANSWER = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


async def _read_request(reader: asyncio.StreamReader) -> bool:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    return True


class ClosingServer:
    """Answers the first request on each connection (keep-alive); a second request on the same connection is
    read and the connection closed without a response, as a server that had already hung up."""

    def __init__(self) -> None:
        self.connections = 0
        self.answered = 0

    async def handle(self, reader, writer) -> None:
        self.connections += 1
        try:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                         b"keep-alive: timeout=5, max=100\r\n\r\n%s" % (len(ANSWER), ANSWER))
            self.answered += 1
            await writer.drain()
            await _read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _call(provider: Provider) -> Call:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return Call(provider, OpenAIPassthrough(model="m", skip_prologue=False, client_body=body),
                raw_body=orjson.dumps(body), stream=False, client_headers={})


def test_a_pooled_connection_the_server_closed_is_replaced_once():
    async def go():
        srv = ClosingServer()
        server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        provider = Provider("p", parse_config_text(CFG % port, "t").providers["p"])
        try:
            results = []
            for _ in range(3):
                call = _call(provider)
                await call.open()
                answer = orjson.loads(await call.result())["choices"][0]["message"]["content"]
                results.append((answer, provider.session().stale_retries))
                call.close()
            # Any POST, not only generations: slot save/restore goes through the same session (aiohttp itself
            # retries an idempotent GET on a dead pooled connection, never a POST).
            for _ in range(2):
                async with provider.session().post(f"http://127.0.0.1:{port}/slots/0?action=save",
                                                   json={"filename": "a.bin"}) as r:
                    await r.read()
                    results.append((r.status, provider.session().stale_retries))
            return results, srv
        finally:
            await provider.close()
            server.close()
            await server.wait_closed()

    results, srv = asyncio.run(go())
    assert [r[0] for r in results] == ["hi", "hi", "hi", 200, 200]
    # Each request after the first found its pooled connection dead and was sent again, once.
    assert [r[1] for r in results] == [0, 1, 2, 3, 4]
    assert srv.answered == 5


def test_a_server_that_is_not_there_is_not_retried():
    async def go():
        provider = Provider("p", parse_config_text(CFG % dead_port(), "t").providers["p"])
        call = _call(provider)
        try:
            with pytest.raises(UpstreamError) as e:
                await call.open()
            return e.value, provider.session().stale_retries
        finally:
            call.close()
            await provider.close()

    err, retries = asyncio.run(go())
    assert err.reason == CONNECT and retries == 0
