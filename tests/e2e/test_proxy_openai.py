"""Cline/Aider's side of the wire: the official openai SDK on /v1/chat/completions, both kinds of upstream."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from tests.fakes.behaviour import REASONING_TEXT, TOOL_ARGUMENTS
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, daemon_config, local_and_cloud
from tests.support.daemon import running


def config(local_url: str, cloud_url: str) -> str:
    return local_and_cloud(local_url, cloud_url, server={"stream_hold_s": 0.3}, breaker=NO_BREAKER)

TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_openai")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, FakeServer("anthropic", name="cloud") as cloud:
        with running(config(local.url, cloud.url), tmp) as d:
            yield {"daemon": d, "local": local, "cloud": cloud}


@pytest.fixture(autouse=True)
def _reset(env):
    for k in ("local", "cloud"):
        env[k].reset()
        env[k].set_behaviour("ok")


def _client(env, profile: str = "default") -> openai.OpenAI:
    return openai.OpenAI(base_url=env["daemon"].url + "/v1", api_key="x", max_retries=0, timeout=20,
                         default_headers={"x-coderouter-profile": profile})


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_non_stream(env, profile):
    r = _client(env, profile).chat.completions.create(model="qwen3", messages=USER)
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_stream_with_usage(env, profile):
    chunks = list(_client(env, profile).chat.completions.create(
        model="qwen3", messages=USER, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Hello from")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_stream_without_usage_hides_the_injected_usage_chunk(env):
    chunks = list(_client(env).chat.completions.create(model="qwen3", messages=USER, stream=True))
    assert all(c.choices for c in chunks)
    assert env["local"].requests[-1]["json"]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_streamed_tool_calls_reassemble_exactly(env, profile):
    env["local"].set_behaviour("tools;split=2")
    env["cloud"].set_behaviour("tools;split=2")
    args: dict[int, str] = {}
    finish = None
    for c in _client(env, profile).chat.completions.create(model="qwen3", messages=USER, tools=TOOLS, stream=True):
        if not c.choices:
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = c.choices[0].finish_reason or finish
    assert args[0] == TOOL_ARGUMENTS if profile == "default" else orjson.loads(args[0]) == orjson.loads(TOOL_ARGUMENTS)
    assert finish == "tool_calls"


def test_non_stream_tool_calls_from_anthropic_upstream(env):
    env["cloud"].set_behaviour("tools")
    r = _client(env, "cloud").chat.completions.create(model="x", messages=USER, tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    assert orjson.loads(call.function.arguments) == orjson.loads(TOOL_ARGUMENTS)
    assert r.choices[0].finish_reason == "tool_calls"


def test_reasoning_from_anthropic_thinking(env):
    env["cloud"].set_behaviour("reasoning")
    r = httpx.post(env["daemon"].url + "/v1/chat/completions", headers={"x-coderouter-profile": "cloud"},
                   json={"model": "x", "messages": USER}, timeout=20).json()
    assert r["choices"][0]["message"]["reasoning_content"] == REASONING_TEXT


@pytest.mark.parametrize("behaviour,status", [("400", 400), ("500", 502), ("503_loading", 503)])
def test_errors_in_openai_shape(env, behaviour, status):
    env["local"].set_behaviour(behaviour)
    with pytest.raises(openai.APIStatusError) as ei:
        _client(env).chat.completions.create(model="qwen3", messages=USER)
    assert ei.value.status_code == status
    body = ei.value.response.json()
    assert set(body) == {"error"} and body["error"]["message"]


def test_mid_stream_failure_is_an_error_chunk(env):
    env["local"].set_behaviour("disconnect_mid_stream")
    with pytest.raises(openai.APIError):
        for _ in _client(env).chat.completions.create(model="qwen3", messages=USER, stream=True):
            pass


def test_count_tokens_uses_the_backend_tokenizer_then_a_calibrated_estimate(tmp_path):
    with FakeServer("openai", name="llamacpp", tokenize=True) as counting, FakeServer("openai", name="plain") as plain:
        cfg = daemon_config(providers={"llamacpp": counting.url, "plain": plain.url},
                            profiles={"default": ["llamacpp"], "plain": ["plain"]})
        with running(cfg, tmp_path) as d:
            body = {"model": "m", "messages": [{"role": "user", "content": "count these words please " * 50}]}
            r = httpx.post(d.url + "/v1/messages/count_tokens", json=body)
            assert r.status_code == 200 and r.json()["input_tokens"] > 0
            assert r.headers["x-coderouter-token-count"] == "tokenizer:llamacpp"
            assert counting.count("/tokenize") == 1
            r = httpx.post(d.url + "/v1/messages/count_tokens", json=body, headers={"x-coderouter-profile": "plain"})
            assert r.status_code == 200 and r.json()["input_tokens"] > 0
            assert r.headers["x-coderouter-token-count"] == "estimate:plain"


def test_client_closing_right_after_done_still_journals_the_usage(start_daemon):
    """The OpenAI SDK closes the connection as soon as it has read [DONE]. The upstream here keeps its HTTP body
    open a while after [DONE], so the close lands while the daemon is still finishing the response: the request
    was served all the same, and the journal must hold the usage the upstream reported, not a 499 with none."""
    from coderouterd.state.journal_reader import journal_rows

    with FakeServer("openai", name="local", behaviour="ok;linger=3") as fake:
        d = start_daemon(config(fake.url, fake.url))
        body = {"model": "qwen3", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
        usage = None
        with httpx.Client(timeout=20) as client, client.stream("POST", d.url + "/v1/chat/completions",
                                                               json=body) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    break  # leaving the block closes the connection, as the SDK does
                if line.startswith("data: ") and orjson.loads(line[6:]).get("usage"):
                    usage = orjson.loads(line[6:])["usage"]
        assert usage is not None and usage["prompt_tokens"] > 0
        d.stop()
        rows = journal_rows(d.state_dir / "state.db")
    assert [(r["status"], r["error_class"], r["input_tokens"], r["output_tokens"]) for r in rows] == [
        (200, None, usage["prompt_tokens"], usage["completion_tokens"])]
