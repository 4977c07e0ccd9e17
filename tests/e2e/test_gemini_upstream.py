"""A Gemini API upstream (`kind = "gemini"`) behind a real daemon, reached from each of the four ingresses with the
clients' own SDKs (anthropic, openai chat and Responses, google-genai): text, streams, a tool round trip, the
thoughtSignature kept across a Gemini -> Gemini tool round trip, Google's errors in each caller's shape and in
the router's failure classes, and the usage (cached and thought tokens) in the journal."""

from __future__ import annotations

import base64
import sqlite3
import time

import anthropic
import httpx
import openai
import orjson
import pytest
from google import genai
from google.genai import errors, types

from tests.fakes.behaviour import REASONING_TEXT, TOOL_ARGUMENTS
from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, warn
from tests.support.daemon import running

KEY_ENV = "CODEROUTER_TEST_GEMINI_KEY"
GOOGLE_KEY = "AIza-fake-test-key"
MODEL = "gemini-2.5-flash"
GREETING = "Hello from gem"
BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
               "required": ["command"]}
PRICES = {"input": 0.3, "output": 2.5, "cache_read": 0.075}


def gemini_at(url: str, **fields) -> dict:
    return {"kind": "gemini", "base_url": url, "api_key_env": KEY_ENV, **fields}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_gemini_upstream")
    with FakeServer("gemini", name="gem", models=[MODEL], api_key=GOOGLE_KEY, cached_tokens=5) as gem, \
            FakeServer("gemini", name="spare", models=[MODEL], api_key=GOOGLE_KEY) as spare, \
            FakeServer("gemini", name="broken", behaviour="500", api_key=GOOGLE_KEY) as broken, \
            FakeServer("gemini", name="limited", behaviour="429;retry_after=7", api_key=GOOGLE_KEY) as limited:
        config = daemon_config(
            server={"stream_hold_s": 0.3, "ping_interval_s": 0.2},
            state={"flush_interval_s": 0.1},
            # One failure opens a breaker: a 400 that counted against the provider would show at once.
            breaker={"failures": 1, "recovery_s": 600},
            # The tests that make the gem fake fail reach it under names of their own: each name has its own
            # breaker, so no test leaves one open for another.
            providers={"gem": gemini_at(gem.url, paid=True, cost=PRICES), "spare": gemini_at(spare.url),
                       "broken": gemini_at(broken.url), "limited": gemini_at(limited.url),
                       "fallback": gemini_at(gem.url), "picky": gemini_at(gem.url), "relay": gemini_at(gem.url),
                       "cutter": gemini_at(gem.url), "sleepy": gemini_at(gem.url, timeouts={"first_byte": 1})},
            profiles={"default": warn("gem"), "failover": warn("broken", "fallback"), "strict": warn("picky", "spare"),
                      "relay": warn("relay", "spare"), "cutter": warn("cutter"), "limited": warn("limited"),
                      "sleepy": warn("sleepy", "spare")})
        with running(config, tmp, env={KEY_ENV: GOOGLE_KEY}) as d:
            yield {"daemon": d, "gem": gem, "spare": spare, "broken": broken, "limited": limited}


@pytest.fixture(autouse=True)
def _reset(env):
    for k in ("gem", "spare"):
        env[k].reset()
        env[k].set_behaviour("ok")


def _anthropic(env, profile="default") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env["daemon"].url, api_key="x", max_retries=0, timeout=20,
                               default_headers={"x-coderouter-profile": profile})


def _openai(env, profile="default") -> openai.OpenAI:
    return openai.OpenAI(base_url=env["daemon"].url + "/v1", api_key="x", max_retries=0, timeout=20,
                         default_headers={"x-coderouter-profile": profile})


def _genai(env, profile="default", version="v1beta") -> genai.Client:
    """One client per setting, kept for the module (a collected genai.Client closes its connections)."""
    clients = env.setdefault("genai", {})
    if (profile, version) not in clients:
        clients[(profile, version)] = genai.Client(api_key="client-key", http_options=types.HttpOptions(
            base_url=env["daemon"].url, api_version=version, headers={"x-coderouter-profile": profile},
            retry_options=types.HttpRetryOptions(attempts=1), timeout=20_000))
    return clients[(profile, version)]


