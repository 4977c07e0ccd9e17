"""Connection limits against the real daemon over loopback: oversized heads (431, memory flat), slow heads and
bodies (408 within the timeout), idle connections, the connection cap (503 while /healthz answers), and
close-delimited SSE for HTTP/1.0 clients."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, openai_at
from tests.support.daemon import running
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

LIMITS = {"max_header_kb": 16, "max_header_line_kb": 8, "header_timeout_s": 0.6, "body_timeout_s": 0.6,
          "keep_alive_s": 0.5, "max_connections": 20}
BODY = b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with FakeServer("openai", name="local") as local:
        cfg = daemon_config(server=LIMITS, providers={"local": openai_at(local.url)}, profiles={"default": ["local"]})
        with running(cfg, tmp_path_factory.mktemp("limits")) as d:
            d.upstream = local
            yield d


def _connect(d) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    return s


def _read_all(s: socket.socket, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


# The daemon's own timeouts here are 0.5-0.6 s; a connection it should close is waited for this long, 50x
# that, so only a daemon that never closes it fails (the test then says so), whatever the machine's load.
CLOSE_CEILING_S = 30.0


def _read_until_closed(s: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection: the event these tests check (a timeout
    fired), never how soon. Fails if the daemon kept the connection open past the ceiling."""
    s.settimeout(CLOSE_CEILING_S)
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return out
        except TimeoutError:
            raise AssertionError(f"the daemon kept the connection open {CLOSE_CEILING_S:.0f} s; got {out[:200]!r}") from None
        if not chunk:
            return out
        out += chunk


def _rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _healthy(d) -> bool:
    return httpx.get(d.url + "/healthz", timeout=5).status_code == 200


def test_oversized_header_line_and_total_get_431(env):
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\nx-big: " + b"a" * 9000 + b"\r\n\r\n")
    resp = _read_all(s)
    assert resp.startswith(b"HTTP/1.1 431"), resp[:200]
    assert b'"type":"error"' in resp and b"header line exceeds 8 KB" in resp
    s.close()
    s = _connect(env)
    many = b"".join(b"x-h%d: %s\r\n" % (i, b"b" * 1000) for i in range(20))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n" + many + b"\r\n")
    resp = _read_all(s)
    assert resp.startswith(b"HTTP/1.1 431") and b"headers exceed 16 KB" in resp, resp[:200]
    assert b'"error":{' in resp  # OpenAI shape for an OpenAI path
    s.close()
    assert _healthy(env)


def test_unterminated_headers_keep_memory_flat(env):
    pid = env.proc.pid
    before = _rss_kb(pid)
    socks = []
    for _ in range(10):
        s = _connect(env)
        s.sendall(b"GET / HTTP/1.1\r\nx-flood: ")
        socks.append(s)
    chunk = b"z" * 65536
    sent = 0
    for s in socks:
        try:
            for _ in range(80):  # 5 MB each, no newline: the daemon must stop reading long before
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    for s in socks:
        s.close()
    after = _rss_kb(pid)
    assert after - before < 20_000, (before, after)  # 10 x 5 MB offered; a few MB of slack at most
    assert _healthy(env)


def test_slowloris_head_is_closed_within_the_header_timeout(env):
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\n")
    resp = _read_until_closed(s)  # a 408 is what the header timeout sends: it fired, then closed
    assert resp.startswith(b"HTTP/1.1 408") and b"timeout_error" in resp, resp[:200]
    s.close()


def test_idle_connection_is_closed(env):
    s = _connect(env)
    assert _read_until_closed(s) == b""  # never sent a byte: closed without an answer
    s.close()


def test_body_shorter_than_content_length_gets_408(env):
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
              b"content-length: 500\r\n\r\n" + BODY)
    resp = _read_until_closed(s)
    assert resp.startswith(b"HTTP/1.1 408") and b"request body not received" in resp, resp[:200]
    s.close()
    assert _healthy(env)


def test_keep_alive_is_honoured_and_requests_work(env):
    with httpx.Client(base_url=env.url) as c:
        assert c.post("/v1/messages", content=BODY, headers=JSON).status_code == 200
        assert c.post("/v1/messages", content=BODY, headers=JSON).status_code == 200  # same connection
    s = _connect(env)
    s.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
    resp = _read_until_closed(s)  # answered, then closed once idle for keep_alive_s
    assert resp.startswith(b"HTTP/1.1 200"), resp[:200]
    s.close()


