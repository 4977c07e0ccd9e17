"""One attempt against one upstream: open the request, then read the answer as client-wire bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
import orjson

from ..allocator import released
from ..wire.sse import EventTooLarge, SSEParser
from .errors import (
    BAD_RESPONSE,
    CONNECT,
    DISCONNECT,
    FIRST_BYTE_TIMEOUT,
    TOO_LARGE,
    TOTAL_TIMEOUT,
    UNBUILDABLE,
    UpstreamError,
    redirect_error,
)
from .limits import MAX_ANSWER_BYTES, MAX_ERROR_BODY_BYTES, BodyTooLarge, read_at_most, read_capped
from .provider import Provider

if TYPE_CHECKING:
    from .pool import Pool
    from .strategy import Strategy

_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
                   ConnectionError, OSError)


class Call:
    def __init__(self, provider: Provider, strategy: Strategy, *, raw_body: bytes, stream: bool,
                 client_headers: dict[str, str], clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` measures the time to the first byte only (tests inject one); deadlines stay on the monotonic
        clock the event loop's timeouts are set from."""
        self.provider = provider
        self.strategy = strategy
        self.stream = stream
        self.raw_body = raw_body
        self.client_headers = client_headers
        self.resp: aiohttp.ClientResponse | None = None
        self.parser = SSEParser()
        self.started = time.monotonic()
        t = provider.cfg.timeouts
        self.total_deadline = self.started + t.total
        self.first_byte_deadline = self.started + t.first_byte
        # Time to the first byte: to the first event that carries content (text, a tool call, reasoning), not to a
        # keep-alive comment (llama-server sends `:` every 30 s while it reads a long prompt: a TTFB of 30.0 s for a
        # first token at 65 s falsified the journal, the dashboard's speed and adaptive routing; issue 43). A
        # stream that never carries content counts from its first event.
        self.ttfb: float | None = None
        self._clock = clock
        self._t0 = clock()
        self._first_event: float | None = None
        self.request_chars = 0
        self.wait_s = 0.0  # time spent awaiting the upstream: the rest of a request's latency is ours
        # Top-level fields added to this attempt's upstream body (prefix affinity: id_slot, cache_prompt).
        self.extra_fields: dict = {}
        self.placement: object | None = None  # affinity.service.Placement when prefix affinity placed this attempt
        self._pool: Pool | None = None  # the pool leased from open() to close(): a reload-retired pool outlives us, no more

    def _url_and_headers(self) -> tuple[str, dict[str, str]]:
        p = self.provider
        headers = p.adapter.headers(client=self.client_headers, forward_client_key=p.cfg.forward_client_key,
                                    json=True, stream=self.stream)
        return p.adapter.api_base + self.strategy.url_path(self.stream), headers

    async def open(self) -> None:
        """Send the request and wait for the status line. Raises UpstreamError on any failure."""
        url, headers = self._url_and_headers()
        try:
            body = self.strategy.request(self.raw_body, self.stream)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            # A body our translation cannot build: the request's doing (or ours), never the provider's.
            raise UpstreamError(UNBUILDABLE, status=400, message=f"request cannot be translated for "
                                f"{self.provider.name}: {type(e).__name__}: {e}"[:300]) from None
        if self.extra_fields:
            body = merge_fields(body, self.extra_fields)
        if self._pool is None:
            self._pool = self.provider.pool
            self._pool.acquire()
        self.request_chars = len(body)
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout_at(self._loop_deadline(min(self.first_byte_deadline, self.total_deadline))):
                self.resp = await self.provider.session().post(url, data=body, headers=headers)
                if 300 <= self.resp.status < 400:
                    location = self.resp.headers.get("location")
                    self.resp.close()  # its body is not wanted: the connection goes, not back to the pool
                    raise redirect_error(self.resp.status, location)
                if self.resp.status >= 400:
                    # Read for its message only: an endless error body must not be read to its end.
                    err_body = await read_at_most(self.resp, MAX_ERROR_BODY_BYTES)
                    raise self.provider.adapter.classify_error(self.resp.status, err_body, self.resp.headers)
        except UpstreamError:
            raise
        except TimeoutError:
            self.close()
            raise UpstreamError(FIRST_BYTE_TIMEOUT, message=f"no response within {self.provider.cfg.timeouts.first_byte:g}s") from None
        except _CONNECT_ERRORS as e:
            self.close()
            raise UpstreamError(CONNECT, message=f"{type(e).__name__}: {e}") from None
        except aiohttp.ClientError as e:
            self.close()
            raise UpstreamError(DISCONNECT, message=f"{type(e).__name__}: {e}") from None
        finally:
            self.wait_s += time.perf_counter() - t0

    def _loop_deadline(self, monotonic_deadline: float) -> float:
        loop = asyncio.get_running_loop()
        return loop.time() + (monotonic_deadline - time.monotonic())

    async def result(self) -> bytes:
        """Non-streaming: the whole answer, translated to the client's wire."""
        assert self.resp is not None
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout_at(self._loop_deadline(self.total_deadline)):
                body = await read_capped(self.resp, MAX_ANSWER_BYTES)
        except BodyTooLarge as e:
            self.close()
            raise UpstreamError(TOO_LARGE, message=str(e)) from None
        except TimeoutError:
            self.close()
            raise UpstreamError(TOTAL_TIMEOUT, message="upstream did not finish in time") from None
        except aiohttp.ClientError as e:
            self.close()
            raise UpstreamError(DISCONNECT, message=f"{type(e).__name__}: {e}") from None
        finally:
            self.wait_s += time.perf_counter() - t0
        self.ttfb = self._clock() - self._t0
        try:
            return self.strategy.response(body)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UpstreamError(BAD_RESPONSE, message=f"unreadable upstream response: {e}") from None

    async def read(self, timeout: float) -> bytes | None:
        """Streaming: the next client-wire bytes (b"" when an upstream event produced nothing to send), None at
        the clean end. Raises TimeoutError when the upstream sent nothing for `timeout` seconds."""
        st = self.strategy
        if st.held:
            return st.next_held()
        if st.done:
            await self.drain()
            return None
        assert self.resp is not None
        content = self.resp.content
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                chunk = await content.readany()
        except aiohttp.ClientError as e:
            raise UpstreamError(DISCONNECT, message=f"{type(e).__name__}: {e}",
                                after_content=st.started_content) from None
        finally:
            self.wait_s += time.perf_counter() - t0
        if not chunk:
            if self.ttfb is None:
                self.ttfb = self._first_event
            out = st.eof()  # raises unless the answer is complete
            # The end of the body is final. A finished body answers readany() at once, for ever, without yielding
            # to the event loop: a strategy left not `done` here would be read again in a loop that freezes the
            # daemon (issue 23). Whatever eof() returned is the last of the stream.
            st.done = not st.held  # held output (the strategy's) is handed out first; its last sets done
            return out
        try:
            events = self.parser.feed(chunk)  # SSE comments are no events: a keep-alive yields none
            if self.ttfb is None and events:
                return self._timed(st, events)
            return st.events(events)
        except UpstreamError:
            raise
        except EventTooLarge as e:
            too_large = str(e)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UpstreamError(BAD_RESPONSE, message=f"unreadable upstream event: {e}",
                                after_content=st.started_content) from None
        # Raised here, outside the handler: an error raised inside it would carry the parser's exception, and with
        # it the frames that held up to a line's or an event's bound, for as long as the error is kept.
        released(self.parser.max_line)  # up to that bound was held: trim it away soon
        raise UpstreamError(TOO_LARGE, message=f"upstream sent {too_large}", after_content=st.started_content)

    def _timed(self, st: Strategy, events: list[tuple[str | None, str]]) -> bytes:
        """st.events(events) while no content has come: the first event, and the first carrying content, are timed
        as they arrive (the strategy says when content has started)."""
        now = self._clock() - self._t0
        if self._first_event is None:
            self._first_event = now
        out = st.events(events)
        if st.started_content:
            self.ttfb = now
        elif st.done:
            self.ttfb = self._first_event
        return out

    async def drain(self) -> None:
        """After the stream's last event: read the (usually already buffered) end of the HTTP body so the
        connection goes back to the pool instead of being closed; a new connection per stream cost ~1 ms."""
        r = self.resp
        if r is None or r.closed:
            return
        content = r.content
        try:
            async with asyncio.timeout(1.0):
                while not content.at_eof():
                    if not await content.readany():
                        break
        except (TimeoutError, aiohttp.ClientError):
            r.close()
            return
        r.release()

    def close(self) -> None:
        """Drop the upstream connection now (a race loser, a client that went away): the upstream sees it."""
        r = self.resp
        if r is not None and not r.closed:
            r.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release()


# Affinity hands its per-attempt fields (id_slot, cache_prompt) through Call.extra_fields; merging them is
# part of building the upstream body, so it lives here, below affinity/.
def merge_fields(body: bytes, fields: dict) -> bytes:
    """Add top-level keys to a serialised JSON object without parsing it again (bodies run to megabytes)."""
    if not fields:
        return body
    end = body.rstrip()
    if not end.endswith(b"}"):
        return body
    head = end[:-1].rstrip()
    extra = orjson.dumps(fields)[1:]
    return head + (extra if head.endswith(b"{") else b"," + extra)