def _generations(fake: FakeServer) -> list[dict]:
    return [r for r in fake.requests if r["method"] == "POST" and "Content" in r["path"].rpartition(":")[2]]


def _last_up(fake: FakeServer) -> dict:
    return _generations(fake)[-1]


def _journal(d, request_id: str) -> tuple | None:
    db = d.state_dir / "state.db"
    deadline = time.monotonic() + 30  # a ceiling: the journal's writer flushes every 100 ms here
    while time.monotonic() < deadline:
        if db.exists():
            con = sqlite3.connect(db)
            try:
                row = con.execute("SELECT provider, status, input_tokens, output_tokens, cache_read_tokens, cost_usd "
                                  "FROM journal WHERE request_id=?", (request_id,)).fetchone()
            except sqlite3.OperationalError:
                row = None
            finally:
                con.close()
            if row is not None:
                return row
        time.sleep(0.1)
    return None


# -- the upstream's wire ---------------------------------------------------------------------------------------


def test_request_goes_to_googles_url_with_the_key_header(env):
    r = _anthropic(env).messages.create(model=MODEL, max_tokens=64, system="be brief",
                                        messages=[{"role": "user", "content": "hi"}])
    assert r.content[0].text == GREETING
    up = _last_up(env["gem"])
    assert up["path"] == f"/v1beta/models/{MODEL}:generateContent" and up["query"] == ""
    assert up["headers"]["x-goog-api-key"] == GOOGLE_KEY and "authorization" not in up["headers"]
    body = up["json"]
    assert body["systemInstruction"] == {"parts": [{"text": "be brief"}]}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    assert body["generationConfig"]["maxOutputTokens"] == 64 and "model" not in body


def test_token_counts_come_from_googles_count_tokens(env):
    """Anthropic's count_tokens and the Gemini ingress's countTokens both ask the upstream's models.countTokens."""
    n = _anthropic(env).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "count me"}])
    up = [r for r in env["gem"].requests if r["path"].endswith(":countTokens")][-1]
    assert up["path"] == f"/v1beta/models/{MODEL}:countTokens" and up["headers"]["x-goog-api-key"] == GOOGLE_KEY
    request = up["json"]["generateContentRequest"]
    assert request["model"] == f"models/{MODEL}" and request["contents"] == [
        {"role": "user", "parts": [{"text": "count me"}]}]
    assert n.input_tokens == len(orjson.dumps(request)) // 4
    counted = _genai(env).models.count_tokens(model=MODEL, contents="count me too")
    assert counted.total_tokens == len(orjson.dumps(
        [r for r in env["gem"].requests if r["path"].endswith(":countTokens")][-1]["json"]["generateContentRequest"]
    )) // 4
    assert _generations(env["gem"]) == []  # counted, not generated


# -- Anthropic Messages clients -----------------------------------------------------------------------------------


def test_anthropic_stream(env):
    with _anthropic(env).messages.stream(model=MODEL, max_tokens=64,
                                         messages=[{"role": "user", "content": "hi"}]) as s:
        events = list(s)
        final = s.get_final_message()
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    start = next(e for e in events if e.type == "message_start")
    assert text == GREETING and final.stop_reason == "end_turn"
    up = _last_up(env["gem"])
    assert up["path"].endswith(":streamGenerateContent") and up["query"] == "alt=sse"
    prompt = up["prompt_tokens"]
    assert final.usage.input_tokens == prompt - 5 and final.usage.cache_read_input_tokens == 5
    assert final.usage.output_tokens == 3
    assert start.message.usage.input_tokens == prompt - 5  # said at the start, from Gemini's first response


