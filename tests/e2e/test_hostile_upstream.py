"""Upstreams that misbehave, against the real daemon (issue 23, items 1-4): a stream that ends mid-block, a
redirect to another origin, answers without bound, garbage passed off as a success. Whatever an upstream does,
the client gets a failover or a well-formed error in its API shape, at once, and the daemon keeps serving."""

from __future__ import annotations

import threading

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.test_control_plane import corectl
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import DaemonProcess, running
from tests.support.sse import event_names, streamed_text
from tests.support.wait import wait_for


def config(an_url: str, an2_url: str, oa_url: str, oa2_url: str) -> str:
    return daemon_config(
        server={"stream_hold_s": 0.2}, breaker=NO_BREAKER,
        providers={"an": anthropic_at(an_url, api_key_env="FAKE_AN_KEY"),
                   "an2": anthropic_at(an2_url, api_key_env="FAKE_AN_KEY"), "oa": openai_at(oa_url),
                   "oa2": openai_at(oa2_url)},
        profiles={"default": warn("an"), "an": warn("an"), "anchain": warn("an", "an2"), "oachain": warn("oa", "oa2")})

SECRET = "sk-an-secret-23"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile_upstream")
    with FakeServer("anthropic", name="an") as an, FakeServer("anthropic", name="an2") as an2, \
            FakeServer("openai", name="oa") as oa, FakeServer("openai", name="oa2") as oa2, \
            FakeServer("anthropic", name="elsewhere") as elsewhere:
        with running(config(an.url, an2.url, oa.url, oa2.url), tmp, env={"FAKE_AN_KEY": SECRET}) as d:
            yield {"daemon": d, "an": an, "an2": an2, "oa": oa, "oa2": oa2, "elsewhere": elsewhere}


@pytest.fixture(autouse=True)
def _fakes_ok(env):
    for name in ("an", "an2", "oa", "oa2", "elsewhere"):
        env[name].reset()
        env[name].set_behaviour("ok")


def _failures(env, provider: str) -> int:
    r = corectl("status", "--json", env_socket=str(env["daemon"].state_dir / "coderouterd.sock"))
    assert r.returncode == 0, r.stderr
    return {p["name"]: p for p in orjson.loads(r.stdout)["providers"]}[provider]["breaker"]["consecutive_failures"]


def _healthz_answers(env) -> bool:
    """The daemon still answers beside what the upstream did. Not timed: a loaded machine makes any limit flaky;
    the ceiling only turns a hang into a failure."""
    return httpx.get(env["daemon"].url + "/healthz", timeout=30).status_code == 200


# -- 1. an Anthropic stream that ends cleanly after a block started, before message_stop ---------------------

@pytest.mark.parametrize("end", ["chunked", "close"])
@pytest.mark.parametrize("ingress", ["anthropic", "openai", "responses"])
def test_stream_cut_mid_block_ends_with_an_error_event_at_once(env, end, ingress):
    d = env["daemon"]
    env["an"].set_behaviour(f"cut_mid_block;end={end}")
    before = _failures(env, "an")
    answer: dict = {}

    def stream() -> None:
        path, body = {
            "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 10, "stream": True, "messages": USER}),
            "openai": ("/v1/chat/completions", {"model": "m", "stream": True, "messages": USER}),
            "responses": ("/v1/responses", {"model": "m", "stream": True, "input": "hi"}),
        }[ingress]
        try:
            # 30 s: a ceiling against a hang, a quarter of the daemon's 120 s idle timeout (which a stream left
            # open would wait for), hundreds of times what the answer takes.
            r = httpx.post(d.url + path, json=body, headers={"x-coderouter-profile": "an"}, timeout=30)
            answer["status"], answer["text"] = r.status_code, r.text
        except httpx.HTTPError as e:
            answer["error"] = repr(e)

    t = threading.Thread(target=stream)
    t.start()
    assert _healthz_answers(env)  # the daemon serves others meanwhile
    t.join(60)
    assert not t.is_alive() and "error" not in answer, answer
    assert answer["status"] == 200
    text = answer["text"]
    if ingress == "anthropic":
        names = event_names(text)
        assert names[0] == "message_start" and "content_block_start" in names and names[-1] == "error", text
        last = orjson.loads(text.rstrip().splitlines()[-1][6:])
        assert last["type"] == "error" and "message_stop" in last["error"]["message"]
    elif ingress == "openai":
        # The cut answer is not passed off as complete (no finish_reason): an error chunk, then [DONE].
        datas = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
        assert datas[-1] == "[DONE]" and "error" in orjson.loads(datas[-2]), text
        assert '"finish_reason":"stop"' not in text, text
    else:
        names = [ln[7:] for ln in text.splitlines() if ln.startswith("event: ")]
        assert "response.completed" not in names and names[-1] in ("response.failed", "error"), text
    assert _failures(env, "an") == before + 1  # the upstream counted as failed
    for _ in range(5):
        assert _healthz_answers(env)
    assert d.proc.poll() is None



