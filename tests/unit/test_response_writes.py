"""The proxy's HTTP cycle: a sized response leaves in one write, a stream's head goes out at once, and the
app hears of a client that left through its callback."""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.flow_control import FlowControl

from coderouterd.ingress.protocol import _Cycle


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(method: str = "POST") -> tuple[_Cycle, Transport]:
    t = Transport()
    c = _Cycle(scope={"method": method, "type": "http"}, transport=t, flow=FlowControl(t),
               logger=logging.getLogger("t"), access_logger=logging.getLogger("t"), access_log=False,
               default_headers=[], message_event=asyncio.Event(), expect_100_continue=False, keep_alive=True,
               on_response=lambda: None)
    return c, t


def run(coro):
    return asyncio.run(coro)


def test_a_sized_response_is_one_write():
    async def go():
        c, t = cycle()
        await c.send({"type": "http.response.start", "status": 200,
                      "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
        assert t.writes == []  # the head waits for the body
        await c.send({"type": "http.response.body", "body": b"{}"})
        assert len(t.writes) == 1
        assert t.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and t.writes[0].endswith(b"\r\n\r\n{}")
        assert c.transport is t  # the real transport again for whatever follows
    run(go())


def test_a_sized_response_in_parts_sends_the_head_with_the_first_part():
    async def go():
        c, t = cycle()
        await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await c.send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await c.send({"type": "http.response.body", "body": b"cd"})
        assert len(t.writes) == 2 and t.writes[0].endswith(b"\r\n\r\nab") and t.writes[1] == b"cd"
    run(go())


def test_a_stream_head_leaves_with_its_first_event():
    async def go():
        c, t = cycle()
        await c.send({"type": "http.response.start", "status": 200,
                      "headers": [(b"content-type", b"text/event-stream")]})
        await c.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        assert len(t.writes) == 1 and b"transfer-encoding: chunked" in t.writes[0]
        assert t.writes[0].endswith(b"data: 1\n\n\r\n")
        await asyncio.sleep(0)
        assert len(t.writes) == 1  # nothing left to flush
    run(go())


def test_a_stream_head_without_an_event_leaves_on_the_next_turn():
    async def go():
        c, t = cycle()
        await c.send({"type": "http.response.start", "status": 200,
                      "headers": [(b"content-type", b"text/event-stream")]})
        assert t.writes == []
        await asyncio.sleep(0)
        assert len(t.writes) == 1 and t.writes[0].startswith(b"HTTP/1.1 200 OK")
    run(go())


def test_a_head_response_is_not_held():
    async def go():
        c, t = cycle("HEAD")
        await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        assert len(t.writes) == 1
    run(go())


def test_the_disconnect_callback_is_kept_until_called():
    c, _t = cycle()
    seen = []
    c.watch_disconnect(lambda: seen.append(1))
    assert c.on_disconnect is not None
    c.watch_disconnect(None)
    assert c.on_disconnect is None and seen == []