def test_anthropic_tool_round_trip(env):
    tools = [{"name": "Bash", "description": "Run a shell command", "input_schema": BASH_SCHEMA}]
    env["gem"].fake.state.script(["tools;tool=Bash", "echo_tool_result"])
    client = _anthropic(env)
    with client.messages.stream(model=MODEL, max_tokens=256, tools=tools,
                                messages=[{"role": "user", "content": "list"}]) as s:
        first = s.get_final_message()
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "Bash" and call.input == orjson.loads(TOOL_ARGUMENTS)
    up = _last_up(env["gem"])["json"]
    assert up["tools"] == [{"functionDeclarations": [{"name": "Bash", "description": "Run a shell command",
                                                      "parametersJsonSchema": BASH_SCHEMA}]}]
    second = client.messages.create(model=MODEL, max_tokens=256, tools=tools, messages=[
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt b.txt"}]}])
    assert second.content[0].text == "Tool said: a.txt b.txt"
    contents = _last_up(env["gem"])["json"]["contents"]
    model_turn = contents[1]
    assert model_turn["role"] == "model"
    fc_part = next(p for p in model_turn["parts"] if "functionCall" in p)
    # The client never saw the call's signature; the daemon kept it by call id and sends back the upstream's own.
    assert fc_part["functionCall"]["name"] == "Bash" and fc_part["functionCall"]["id"] == call.id
    assert fc_part["thoughtSignature"] == env["gem"].fake.sign("Bash", orjson.loads(TOOL_ARGUMENTS))
    assert contents[2]["parts"][0]["functionResponse"]["name"] == "Bash"
    assert contents[2]["parts"][0]["functionResponse"]["response"] == {"output": "a.txt b.txt"}


# -- OpenAI chat clients -----------------------------------------------------------------------------------------


def test_chat_text_and_stream(env):
    client = _openai(env)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    assert r.choices[0].message.content == GREETING and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens_details.cached_tokens == 5
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == GREETING
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    plain = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                stream=True))
    assert all(c.usage is None for c in plain)  # not asked for: not sent