# -- 2. redirects are never followed --------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_is_not_followed_and_fails_over(env, status, stream):
    d, elsewhere = env["daemon"], env["elsewhere"]
    env["an"].set_behaviour(f"redirect;status={status};to={elsewhere.url}/v1/messages")
    r = httpx.post(d.url + "/v1/messages", json={"model": "m", "max_tokens": 10, "stream": stream, "messages": USER},
                   headers={"x-coderouter-profile": "anchain"}, timeout=10)
    assert r.status_code == 200, r.text
    # Neither the key nor the prompt went anywhere but the configured providers.
    assert not elsewhere.requests and not elsewhere.saw_api_key
    assert r.headers["x-coderouter-attempts"].startswith("an:upstream_redirect,an2:"), r.headers
    assert (streamed_text(r.text) if stream else r.json()["content"][0]["text"]) == "Hello from an2"


def test_a_redirect_is_named_in_the_error_when_nothing_else_serves(env):
    d, elsewhere = env["daemon"], env["elsewhere"]
    env["an"].set_behaviour(f"redirect;status=307;to={elsewhere.url}/v1/messages")
    r = httpx.post(d.url + "/v1/messages", json={"model": "m", "max_tokens": 10, "messages": USER},
                   headers={"x-coderouter-profile": "an"}, timeout=10)
    assert r.status_code >= 500 and r.json()["type"] == "error"
    message = r.json()["error"]["message"]
    assert "redirect" in message and "307" in message and elsewhere.url.split("//")[1] in message, message
    assert not elsewhere.requests


# -- 3. what an upstream sends is bounded ----------------------------------------------------------------------

