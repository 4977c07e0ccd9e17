"""Claude Code's side of the wire: the official anthropic SDK against the real daemon, fake upstreams behind."""

from __future__ import annotations

import anthropic
import httpx
import orjson
import pytest

from tests.fakes.behaviour import REASONING_TEXT, TOOL_ARGUMENTS, TOOL_ARGUMENTS_2
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import running
from tests.support.ports import dead_port


def config(local, cloud, err500, bad401, limited) -> str:
    return daemon_config(
        server={"stream_hold_s": 0.3}, breaker=NO_BREAKER,
        providers={"local": openai_at(local.url), "cloud": anthropic_at(cloud.url, api_key_env="FAKE_CLOUD_KEY"),
                   "dead": openai_at(f"http://127.0.0.1:{dead_port()}", timeouts={"connect": 1}),
                   "err500": openai_at(err500.url), "bad401": openai_at(bad401.url), "limited": openai_at(limited.url)},
        profiles={"default": warn("local"), "cloud": warn("cloud"), "chain": warn("dead", "err500", "bad401", "local"),
                  "limited": warn("limited"), "limitedfast": warn("limited", panic=False),
                  "allbad": warn("dead", "err500")},
        routes=[{"model": "*passthrough*", "profile": "cloud"}])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_anthropic")
    with FakeServer("openai", name="local", models=["qwen3-coder"]) as local, \
            FakeServer("anthropic", name="cloud") as cloud, \
            FakeServer("openai", name="err500", behaviour="500") as err500, \
            FakeServer("openai", name="bad401", behaviour="401") as bad401, \
            FakeServer("openai", name="limited", behaviour="429;retry_after=7") as limited:
        cfg = config(local, cloud, err500, bad401, limited)
        with running(cfg, tmp, env={"FAKE_CLOUD_KEY": "sk-cloud-secret"}) as d:
            yield {"daemon": d, "local": local, "cloud": cloud, "err500": err500, "bad401": bad401,
                   "limited": limited}
        assert "sk-cloud-secret" not in d.log()


@pytest.fixture(autouse=True)
def _local_ok(env):
    env["local"].reset()
    env["local"].set_behaviour("ok")


@pytest.fixture
def client(env):
    return anthropic.Anthropic(base_url=env["daemon"].url, api_key="client-key", max_retries=0, timeout=20)


USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {
    "command": {"type": "string"}, "description": {"type": "string"}}, "required": ["command"]}}]


def test_non_stream_text(client, env):
    msg = client.messages.create(model="claude-sonnet-5", max_tokens=100, messages=USER)
    assert msg.content[0].type == "text" and msg.content[0].text == "Hello from local"
    assert msg.stop_reason == "end_turn"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    # claude-* on a local backend becomes the backend's first listed model
    assert env["local"].requests[-1]["json"]["model"] == "qwen3-coder"


def test_stream_text(client):
    with client.messages.stream(model="claude-sonnet-5", max_tokens=100, messages=USER) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Hello from local"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip_byte_exact(client, env, stream):
    env["local"].set_behaviour("tools;split=2")
    kw = dict(model="claude-sonnet-5", max_tokens=100, messages=USER, tools=TOOLS)
    if stream:
        raw_json = []
        with client.messages.stream(**kw) as s:
            for ev in s:
                if ev.type == "input_json":
                    raw_json.append(ev.partial_json)
            msg = s.get_final_message()
        assert "".join(raw_json) == TOOL_ARGUMENTS
    else:
        msg = client.messages.create(**kw)
    tool = [b for b in msg.content if b.type == "tool_use"][0]
    assert tool.input == orjson.loads(TOOL_ARGUMENTS)
    assert msg.stop_reason == "tool_use"
    # The client sends the result back; the upstream sees a well-formed OpenAI tool turn.
    env["local"].set_behaviour("ok")
    follow = USER + [{"role": "assistant", "content": msg.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "ok"}]}]
    client.messages.create(model="claude-sonnet-5", max_tokens=100, messages=follow, tools=TOOLS)
    sent = env["local"].requests[-1]["json"]["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == orjson.dumps(tool.input).decode() or \
        orjson.loads(sent[-2]["tool_calls"][0]["function"]["arguments"]) == tool.input
    assert sent[-1] == {"role": "tool", "tool_call_id": tool.id, "content": "ok"}


def test_parallel_tool_calls_stream(client, env):
    env["local"].set_behaviour("tools;split=3;parallel=2")
    with client.messages.stream(model="m", max_tokens=100, messages=USER, tools=TOOLS) as s:
        msg = s.get_final_message()
    tools = [b for b in msg.content if b.type == "tool_use"]
    assert [t.input for t in tools] == [orjson.loads(TOOL_ARGUMENTS), orjson.loads(TOOL_ARGUMENTS_2)]


@pytest.mark.parametrize("spec", ["reasoning", "reasoning;field=reasoning", "reasoning;think_tags=1"])
def test_thinking_from_reasoning(client, env, spec):
    env["local"].set_behaviour(spec)
    with client.messages.stream(model="m", max_tokens=100, messages=USER) as s:
        msg = s.get_final_message()
    kinds = [b.type for b in msg.content]
    assert kinds[0] == "thinking" and "text" in kinds
    assert msg.content[0].thinking == REASONING_TEXT
    assert msg.content[0].signature
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert "<think>" not in text and REASONING_TEXT not in text


@pytest.mark.parametrize("behaviour,status,etype", [
    ("400", 400, "invalid_request_error"),
    ("500", 502, "api_error"),
    ("503_loading", 529, "overloaded_error"),
    ("404_model", 502, "api_error"),
])
def test_upstream_failures_become_anthropic_errors(client, env, behaviour, status, etype):
    env["local"].set_behaviour(behaviour)
    with pytest.raises(anthropic.APIStatusError) as ei:
        client.messages.create(model="m", max_tokens=10, messages=USER)
    e = ei.value
    assert e.status_code == status
    body = e.response.json()
    assert body["type"] == "error" and body["error"]["type"] == etype
    assert body["error"]["message"]


def test_rate_limited_chain_is_a_rate_limit_with_retry_after(env):
    url = env["daemon"].url + "/v1/messages"
    body = {"model": "m", "max_tokens": 10, "messages": USER}
    r = httpx.post(url, headers={"x-coderouter-profile": "limited"}, json=body, timeout=20)
    # The client sees the upstream's rate limit as a rate limit, with its retry-after, so the SDK backs off.
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert r.headers["retry-after"] == "7"
    # Retry-After opened the breaker: a profile that opted out of panic answers at once, upstream untouched.
    before = env["limited"].count("/v1/chat/completions")
    r2 = httpx.post(url, headers={"x-coderouter-profile": "limitedfast"}, json=body, timeout=20)
    assert r2.status_code == 529 and "breaker_open" in r2.json()["error"]["message"]
    assert env["limited"].count("/v1/chat/completions") == before
    # With the default (panic = true) the only provider is still asked, and says 429 again itself.
    r3 = httpx.post(url, headers={"x-coderouter-profile": "limited"}, json=body, timeout=20)
    assert r3.status_code == 429 and r3.headers["retry-after"] == "7"
    assert r3.headers["x-coderouter-attempts"] == "limited:panic:http_429"
    assert env["limited"].count("/v1/chat/completions") == before + 1


def test_context_overflow_is_prompt_too_long(client, env):
    env["local"].set_behaviour("overflow")
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model="m", max_tokens=10, messages=USER)
    msg = ei.value.response.json()["error"]["message"]
    assert msg.startswith("prompt is too long: ") and "tokens >" in msg and msg.endswith("maximum")