def test_chat_tool_round_trip(env):
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": BASH_SCHEMA}}]
    env["gem"].fake.state.script(["tools;tool=Bash", "echo_tool_result"])
    client = _openai(env)
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "list"}],
                                                 tools=tools, tool_choice="required", stream=True))
    frags = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert len(frags) == 1 and frags[0].function.name == "Bash"
    assert orjson.loads(frags[0].function.arguments) == orjson.loads(TOOL_ARGUMENTS)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert _last_up(env["gem"])["json"]["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    r = client.chat.completions.create(model=MODEL, tools=tools, messages=[
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": frags[0].id, "type": "function", "function": {
            "name": "Bash", "arguments": frags[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": frags[0].id, "content": "out.log"}])
    assert r.choices[0].message.content == "Tool said: out.log"
    signed = _last_up(env["gem"])["json"]["contents"][1]["parts"][0]
    assert signed["thoughtSignature"] == env["gem"].fake.sign("Bash", orjson.loads(TOOL_ARGUMENTS))
    # A call no Gemini model made here (another provider's, say): Google's documented placeholder goes instead.
    r = client.chat.completions.create(model=MODEL, tools=tools, messages=[
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_elsewhere", "type": "function",
                                                               "function": {"name": "Bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_elsewhere", "content": "x"}])
    assert r.choices[0].message.content == "Hello from gem"
    assert _last_up(env["gem"])["json"]["contents"][1]["parts"][0]["thoughtSignature"] == \
        "skip_thought_signature_validator"


# -- Responses clients -------------------------------------------------------------------------------------------


def test_responses_text_stream_and_tool_round_trip(env):
    client = _openai(env)
    r = client.responses.create(model=MODEL, input="hi")
    assert r.output_text == GREETING and r.usage.input_tokens_details.cached_tokens == 5
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == GREETING
    assert events[-1].type == "response.completed"
    tools = [{"type": "function", "name": "Bash", "parameters": BASH_SCHEMA}]
    env["gem"].fake.state.script(["tools;tool=Bash", "echo_tool_result"])
    first = client.responses.create(model=MODEL, input="list", tools=tools)
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "Bash" and orjson.loads(call.arguments) == orjson.loads(TOOL_ARGUMENTS)
    second = client.responses.create(model=MODEL, tools=tools, input=[
        {"role": "user", "content": "list"}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
    assert second.output_text == "Tool said: done"


# -- Gemini clients: the pass-through ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_gemini_text_and_stream_pass_through(env, version):
    client = _genai(env, version=version)
    r = client.models.generate_content(model=MODEL, contents="hi")
    assert r.text == GREETING and r.usage_metadata.cached_content_token_count == 5
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="hi"))
    assert "".join(c.text or "" for c in chunks) == GREETING and len(chunks) == 3
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    up = _last_up(env["gem"])
    assert up["query"] == "alt=sse" and up["path"].startswith("/v1beta/")  # the upstream's version, whatever the client's


def test_gemini_body_goes_up_as_the_client_wrote_it(env):
    """Fields this daemon does not read (safetySettings, a part's own metadata, snake_case keys) reach the
    upstream unchanged: the body is relayed, not rebuilt."""
    body = {"contents": [{"role": "user", "parts": [{"text": "hi", "thought_signature": "c2ln"}]}],
            "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
            "generation_config": {"max_output_tokens": 9, "response_modalities": ["TEXT"]},
            "labels": {"team": "x"}}
    r = httpx.post(env["daemon"].url + f"/v1beta/models/{MODEL}:generateContent", json=body,
                   headers={"x-goog-api-key": "client-key"}, timeout=20)
    assert r.status_code == 200, r.text
    assert r.json()["candidates"][0]["content"]["parts"][0]["text"] == "Hello"
    up = _last_up(env["gem"])
    assert up["json"] == body
    # The relayed answer's usageMetadata is the journal's usage too.
    row = _journal(env["daemon"], r.headers["x-request-id"])
    assert row is not None and row[:5] == ("gem", 200, up["prompt_tokens"] - 5, 3, 5)


def test_gemini_tool_round_trip_keeps_the_thought_signature(env):
    client = _genai(env)
    bash = types.Tool(function_declarations=[types.FunctionDeclaration(
        name="Bash", description="Run a shell command", parameters_json_schema=BASH_SCHEMA)])
    config = types.GenerateContentConfig(tools=[bash], automatic_function_calling=types.AutomaticFunctionCallingConfig(
        disable=True))
    env["gem"].fake.state.script(["tools;tool=Bash", "echo_tool_result"])
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="list", config=config))
    parts = [p for c in chunks for p in c.candidates[0].content.parts or ()]
    call_part = next(p for p in parts if p.function_call)
    signature = call_part.thought_signature
    assert signature and call_part.function_call.args == orjson.loads(TOOL_ARGUMENTS)
    history = [types.Content(role="user", parts=[types.Part(text="list")]),
               types.Content(role="model", parts=[call_part]),
               types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                   name="Bash", response={"output": "x.py"}))])]
    r = client.models.generate_content(model=MODEL, contents=history, config=config)
    assert r.text == "Tool said: x.py"
    sent = _last_up(env["gem"])["json"]["contents"][1]["parts"][0]
    # The upstream's own signature, as it issued it (the fake refuses a call without one, as Gemini 3 does).
    assert base64.urlsafe_b64decode(sent.get("thoughtSignature") or sent["thought_signature"]) == signature
    # Without it, the upstream's refusal reaches the client as Google's 400, and nothing fails over.
    unsigned = types.Part(function_call=call_part.function_call)
    with pytest.raises(errors.ClientError) as e:
        client.models.generate_content(model=MODEL, contents=[history[0], types.Content(role="model", parts=[
            unsigned]), history[2]], config=config)
    assert e.value.code == 400 and "missing a thought_signature" in e.value.message


def test_gemini_array_stream_fails_over_before_content(env):
    """streamGenerateContent without alt=sse is one JSON array to the client; an error the upstream streams before
    any content (here after an empty first response, sent on its own) still fails over to the next provider."""
    env["gem"].set_behaviour("error_mid_stream;after=0;chunk_delay=0.3")
    r = httpx.post(env["daemon"].url + f"/v1beta/models/{MODEL}:streamGenerateContent",
                   headers={"x-goog-api-key": "client-key", "x-coderouter-profile": "relay"},
                   json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, timeout=20)
    assert r.status_code == 200, r.text
    answers = r.json()
    assert isinstance(answers, list) and "".join(
        p.get("text", "") for a in answers for p in a["candidates"][0]["content"]["parts"]) == "Hello from spare"
    assert answers[-1]["candidates"][0]["finishReason"] == "STOP"
    assert len(_generations(env["gem"])) == 1 and len(_generations(env["spare"])) == 1