def test_connection_cap_answers_503_and_healthz_still_answers(env):
    # The cap is held by 20 requests in flight to an upstream that never answers (not by half-sent ones, which
    # the 0.6 s body timeout would end before a loaded machine got to the checks below).
    env.upstream.set_behaviour("hang")
    held = [_connect(env) for _ in range(20)]
    try:
        for s in held:
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))
        assert wait_for(lambda: env.upstream.active >= 20, timeout=30), env.upstream.active
        r = httpx.post(env.url + "/v1/messages", content=BODY, headers=JSON, timeout=5)
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        r = httpx.post(env.url + "/v1/chat/completions", content=b"{}", headers=JSON, timeout=5)
        assert r.status_code == 503 and "connection limit" in r.json()["error"]["message"]
        assert _healthy(env)
    finally:
        for s in held:
            s.close()
        env.upstream.set_behaviour("ok")
    assert wait_for(lambda: httpx.post(env.url + "/v1/messages", content=BODY, headers=JSON, timeout=5).status_code == 200)
    assert "connection limit reached" in env.log()


def test_http10_stream_is_close_delimited(env):
    body = b'{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
              % (len(body), body))
    resp = _read_all(s, timeout=10)
    head, _, payload = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
    assert payload.startswith(b"event: message_start") and b"event: message_stop" in payload
    s.close()


def test_fd_limit_is_logged(env):
    assert "open files limit:" in env.log()


def test_chunked_trailers_count_against_the_header_limit(env):
    """Trailers come after the body, where httptools joins their pieces by concatenation: beyond the header
    limit (16 KB here) in total, 431 at once, whatever the pieces; and the daemon stays responsive."""
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
              b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nx-trailer: " % (len(BODY), BODY))
    try:
        for _ in range(40):  # 40 KB of one trailer line, in 1 KB pieces
            s.sendall(b"a" * 1024)
            time.sleep(0.002)
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = _read_until_closed(s)  # the 431 comes from the limit, not from a timeout (that would be a 408)
    assert resp.startswith(b"HTTP/1.1 431") and b"trailers exceed 16 KB" in resp, resp[:200]
    s.close()
    # small trailers are fine, and never become request headers
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
              b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nx-coderouter-profile: nope\r\n\r\n"
              % (len(BODY), BODY))
    assert _read_all(s, timeout=5).startswith(b"HTTP/1.1 200")
    s.close()
    assert _healthy(env)


