"""Team keys' limits end to end (issue 41): the real daemon, keys made with the real `corectl keys create` (and its
admin endpoint), the official Anthropic and OpenAI SDKs. rpm, tpm and concurrency answer 429 in the caller's shape
with `retry-after` in whole seconds and the rate-limit headers each SDK reads, naming the key and never its secret;
the audit log keeps one line per key per minute; a key over its monthly budget gets the global cap's final refusal
naming the key, its cap and its spend, and its spend survives a restart."""

from __future__ import annotations

import socket
import time

import anthropic
import httpx
import openai
import orjson
import pytest

from coderouterd.state.store import Store
from tests.fakes.runner import FakeServer
from tests.support.cli import corectl
from tests.support.daemon import DaemonProcess
from tests.support.wait import wait_for

CONFIG = """
[server]
port = {PORT}

[providers.paid]
kind = "openai"
base_url = "@URL@/v1"
model = "fake-model"
paid = true
cost = { input = 3.0, output = 15.0 }

[profiles.default]
providers = ["paid"]
health_action = "warn"
"""


def _sock(d: DaemonProcess) -> str:
    return str(d.state_dir / "coderouterd.sock")


def _create(d: DaemonProcess, name: str, **settings) -> str:
    """A key made through the admin endpoint `corectl keys create` calls; returns its secret."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=_sock(d)), base_url="http://coderouterd", timeout=10) as c:
        r = c.post("/v1/keys", json={"name": name, **settings})
    assert r.status_code == 200, r.text
    return r.json()["key"]


@pytest.fixture
def daemon(tmp_path):
    with FakeServer("openai", name="paid") as up:
        d = DaemonProcess(CONFIG.replace("@URL@", up.url), tmp_path)
        d.start()
        d.upstream = up
        try:
            yield d
        finally:
            d.stop()


def _anthropic(d: DaemonProcess, secret: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.url, api_key=secret, max_retries=0, timeout=30)


def _openai(d: DaemonProcess, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key=secret, max_retries=0, timeout=30)


def _ask_anthropic(client: anthropic.Anthropic, max_tokens: int = 16):
    return client.messages.create(model="fake-model", max_tokens=max_tokens,
                                  messages=[{"role": "user", "content": "hi"}])


def _ask_openai(client: openai.OpenAI, max_tokens: int = 16):
    return client.chat.completions.create(model="fake-model", max_tokens=max_tokens,
                                          messages=[{"role": "user", "content": "hi"}])


def _audit_lines(d: DaemonProcess, kind: str) -> list[dict]:
    path = d.state_dir / "audit.jsonl"
    if not path.exists():
        return []
    return [r for r in map(orjson.loads, path.read_bytes().splitlines()) if r.get("kind") == kind]


def test_rpm_429_in_anthropic_and_openai_shapes_with_the_headers_their_clients_read(daemon):
    d = daemon
    made = corectl(["--socket", _sock(d), "--json", "keys", "create", "alice", "--rpm", "3", "--tpm", "100000"])
    assert made.returncode == 0, made.stderr
    secret = orjson.loads(made.stdout)["key"]
    claude = _anthropic(d, secret)
    for _ in range(3):  # a burst of N at once is allowed
        assert _ask_anthropic(claude).content
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask_anthropic(claude)
    e = caught.value
    h = e.response.headers
    assert e.status_code == 429
    assert isinstance(e.body, dict) and e.body["error"]["type"] == "rate_limit_error"
    assert int(h["retry-after"]) >= 1 and h["retry-after"].isdigit()  # whole seconds
    assert h["anthropic-ratelimit-requests-limit"] == "3"
    assert h["anthropic-ratelimit-requests-remaining"] == "0"
    assert h["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert h["anthropic-ratelimit-tokens-limit"] == "100000"
    assert "alice" in e.message and "rpm" in e.message
    assert secret not in e.response.text and secret not in str(dict(h))

    # The same key through the OpenAI wire: the same window (it is the key's), OpenAI's header names.
    with pytest.raises(openai.RateLimitError) as caught_o:
        _ask_openai(_openai(d, secret))
    o = caught_o.value.response.headers
    assert o["x-ratelimit-limit-requests"] == "3" and o["x-ratelimit-remaining-requests"] == "0"
    assert o["x-ratelimit-reset-requests"].endswith("s") and int(o["retry-after"]) >= 1
    assert o["x-ratelimit-limit-tokens"] == "100000"
    assert caught_o.value.code == "rate_limit_exceeded"
    assert "anthropic-ratelimit-requests-limit" not in o
    # And the Responses wire (Codex): its error shape, OpenAI's headers.
    r = httpx.post(d.url + "/v1/responses", headers={"authorization": f"Bearer {secret}"}, timeout=30,
                   json={"model": "fake-model", "input": "hi"})
    assert r.status_code == 429 and r.headers["x-ratelimit-limit-requests"] == "3"
    assert "alice" in r.json()["error"]["message"] and secret not in r.text

    # Another key is not held by alice's window; the upstream saw only what was admitted.
    bob = _create(d, "bob", rpm=1)
    assert _ask_openai(_openai(d, bob)).choices
    assert d.upstream.count("/v1/chat/completions") == 4

    # The audit log: one line for alice's refusals within the minute, none with a secret.
    assert wait_for(lambda: _audit_lines(d, "key_rate_limited"), 15)
    for _ in range(3):
        with pytest.raises(anthropic.RateLimitError):
            _ask_anthropic(claude)
    time.sleep(0.3)  # the writer thread's batch; a slow machine can only make this check weaker
    lines = _audit_lines(d, "key_rate_limited")
    assert [r["key"] for r in lines] == ["alice"]
    audit = (d.state_dir / "audit.jsonl").read_text()
    assert secret not in audit and bob not in audit


def test_tpm_counts_estimated_tokens_and_a_request_over_the_whole_tpm_is_not_retried(daemon):
    d = daemon
    secret = _create(d, "carol", tpm=300)
    client = _anthropic(d, secret)
    # Estimated at ~prompt + min(max_tokens, 1024): 250 fits once, then the window is full.
    first = _ask_anthropic(client, max_tokens=250)
    # Settled with the real counts: the fake's short answer used far less than 250.
    second = _ask_anthropic(client, max_tokens=250)
    used = sum(r.usage.input_tokens + r.usage.output_tokens for r in (first, second))
    assert 0 < used < 100
    # Fits the limit alone, not beside what the window holds: a 429 to retry later.
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask_anthropic(client, max_tokens=270)
    assert caught.value.response.headers["anthropic-ratelimit-tokens-limit"] == "300"
    assert int(caught.value.response.headers["anthropic-ratelimit-tokens-remaining"]) == 300 - used
    assert "x-should-retry" not in caught.value.response.headers
    assert "tpm" in caught.value.message
    # Estimated over the whole limit: no wait can help, and both SDKs obey x-should-retry: false.
    retrying = anthropic.Anthropic(base_url=d.url, api_key=secret, max_retries=3, timeout=30)
    with pytest.raises(anthropic.RateLimitError) as never:
        _ask_anthropic(retrying, max_tokens=4000)
    assert never.value.response.headers["x-should-retry"] == "false"
    assert "exceed its whole limit" in never.value.message


def test_concurrency_refuses_while_in_flight_and_frees_the_slot_when_the_request_ends(daemon):
    d = daemon
    secret = _create(d, "dave", concurrency=1)
    d.upstream.script(["hang"])
    base = d.upstream.count("/v1/chat/completions")
    body = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hold"}]})
    holder = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    holder.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                   + f"authorization: Bearer {secret}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    assert wait_for(lambda: d.upstream.count("/v1/chat/completions") > base, 30)
    with pytest.raises(openai.RateLimitError) as caught:
        _ask_openai(_openai(d, secret))
    assert "concurrency" in caught.value.message and "dave" in caught.value.message
    assert caught.value.response.headers["retry-after"] == "1"
    holder.close()  # the client leaves: its request ends, and its slot with it

    def served() -> bool:
        try:
            return bool(_ask_openai(_openai(d, secret)).choices)
        except openai.RateLimitError:
            return False

    assert wait_for(served, 30)


def test_a_key_over_its_budget_gets_the_final_refusal_naming_key_cap_and_spend(tmp_path):
    with FakeServer("openai", name="paid") as up:
        d = DaemonProcess(CONFIG.replace("@URL@", up.url), tmp_path)
        # This month's spend of the key, as a daemon that spent it would have left it: it survives the restart.
        store = Store(d.state_dir / "state.db")
        store.open()
        store.set("budget", time.strftime("%Y-%m", time.gmtime()) + ":key:erin", 0.75)
        store.close()
        d.start()
        try:
            erin = _create(d, "erin", monthly_usd=0.5)
            frank = _create(d, "frank", monthly_usd=0.5)
            with pytest.raises(anthropic.APIStatusError) as caught:
                _ask_anthropic(_anthropic(d, erin))
            e = caught.value
            assert e.response.headers.get("x-should-retry") == "false"  # the global cap's final refusal
            assert "team key 'erin'" in e.message and "0.75 of 0.50 USD" in e.message
            assert erin not in e.response.text
            with pytest.raises(openai.APIStatusError) as caught_o:
                _ask_openai(_openai(d, erin))
            assert caught_o.value.code == "budget_exceeded" and "team key 'erin'" in caught_o.value.message
            assert up.count("/v1/chat/completions") == 0  # refused before any upstream call
            # Another key's budget is its own.
            assert _ask_openai(_openai(d, frank)).choices
            # A key with a budget of 0 may use free providers only; this profile has none.
            intern = _create(d, "gina", monthly_usd=0)
            with pytest.raises(anthropic.APIStatusError) as zero:
                _ask_anthropic(_anthropic(d, intern))
            assert zero.value.response.headers.get("x-should-retry") == "false"
            assert "team key 'gina'" in zero.value.message and "free providers only" in zero.value.message
        finally:
            d.stop()


def test_a_request_refused_before_any_upstream_leaves_nothing_in_the_key_s_tpm(daemon):
    """tpm counts what was used: a request admitted under the key's limits and then refused before reaching any
    upstream (here its budget of 0 USD allows free providers only, and the one provider is paid) used no token,
    so it leaves no estimate in the window for the key's next requests."""
    secret = _create(daemon, "frank", monthly_usd=0, tpm=2500)
    client = _openai(daemon, secret)
    for i in range(4):  # each is counted ~1000 tokens at admission (max_tokens 1000): 4 of them exceed 2500
        with pytest.raises(openai.APIStatusError) as e:
            _ask_openai(client, max_tokens=1000)
        assert e.value.status_code != 429, (i, e.value.body)
        assert "0 USD" in str(e.value.body), e.value.body  # the budget's refusal, every time
    assert not [r for r in daemon.upstream.requests if r["method"] == "POST"]  # none reached the upstream