def _peak_rss_mb(d: DaemonProcess) -> float:
    with open(f"/proc/{d.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
@pytest.mark.parametrize(("spec", "stream", "reason"), [
    ("big_json;mb=20", False, "answer_too_large"),  # bound: 16 MB
    ("gzip_bomb;mb=300", False, "answer_too_large"),  # 300 KB on the wire, 300 MB inflated
    ("endless_error;status=500", False, "http_500"),  # read up to 64 KB, then judged by its status
    ("endless_error;status=503", True, "http_503"),
    ("sse_no_newline", True, "answer_too_large"),  # one line without end (bound: 4 MB)
    ("sse_no_blank", True, "answer_too_large"),  # data lines, no event ever ends (bound: 4 MB)
])
def test_an_answer_without_bound_is_an_upstream_error_that_fails_over(env, wire, spec, stream, reason):
    d = env["daemon"]
    up, profile = ("an", "anchain") if wire == "anthropic" else ("oa", "oachain")
    env[up].set_behaviour(spec)
    if wire == "anthropic":
        path, body = "/v1/messages", {"model": "m", "max_tokens": 10, "stream": stream, "messages": USER}
    else:
        path, body = "/v1/chat/completions", {"model": "m", "stream": stream, "messages": USER}
    peak = _peak_rss_mb(d)
    # The bound is in bytes (the reason and the RSS below say it held), not in time: the timeout only turns a
    # daemon that reads forever into a failure.
    r = httpx.post(d.url + path, json=body, headers={"x-coderouter-profile": profile}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    attempts = r.headers["x-coderouter-attempts"]
    if stream and attempts == f"{up}:streaming":
        # The stream hold (0.2 s) ran out before the fake had sent 4 MB (a loaded machine): the stream was
        # committed with nothing in it. The breach then moves to the next provider (nothing was sent yet), or,
        # if content had gone out, ends the stream with a well-formed error event naming it.
        marker = "event: error" if wire == "anthropic" else 'data: {"error"'
        failed_over = f"Hello from {up}2".split()[-1] in r.text and marker not in r.text
        named = marker in r.text and ("larger than" in r.text or "longer than" in r.text)
        assert failed_over or named, r.text[-400:]
        assert _healthz_answers(env)
        return
    assert attempts.startswith(f"{up}:{reason},{up}2:"), attempts
    if stream:
        text = streamed_text(r.text) if wire == "anthropic" else "".join(
            (orjson.loads(ln[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for ln in r.text.splitlines() if ln.startswith("data: {"))
    else:
        text = r.json()["content"][0]["text"] if wire == "anthropic" else r.json()["choices"][0]["message"]["content"]
    assert text == f"Hello from {up}2"
    assert _peak_rss_mb(d) - peak < 350  # nothing like the gigabyte the fake would have sent
    assert _healthz_answers(env)


def _rss_mb(d) -> float:
    import psutil

    return psutil.Process(d.proc.pid).memory_info().rss / 2**20


@pytest.mark.parametrize(("wire", "spec", "stream"), [("openai", "gzip_bomb;mb=40", False),
                                                      ("openai", "big_json;mb=20", False),
                                                      ("anthropic", "sse_no_blank;mb=6", True),
                                                      ("openai", "big_json;mb=20", True)])
def test_refused_answers_leave_no_memory_behind(env, wire, spec, stream):
    """The refused bytes must not outlive the attempt: each was kept, through the exception's traceback, until
    the cyclic GC ran (+65 MB of RSS per bomb in the soak, 2 GB after 30); a refused stream kept up to its line's
    or event's bound (4 MB) in the frames of the traceback of an error kept after the request (the soak's RSS
    climbed from 84 to 175 MB in 7 minutes); and glibc kept what was freed until trimmed (allocator.py)."""
    d = env["daemon"]
    up, profile = ("an", "anchain") if wire == "anthropic" else ("oa", "oachain")
    env[up].set_behaviour(spec)
    if wire == "anthropic":
        path, body = "/v1/messages", {"model": "m", "max_tokens": 10, "stream": stream, "messages": USER}
    else:
        path, body = "/v1/chat/completions", {"model": "m", "stream": stream, "messages": USER}
    post = lambda: httpx.post(d.url + path, json=body, headers={"x-coderouter-profile": profile}, timeout=30)  # noqa: E731
    assert post().status_code == 200  # the first one warms buffers and pools up
    before = _rss_mb(d)
    for _ in range(10):
        r = post()
        # A stream may be committed (stream hold over) before the line or event passes its bound: then the
        # client gets an error event instead of the failover; either way the bytes are refused.
        assert r.status_code == 200 and ("answer_too_large" in r.headers["x-coderouter-attempts"] or stream)
    # The trim follows a refused read by allocator.TRIM_DELAY_S: waited for, not slept through.
    assert wait_for(lambda: _rss_mb(d) - before < 24, 30), (before, _rss_mb(d))  # each used to keep its 16 MB: +160


# -- 4. garbage is no success ------------------------------------------------------------------------------------

_INT = st.integers(-(2**63), 2**63 - 1)  # what orjson writes
_JSON_NOT_AN_ANSWER = st.one_of(
    st.none(), st.booleans(), _INT, st.text(max_size=20), st.lists(_INT, max_size=3),
    st.dictionaries(st.sampled_from(["id", "object", "model", "usage", "data", "result", "type"]),
                    st.one_of(st.none(), _INT, st.text(max_size=8)), max_size=3),
    st.just({"choices": None}), st.just({"type": "message", "content": "x"}), st.just({"type": "nope"}),
).map(lambda v: orjson.dumps(v))
_TEXT_GARBAGE = st.one_of(
    st.sampled_from([b"", b"null", b"<html><body>502 Bad Gateway</body></html>", b"OK", b"\x00\x01\x02",
                     b'{"choices": [', b'{"id": "chatcmpl-1", "choices": [{"index": 0', b"\xef\xbb\xbf{}"]),
    st.binary(max_size=64),
)
_SSE_GARBAGE = st.one_of(
    st.sampled_from([b"data: hello\n\n", b"data: null\n\n", b"data: [1,2]\n\n", b"data: [DONE]\n\n",
                     b"event: foo\ndata: {}\n\n", b"event: message_start\ndata: null\n\n",
                     b'event: message_start\ndata: {"type":"message_start","message":"x"}\n\n',
                     b'event: content_block_start\ndata: {"type":"content_block_start","index":0}\n\n',
                     b'data: {"object":"chat.completion.chunk"}\n\n', b"data: {}\n\n",
                     b"<html>\n\n</html>\n\n"]),
    st.lists(st.sampled_from([b"data: x\n", b"event: y\n", b"\n", b": c\n", b"data: 1\n"]), max_size=6)
    .map(b"".join),
)
garbage = st.tuples(
    st.sampled_from(["application/json", "text/html", "text/event-stream", "text/plain", "application/octet-stream"]),
    st.one_of(_JSON_NOT_AN_ANSWER, _TEXT_GARBAGE, _SSE_GARBAGE),
)


def test_garbage_from_a_same_wire_upstream_fails_over(env):
    """Property: whatever a same-wire upstream answers with a 200 that is not an answer (HTML, null, JSON of
    another shape, SSE that does not open as the protocol says), the client gets the next provider's answer:
    never the garbage, never a 5xx; and the daemon stays healthy."""
    d = env["daemon"]
    failures: list[str] = []

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(answer=garbage, wire=st.sampled_from(["anthropic", "openai"]), stream=st.booleans())
    def run(answer, wire, stream):
        ctype, body = answer
        up, profile = ("an", "anchain") if wire == "anthropic" else ("oa", "oachain")
        env[up].set_behaviour(f"raw;status=200;ctype={ctype};hex={body.hex()}")
        if wire == "anthropic":
            path, req = "/v1/messages", {"model": "m", "max_tokens": 10, "stream": stream, "messages": USER}
        else:
            path, req = "/v1/chat/completions", {"model": "m", "stream": stream, "messages": USER}
        r = httpx.post(d.url + path, json=req, headers={"x-coderouter-profile": profile}, timeout=10)
        attempts = r.headers.get("x-coderouter-attempts", "")
        problem = None
        if r.status_code != 200:
            problem = f"status {r.status_code}"
        elif not attempts.startswith(f"{up}:") or attempts.startswith(f"{up}:ok") or f"{up}2:" not in attempts:
            problem = f"no failover: {attempts}"
        elif stream:
            text = streamed_text(r.text) if wire == "anthropic" else "".join(
                (orjson.loads(ln[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                for ln in r.text.splitlines() if ln.startswith("data: {"))
            problem = None if text == f"Hello from {up}2" else f"stream text {text!r}"
        else:
            data = r.json()
            text = data["content"][0]["text"] if wire == "anthropic" else data["choices"][0]["message"]["content"]
            problem = None if text == f"Hello from {up}2" else f"text {text!r}"
        if problem:
            failures.append(f"{wire} stream={stream} {ctype} {body[:80]!r}: {problem}; {r.text[:200]!r}")

    run()
    assert not failures, f"{len(failures)} garbage answers not failed over; first ones:\n" + "\n".join(failures[:8])
    assert _healthz_answers(env) and d.proc.poll() is None