GUARDED = """
[server]
port = {PORT}
api_keys = ["sekrit"]
header_timeout_s = 10
body_timeout_s = 0.6
max_connections = 20

[providers.local]
kind = "openai"
base_url = "@LOCAL@/v1"

[profiles.default]
providers = ["local"]
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    with FakeServer("openai", name="local") as local:
        with running(GUARDED.replace("@LOCAL@", local.url), tmp_path_factory.mktemp("guarded")) as d:
            yield d


def test_the_body_timeout_holds_after_an_early_401(guarded):
    """Without a key the answer is 401 before the body is read; a client that keeps sending its (huge) body
    afterwards is closed by the body timeout, not kept for as long as it trickles."""
    s = _connect(guarded)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
              b"content-length: 100000000\r\n\r\n{")
    # It trickles for as long as it is let: only the body timeout (0.6 s) can close it. The ceiling, 50x that,
    # only turns a connection kept open into a failure.
    deadline = time.monotonic() + CLOSE_CEILING_S
    got = b""
    closed = False
    s.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            s.sendall(b" " * 1024)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        try:
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            got += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
            break
    s.close()
    assert got.startswith(b"HTTP/1.1 401"), got[:200]
    assert closed, "the client trickled its body for the whole ceiling and was never closed"


def test_idle_sockets_far_beyond_the_cap_keep_neither_healthz_nor_requests_out(guarded):
    """20 connections allowed; 600 sockets that never send a byte, and a client that keeps opening more (which
    used to refill the small reserve kept for /healthz as fast as its 1 s head timeout emptied it), held
    /healthz and every request out, reset (issue 34). At the cap a new connection now takes the place of the
    oldest one still waiting for a request head: /healthz and requests get in, and no answer is a 503."""
    held = [_connect(guarded) for _ in range(600)]
    stop = threading.Event()
    opened = [0]

    def reconnect() -> None:
        mine: list[socket.socket] = []
        while not stop.is_set():
            try:
                mine.append(socket.create_connection(("127.0.0.1", guarded.port), timeout=5))
            except OSError:
                pass
            opened[0] += 1
            if len(mine) >= 50:  # the client's own descriptors stay bounded
                mine.pop(0).close()
            stop.wait(0.002)
        for s in mine:
            s.close()

    t = threading.Thread(target=reconnect, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: opened[0] >= 50, timeout=30)
        for _ in range(5):
            assert httpx.get(guarded.url + "/healthz", timeout=10).status_code == 200
        for _ in range(3):
            r = httpx.post(guarded.url + "/v1/messages", content=BODY, headers={**JSON, "x-api-key": "sekrit"}, timeout=10)
            assert r.status_code == 200, r.text
    finally:
        stop.set()
        t.join(30)
        for s in held:
            s.close()
    assert "idle connections closed to let new ones in" in guarded.log()


@pytest.mark.parametrize("header", [b"x-api-key: sekrit ", b"x-api-key: sekrit\t", b"authorization: Bearer sekrit "])
def test_a_key_with_trailing_whitespace_is_accepted_by_either_header(guarded, header):
    """Issue 23 item 15: the same key with trailing whitespace was accepted as a Bearer token and refused as
    x-api-key; both headers are now treated alike."""
    s = _connect(guarded)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n%s\r\n"
              b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (header, len(BODY), BODY))
    answer = _read_all(s, timeout=5)
    s.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


@pytest.mark.parametrize("raw,shape", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nnot hex\r\n",
     b'"error":{'),  # a chunk size that is not hex, on an OpenAI path: OpenAI's shape
    (b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-length: 5\r\ncontent-length: 9\r\n\r\nhello",
     b'"type":"error"'),  # two lengths: Anthropic's shape on its path
    (b"GARBAGE\x00\x01 / HTTP/1.1\r\n\r\n", b'"type":"error"'),  # not even a request line
])
def test_http_framing_errors_are_a_400_in_the_callers_json_shape(env, raw, shape):
    s = _connect(env)
    s.sendall(raw)
    resp = _read_all(s)
    s.close()
    assert resp.startswith(b"HTTP/1.1 400"), resp[:200]
    assert b"content-type: application/json" in resp.lower() and shape in resp, resp[:400]
    assert _healthy(env)


# -- a client that half-closes after its request (issue 23, item 15) ------------------------------------------
# A FIN looks the same whether the client shut down only its sending side or closed the socket, so EOF means the
# client left (as nginx and uvicorn read it): the upstream call is cancelled at once, never left running (and
# billing) for an answer nobody can receive. Clients that must half-close can send `Connection: close` instead.

def _in_flight(d) -> float:
    return total(scrape(d, timeout=5), "coderouter_requests_in_flight")


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_half_closes_is_gone_and_its_upstream_call_is_cancelled_at_once(env, stream):
    body = BODY[:-1] + b',"stream":true}' if stream else BODY
    # The upstream never answers: the request can end only by the client's leaving being noticed, so waiting
    # for it to end proves the cancel without timing it.
    env.upstream.set_behaviour("hang")
    try:
        before = env.upstream.disconnects
        s = _connect(env)
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n" % len(body) + body)
        # The upstream call is under way (and it is the only one: earlier tests' calls have ended).
        assert wait_for(lambda: env.upstream.active == 1 and _in_flight(env) == 1, 30)
        _half_close_and_expect_cancel(env, s)
        assert wait_for(lambda: env.upstream.disconnects > before, 30)  # the upstream call was dropped
    finally:
        env.upstream.set_behaviour("ok")


def _half_close_and_expect_cancel(env, s) -> None:
    s.shutdown(socket.SHUT_WR)
    assert wait_for(lambda: _in_flight(env) == 0, CLOSE_CEILING_S), "the request was still waiting on its upstream"
    assert _read_until_closed(s) == b""  # closed, nothing half-written
    s.close()
    assert _healthy(env)


def test_eof_inside_a_request_body_closes_without_an_answer(env):
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
              b"content-length: %d\r\n\r\n" % (len(BODY) + 50) + BODY)
    s.shutdown(socket.SHUT_WR)  # the rest of the body can never come
    resp = _read_until_closed(s)
    assert resp == b"" or resp.startswith(b"HTTP/1.1 4"), resp[:200]
    s.close()
    assert _healthy(env)