def test_mid_stream_disconnect_ends_with_error_event(env):
    env["local"].set_behaviour("disconnect_mid_stream")
    r = httpx.post(env["daemon"].url + "/v1/messages", json={"model": "m", "max_tokens": 10, "stream": True,
                                                             "messages": USER}, timeout=20)
    assert r.status_code == 200
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "error"
    env["local"].set_behaviour("ok")


def test_error_mid_stream_before_content_fails_over_or_errors_cleanly(env):
    env["local"].set_behaviour("error_mid_stream")
    r = httpx.post(env["daemon"].url + "/v1/messages", json={"model": "m", "max_tokens": 10, "stream": True,
                                                             "messages": USER}, timeout=20)
    if r.status_code == 200:
        events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
        assert events[-1] == "error", r.text
    else:
        # The upstream failed before any event: still a real HTTP error in Anthropic's shape.
        assert r.status_code >= 500 and r.json()["type"] == "error"


def test_fallback_chain_serves_from_healthy(env):
    r = httpx.post(env["daemon"].url + "/v1/messages", headers={"x-coderouter-profile": "chain"},
                   json={"model": "m", "max_tokens": 10, "messages": USER}, timeout=20)
    assert r.status_code == 200, r.text
    assert r.headers["x-coderouter-provider"] == "local"
    attempts = r.headers["x-coderouter-attempts"]
    assert attempts.startswith("dead:connect_error,err500:http_500,bad401:http_401,local:ok"), attempts
    assert r.json()["content"][0]["text"] == "Hello from local"


def test_fallback_chain_streaming(env):
    with httpx.stream("POST", env["daemon"].url + "/v1/messages", headers={"x-coderouter-profile": "chain"},
                      json={"model": "m", "max_tokens": 10, "stream": True, "messages": USER}, timeout=20) as r:
        body = r.read().decode()
    assert r.headers["x-coderouter-provider"] == "local"
    assert "Hello" in body and "message_stop" in body


def test_all_failed_names_each_attempt(env):
    r = httpx.post(env["daemon"].url + "/v1/messages", headers={"x-coderouter-profile": "allbad"},
                   json={"model": "m", "max_tokens": 10, "messages": USER}, timeout=20)
    assert r.status_code == 502
    msg = r.json()["error"]["message"]
    assert "dead: connect_error" in msg and "err500: http_500" in msg


def test_passthrough_to_anthropic_keeps_body_and_key(env):
    c = anthropic.Anthropic(base_url=env["daemon"].url, api_key="client-key", max_retries=0)
    with c.messages.stream(model="claude-passthrough-1", max_tokens=50, messages=USER, tools=TOOLS,
                           system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]) as s:
        msg = s.get_final_message()
    assert msg.content
    seen = env["cloud"].requests[-1]
    assert seen["json"]["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert seen["headers"].get("x-api-key") == "sk-cloud-secret", str(seen["headers"])  # provider key, not the client's


def test_count_tokens(env):
    c = anthropic.Anthropic(base_url=env["daemon"].url, api_key="k", max_retries=0)
    n = c.messages.count_tokens(model="m", messages=USER * 1, system="be brief")
    assert n.input_tokens > 0
    passthrough = c.messages.count_tokens(model="claude-passthrough", messages=USER)
    assert passthrough.input_tokens > 0


def test_models_list_shapes(env):
    url = env["daemon"].url + "/v1/models"
    a = httpx.get(url, headers={"anthropic-version": "2023-06-01"}).json()
    o = httpx.get(url).json()
    assert a["data"][0]["type"] == "model" and "has_more" in a
    assert o["object"] == "list" and o["data"][0]["object"] == "model"


def test_head_and_root(env):
    assert httpx.head(env["daemon"].url + "/").status_code == 200
    assert httpx.get(env["daemon"].url + "/healthz").json() == {"status": "ok"}
