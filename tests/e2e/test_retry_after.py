"""Retry-After and x-should-retry through the real daemon, in each ingress's vocabulary (docs/protocols.md, "Errors
coderouterd sends"): an open breaker's 529/503 says when it reopens; a key's rate limit says when its window has
room; a refusal no retry can help (a request over its key's whole tpm, a budget spent) says so with
`x-should-retry: false` and names no time. The OpenAI-wire ingresses say overload as OpenAI does (`server_error`,
`server_is_overloaded`), never Anthropic's `overloaded_error`."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.fakes.runner import FakeServer
from tests.support.daemon import DaemonProcess

RECOVERY_S = 40  # the breaker's time out: every Retry-After it gives is within it

BREAKER = """
[server]
port = {PORT}

[breaker]
failures = 1
recovery_s = 40

[providers.solo]
kind = "openai"
base_url = "@URL@/v1"

[profiles.default]
providers = ["solo"]
panic = false
"""

KEYS = """
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

USER = [{"role": "user", "content": "hi"}]


def _seconds(headers: httpx.Headers) -> int:
    value = headers.get("retry-after")
    assert value is not None and value.isdigit(), dict(headers)  # whole seconds
    return int(value)


def test_an_open_breaker_says_when_it_reopens_in_each_ingress_vocabulary(tmp_path):
    with FakeServer("openai", name="solo", behaviour="500") as up:
        d = DaemonProcess(BREAKER.replace("@URL@", up.url), tmp_path)
        d.start()
        try:
            claude = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0, timeout=30)
            with pytest.raises(anthropic.InternalServerError):  # 502: the failure that opens the breaker
                claude.messages.create(model="m", max_tokens=8, messages=USER)
            before = up.count("/v1/chat/completions")
            with pytest.raises(anthropic.APIStatusError) as caught:
                claude.messages.create(model="m", max_tokens=8, messages=USER)
            e = caught.value
            assert e.status_code == 529 and e.body["error"]["type"] == "overloaded_error"
            assert 1 <= _seconds(e.response.headers) <= RECOVERY_S

            gpt = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=30)
            with pytest.raises(openai.InternalServerError) as caught_o:
                gpt.chat.completions.create(model="m", max_tokens=8, messages=USER)
            o = caught_o.value
            assert o.status_code == 503 and o.body["type"] == "server_error"  # never overloaded_error
            assert o.code == "server_is_overloaded"
            assert 1 <= _seconds(o.response.headers) <= RECOVERY_S

            with pytest.raises(openai.InternalServerError) as caught_r:
                gpt.responses.create(model="m", input="hi")
            assert caught_r.value.status_code == 503 and caught_r.value.body["type"] == "server_error"
            assert 1 <= _seconds(caught_r.value.response.headers) <= RECOVERY_S

            g = httpx.post(d.url + "/v1beta/models/m:generateContent", timeout=30,
                           json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
            assert g.status_code == 503 and g.json()["error"]["status"] == "UNAVAILABLE", g.text
            assert 1 <= _seconds(g.headers) <= RECOVERY_S
            assert up.count("/v1/chat/completions") == before  # all answered while the breaker was open
        finally:
            d.stop()


def _create(d: DaemonProcess, name: str, **settings) -> str:
    sock = str(d.state_dir / "coderouterd.sock")
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://coderouterd", timeout=10) as c:
        r = c.post("/v1/keys", json={"name": name, **settings})
    assert r.status_code == 200, r.text
    return r.json()["key"]


def test_key_refusals_say_when_to_retry_or_that_retrying_cannot_help(tmp_path):
    with FakeServer("openai", name="paid") as up:
        d = DaemonProcess(KEYS.replace("@URL@", up.url), tmp_path)
        d.start()
        try:
            # rpm 1: the second request waits for the window, and is told how long.
            busy = _create(d, "busy", rpm=1)
            claude = anthropic.Anthropic(base_url=d.url, api_key=busy, max_retries=0, timeout=30)
            assert claude.messages.create(model="fake-model", max_tokens=8, messages=USER).content
            with pytest.raises(anthropic.RateLimitError) as caught:
                claude.messages.create(model="fake-model", max_tokens=8, messages=USER)
            assert 1 <= _seconds(caught.value.response.headers) <= 60
            assert caught.value.response.headers.get("x-should-retry") != "false"

            # tpm 50: a request whose estimate alone is over it can never fit.
            small = _create(d, "small", tpm=50)
            for client in (anthropic.Anthropic(base_url=d.url, api_key=small, max_retries=0, timeout=30),):
                with pytest.raises(anthropic.RateLimitError) as final:
                    client.messages.create(model="fake-model", max_tokens=4000, messages=USER)
                h = final.value.response.headers
                assert h.get("x-should-retry") == "false" and "retry-after" not in h, dict(h)
            gpt = openai.OpenAI(base_url=d.url + "/v1", api_key=small, max_retries=0, timeout=30)
            with pytest.raises(openai.RateLimitError) as final_o:
                gpt.chat.completions.create(model="fake-model", max_tokens=4000, messages=USER)
            h = final_o.value.response.headers
            assert h.get("x-should-retry") == "false" and "retry-after" not in h, dict(h)
            assert final_o.value.body["type"] == "rate_limit_exceeded"

            # A budget of 0 USD on a profile of paid providers: nothing to wait for.
            broke = _create(d, "broke", monthly_usd=0)
            with pytest.raises(anthropic.APIStatusError) as spent:
                anthropic.Anthropic(base_url=d.url, api_key=broke, max_retries=0, timeout=30).messages.create(
                    model="fake-model", max_tokens=8, messages=USER)
            h = spent.value.response.headers
            assert spent.value.status_code == 402 and h.get("x-should-retry") == "false" and "retry-after" not in h
            g = httpx.post(d.url + "/v1beta/models/fake-model:generateContent", headers={"x-goog-api-key": broke},
                           json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, timeout=30)
            # Gemini CLI retries 429 and 5xx whatever the headers say; it stops at a 400.
            assert g.status_code == 400 and g.json()["error"]["status"] == "FAILED_PRECONDITION", g.text
            assert "retry-after" not in g.headers
        finally:
            d.stop()


def test_a_model_still_starting_says_when_its_start_ends(tmp_path):
    """A local model slower than its start window: a request waits the window out, then gets a 529/503 with the
    time left in the start under way (its supervisor starts it again), never a bare "overloaded"."""
    from tests.e2e.test_ondemand import config, fake_cmd, managed
    from tests.fakes.runner import free_port
    from tests.support.daemon import running

    port = free_port()
    window = 4
    slow = managed(port, fake_cmd(port, start_delay=300), start_timeout_s=window, max_restarts=50)
    with running(config({"local": slow}, {"default": ["local"]}), tmp_path) as d:
        body = {"model": "m", "max_tokens": 5, "messages": USER}
        r = httpx.post(d.url + "/v1/messages", json=body, timeout=60)
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error", r.text
        assert "not ready" in r.json()["error"]["message"]
        assert 1 <= _seconds(r.headers) <= window
        o = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=60)
        assert o.status_code == 503 and o.json()["error"]["type"] == "server_error", o.text
        assert o.json()["error"]["code"] == "server_is_overloaded"
        assert 1 <= _seconds(o.headers) <= window