# -- errors ------------------------------------------------------------------------------------------------------


def test_rate_limit_is_a_429_with_googles_wait_in_every_shape(env):
    with pytest.raises(anthropic.RateLimitError) as ae:
        _anthropic(env, "limited").messages.create(model=MODEL, max_tokens=8,
                                                   messages=[{"role": "user", "content": "hi"}])
    assert ae.value.status_code == 429
    with pytest.raises(openai.RateLimitError):
        _openai(env, "limited").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(errors.ClientError) as ge:
        _genai(env, "limited").models.generate_content(model=MODEL, contents="hi")
    assert ge.value.code == 429 and ge.value.status == "RESOURCE_EXHAUSTED"
    r = httpx.post(env["daemon"].url + "/v1/chat/completions", headers={"x-coderouter-profile": "limited"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, timeout=20)
    assert r.status_code == 429
    wait = r.headers.get("retry-after")
    assert wait is not None and 0 < float(wait) <= 7  # RetryInfo's retryDelay: "7s", counting down


def test_server_error_fails_over_and_bad_request_does_not(env):
    r = _anthropic(env, "failover").messages.with_raw_response.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert r.parse().content[0].text == GREETING
    assert "broken" in r.headers.get("x-coderouter-attempts", "")
    # 400 INVALID_ARGUMENT: the request's fault. The caller gets it in its own shape, the next provider is not
    # tried, and the provider's breaker (one failure opens it here) stays closed: the next request is served there.
    env["gem"].set_behaviour("400")
    with pytest.raises(openai.BadRequestError) as e:
        _openai(env, "strict").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "Invalid JSON payload" in str(e.value)
    assert _generations(env["spare"]) == []
    env["gem"].set_behaviour("ok")
    r2 = _openai(env, "strict").chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert r2.parse().choices[0].message.content == GREETING
    assert _generations(env["spare"]) == [] and r2.headers["x-coderouter-provider"] == "picky"


def test_a_slow_upstream_times_out_and_fails_over(env):
    env["gem"].set_behaviour("slow_first_byte;delay=30")  # far beyond the provider's first_byte of 1 s
    chunks = list(_genai(env, "sleepy").models.generate_content_stream(model=MODEL, contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello from spare"
    assert len(_generations(env["gem"])) == 1 and len(_generations(env["spare"])) == 1


def test_stream_cut_without_finish_reason_is_an_error_not_an_answer(env):
    env["gem"].set_behaviour("cut_mid_block")
    with pytest.raises(openai.APIError):
        list(_openai(env, "cutter").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                            stream=True))


# -- accounting --------------------------------------------------------------------------------------------------


def test_usage_and_cost_in_the_journal(env):
    env["gem"].set_behaviour("reasoning")
    r = httpx.post(env["daemon"].url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"},
                   timeout=20)
    assert r.status_code == 200, r.text
    up = _last_up(env["gem"])
    assert up["json"]["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 1024, "includeThoughts": True}
    assert r.json()["choices"][0]["message"]["reasoning_content"].startswith("The user wants")
    row = _journal(env["daemon"], r.headers["x-request-id"])
    assert row is not None
    provider, status, input_tokens, output_tokens, cache_read, cost = row
    thoughts = len(REASONING_TEXT.split(" "))  # the fake's reasoning: a thought token per word
    assert (provider, status) == ("gem", 200)
    assert input_tokens == up["prompt_tokens"] - 5 and cache_read == 5
    assert output_tokens == 3 + thoughts  # candidates + thoughts: what Google bills as output
    expected = (input_tokens * PRICES["input"] + output_tokens * PRICES["output"] + cache_read * PRICES["cache_read"])
    assert cost == pytest.approx(expected / 1e6)
