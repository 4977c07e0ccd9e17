"""Gemini CLI's side of the wire: Google's own google-genai SDK on the Gemini API ingress, under /v1beta/ (what
Gemini CLI's bundled SDK calls) and /v1/ (google-genai's default), against a chat-completions upstream and an
Anthropic one: text, streams, countTokens, function calling both ways, and errors in Google's shape."""

from __future__ import annotations

import os
import sqlite3
import time

import httpx
import orjson
import pytest
from google import genai
from google.genai import errors, types

from tests.fakes.behaviour import TOOL_ARGUMENTS
from tests.fakes.runner import FakeServer
from tests.support.cli import corectl
from tests.support.config import NO_BREAKER, anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import running
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

PROFILES = ["default", "cloud"]
VERSIONS = ["v1beta", "v1"]
KEY = "gem-key"
BASH = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="Bash", description="Run a shell command",
    parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING"),
                                                       "description": types.Schema(type="STRING")},
                            required=["command"]))])
NO_AFC = types.AutomaticFunctionCallingConfig(disable=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_gemini")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, \
            FakeServer("anthropic", name="cloud") as cloud, \
            FakeServer("openai", name="limited", behaviour="429;retry_after=7") as limited:
        config = daemon_config(
            server={"stream_hold_s": 0.3, "ping_interval_s": 0.2, "api_keys": [KEY], "max_body_mb": 1},
            state={"flush_interval_s": 0.1},
            breaker=NO_BREAKER,
            providers={"local": openai_at(local.url), "cloud": anthropic_at(cloud.url, model="claude-sonnet-5"),
                       "limited": openai_at(limited.url),
                       "blind": openai_at(local.url, capabilities={"vision": False})},
            profiles={"default": warn("local"), "cloud": warn("cloud"), "limited": warn("limited"),
                      "guarded": warn("local", tool_loop={"action": "break", "threshold": 3}),
                      "blind": warn("blind")},
            routes=[{"model": "gemini-2.5-pro", "profile": "cloud"}])
        with running(config, tmp) as d:
            yield {"daemon": d, "local": local, "cloud": cloud, "limited": limited}


@pytest.fixture(autouse=True)
def _reset(env):
    for k in ("local", "cloud"):
        env[k].reset()
        env[k].set_behaviour("ok")


def _client(env, profile: str | None = "default", version: str = "v1beta", key: str = KEY) -> genai.Client:
    """One client per setting, kept for the module: a genai.Client closes its connections when collected, which
    `_client(env).models.generate_content(...)` would let happen before the call."""
    clients = env.setdefault("clients", {})
    if (profile, version, key) not in clients:
        clients[(profile, version, key)] = _new_client(env, profile, version, key)
    return clients[(profile, version, key)]


def _new_client(env, profile: str | None, version: str, key: str) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=env["daemon"].url, api_version=version,
        headers={"x-coderouter-profile": profile} if profile else {},
        retry_options=types.HttpRetryOptions(attempts=1), timeout=20_000))


def _fake(env, profile: str) -> FakeServer:
    return env["cloud"] if profile == "cloud" else env["local"]


def _greeting(profile: str) -> str:
    return "Hello from " + ("local" if profile == "default" else "cloud")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_text(env, profile, version):
    r = _client(env, profile, version).models.generate_content(
        model="gemini-2.5-flash", contents="hi",
        config=types.GenerateContentConfig(system_instruction="be brief", max_output_tokens=64, temperature=0.2))
    assert r.text == _greeting(profile)
    assert r.candidates[0].finish_reason == types.FinishReason.STOP
    u = r.usage_metadata
    assert u.prompt_token_count > 0 and u.candidates_token_count > 0
    assert u.total_token_count == u.prompt_token_count + u.candidates_token_count
    up = _fake(env, profile).requests[-1]["json"]
    if profile == "default":
        assert up["messages"][0] == {"role": "system", "content": "be brief"}
        assert up["max_tokens"] == 64 and up["temperature"] == 0.2
    else:
        assert up["system"] == "be brief" and up["max_tokens"] == 64
    assert up["model"] != "gemini-2.5-flash" or profile == "default"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_stream(env, profile, version):
    chunks = list(_client(env, profile, version).models.generate_content_stream(model="gemini-2.5-flash",
                                                                              contents="hi"))
    assert len(chunks) > 2  # streamed as it came, not one answer at the end
    assert "".join(c.text or "" for c in chunks) == _greeting(profile)
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    counts = [c.usage_metadata.candidates_token_count or 0 for c in chunks]
    assert counts == sorted(counts) and counts[-1] > 0  # cumulative on each chunk
    assert chunks[-1].usage_metadata.prompt_token_count > 0
    if profile == "cloud":  # the Anthropic stream says the prompt's size at its start: every chunk carries it
        assert {c.usage_metadata.prompt_token_count for c in chunks} == {chunks[-1].usage_metadata.prompt_token_count}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", PROFILES)
def test_count_tokens(env, profile, version):
    r = _client(env, profile, version).models.count_tokens(model="gemini-2.5-flash", contents="hello there")
    assert r.total_tokens > 0
    source = r.sdk_http_response.headers["x-coderouter-token-count"]
    assert source == ("exact:cloud" if profile == "cloud" else "estimate:local") or source.startswith("tokenizer")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("profile", PROFILES)
def test_function_calling_both_ways(env, profile, stream):
    """The model's call reaches the client whole (arguments streamed in fragments upstream), and the client's
    functionResponse (no id, as Gemini CLI's older turns send it) reaches the model paired with its call."""
    fake = _fake(env, profile)
    fake.script(["tools", "echo_tool_result"])
    client = _client(env, profile)
    config = types.GenerateContentConfig(tools=[BASH], automatic_function_calling=NO_AFC)
    if stream:
        chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents="list /tmp",
                                                            config=config))
        calls = [fc for c in chunks for fc in c.function_calls or ()]
        assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    else:
        calls = client.models.generate_content(model="gemini-2.5-flash", contents="list /tmp",
                                               config=config).function_calls
    assert len(calls) == 1
    assert calls[0].name == "Bash" and calls[0].args == orjson.loads(TOOL_ARGUMENTS)
    up = fake.requests[-1]["json"]
    tools = up["tools"]
    schema = tools[0]["function"]["parameters"] if profile == "default" else tools[0]["input_schema"]
    assert schema["type"] == "object" and schema["properties"]["command"] == {"type": "string"}
    history = [types.Content(role="user", parts=[types.Part(text="list /tmp")]),
               types.Content(role="model", parts=[types.Part(function_call=types.FunctionCall(
                   name="Bash", args=calls[0].args))]),
               types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                   name="Bash", response={"output": "a.txt b.txt"}))])]
    r = client.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)
    assert r.text == "Tool said: a.txt b.txt"
    up = fake.requests[-1]["json"]
    if profile == "default":
        call_id = up["messages"][1]["tool_calls"][0]["id"]
        assert up["messages"][2] == {"role": "tool", "tool_call_id": call_id, "content": "a.txt b.txt"}
    else:
        use, result = up["messages"][1]["content"][0], up["messages"][2]["content"][0]
        assert use["type"] == "tool_use" and result["tool_use_id"] == use["id"]


@pytest.mark.parametrize("profile", PROFILES)
def test_tool_config_any_with_allowed_names(env, profile):
    """ANY with allowedFunctionNames: only those are offered, and a call is required (a named one where the
    upstream reads a named tool_choice; the llama.cpp-like fake reads only strings)."""
    fake = _fake(env, profile)
    fake.set_behaviour("tools")
    read = types.FunctionDeclaration(name="Read", parameters_json_schema={"type": "object", "properties": {}})
    config = types.GenerateContentConfig(
        tools=[BASH, types.Tool(function_declarations=[read])], automatic_function_calling=NO_AFC,
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY", allowed_function_names=["Bash"])))
    _client(env, profile).models.generate_content(model="m", contents="go", config=config)
    up = fake.requests[-1]["json"]
    if profile == "default":
        assert [t["function"]["name"] for t in up["tools"]] == ["Bash"] and up["tool_choice"] == "required"
    else:
        assert [t["name"] for t in up["tools"]] == ["Bash"]
        assert up["tool_choice"] == {"type": "tool", "name": "Bash"}


@pytest.mark.parametrize("profile", PROFILES)
def test_structured_output(env, profile):
    """Gemini CLI's routing classifier asks for JSON by schema: structured output on a chat upstream, a forced
    tool on an Anthropic one, whose arguments come back as the answer's text."""
    fake = _fake(env, profile)
    schema = {"type": "object", "properties": {"cmd": {"type": "string", "enum": ["ls", "pwd"]}}, "required": ["cmd"]}
    config = types.GenerateContentConfig(response_mime_type="application/json", response_json_schema=schema)
    for stream in (False, True):
        if stream:
            chunks = list(_client(env, profile).models.generate_content_stream(model="m", contents="classify",
                                                                              config=config))
            text = "".join(c.text or "" for c in chunks)
        else:
            r = _client(env, profile).models.generate_content(model="m", contents="classify", config=config)
            text = r.text
            assert r.function_calls is None
        up = fake.requests[-1]["json"]
        if profile == "default":
            assert up["response_format"] == {"type": "json_schema",
                                             "json_schema": {"name": "response", "schema": schema}}
        else:
            assert up["tool_choice"] == {"type": "tool", "name": "structured_output"}
            assert up["tools"][0]["input_schema"] == schema
        assert orjson.loads(text) == {"cmd": "ls"}  # the fakes answer a schema as a constrained server does


def test_routes_by_model_name(env):
    r = _client(env, None).models.generate_content(model="gemini-2.5-pro", contents="hi")
    assert r.text == "Hello from cloud"
    assert r.sdk_http_response.headers["x-coderouter-profile"] == "cloud"


def test_thoughts_only_when_asked(env):
    env["local"].set_behaviour("reasoning")
    client = _client(env)
    with_thoughts = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
    parts = client.models.generate_content(model="m", contents="hi", config=with_thoughts).candidates[0].content.parts
    assert parts[0].thought is True and parts[0].text.startswith("The user wants")
    assert parts[1].text == "Hello from local" and not parts[1].thought
    r = client.models.generate_content(model="m", contents="hi")
    assert [p.text for p in r.candidates[0].content.parts] == ["Hello from local"]
    assert r.usage_metadata.thoughts_token_count > 0


@pytest.mark.parametrize("version", VERSIONS)
def test_errors_in_googles_shape(env, version):
    client = _client(env, version=version)
    with pytest.raises(errors.ClientError) as e:
        client.models.generate_content(model="m", contents="hi",
                                       config=types.GenerateContentConfig(candidate_count=2))
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT" and "candidateCount" in e.value.message
    with pytest.raises(errors.ClientError) as e:
        _client(env, version=version, key="wrong").models.generate_content(model="m", contents="hi")
    assert e.value.code == 401 and e.value.status == "UNAUTHENTICATED"
    with pytest.raises(errors.ClientError) as e:
        _client(env, "limited", version).models.generate_content(model="m", contents="hi")
    assert e.value.code == 429 and e.value.status == "RESOURCE_EXHAUSTED"
    env["local"].set_behaviour("503_loading")
    with pytest.raises(errors.ServerError) as e:
        client.models.generate_content(model="m", contents="hi")
    assert e.value.code == 503 and e.value.status == "UNAVAILABLE"
    with pytest.raises(errors.APIError) as e:
        client.models.embed_content(model="text-embedding-004", contents="hi")
    assert e.value.code == 501 and e.value.status == "UNIMPLEMENTED" and "EmbedContents" in e.value.message


def test_bad_bodies_are_400s_naming_the_field(env):
    url = env["daemon"].url + "/v1beta/models/m:generateContent"
    h = {"x-goog-api-key": KEY}
    for body, field in [({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
                         "contents[0].parts[0].functionCall.name"),
                        ({"contents": "hi"}, "contents"),
                        ({"contents": [{"role": "bot", "parts": []}]}, "contents[0].role"),
                        ({"contents": [], "generationConfig": {"maxOutputTokens": "9"}},
                         "generationConfig.maxOutputTokens")]:
        r = httpx.post(url, json=body, headers=h, timeout=20)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["status"] == "INVALID_ARGUMENT" and err["message"].startswith(field), err
    r = httpx.post(url, content=b"{", headers={**h, "content-type": "application/json"}, timeout=20)
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = httpx.post(url, content=b"{}", headers={**h, "content-type": "text/plain"}, timeout=20)
    assert r.status_code == 415 and r.json()["error"]["status"] == "INVALID_ARGUMENT"  # the browser boundary
    r = httpx.post(env["daemon"].url + "/v1beta/models/m:fooContent", json={}, headers=h, timeout=20)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    assert httpx.get(env["daemon"].url + "/healthz", timeout=10).status_code == 200  # still serving


def test_keys_as_query_or_bearer(env):
    url = env["daemon"].url + "/v1beta/models/m:generateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    assert httpx.post(url + f"?key={KEY}", json=body, timeout=20).status_code == 200
    assert httpx.post(url, json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=20).status_code == 200
    r = httpx.post(url + "?key=nope", json=body, timeout=20)
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    assert "key" not in str(env["local"].requests[-1]["query"])


def test_json_array_stream_without_alt_sse(env):
    """Without alt=sse the stream is one JSON array, written element by element."""
    env["local"].set_behaviour("slow_stream;delay=0.05")
    url = env["daemon"].url + f"/v1beta/models/m:streamGenerateContent?key={KEY}"
    pieces: list[bytes] = []
    with httpx.stream("POST", url, json={"contents": [{"parts": [{"text": "hi"}]}]}, timeout=20) as r:
        assert r.headers["content-type"].startswith("application/json")
        pieces.extend(r.iter_raw())
    assert len(pieces) > 2
    body = orjson.loads(b"".join(pieces))
    assert isinstance(body, list) and len(body) > 2
    assert "".join(p["text"] for c in body for p in c["candidates"][0]["content"]["parts"]) == "Hello from local"
    assert body[-1]["candidates"][0]["finishReason"] == "STOP"


def test_error_mid_stream_raises_in_the_sdk(env):
    env["local"].set_behaviour("error_mid_stream")
    with pytest.raises(errors.APIError) as e:
        for _chunk in _client(env).models.generate_content_stream(model="m", contents="hi"):
            pass
    assert e.value.code >= 500


def test_models_list_and_get(env):
    client = _client(env)
    names = [m.name for m in client.models.list()]
    assert "models/profile:cloud" in names
    m = client.models.get(model="gemini-2.5-flash")
    assert m.name == "models/gemini-2.5-flash" and "generateContent" in m.supported_actions
    # The OpenAI/Anthropic list at /v1/models is unchanged for their clients.
    r = httpx.get(env["daemon"].url + "/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.json()["object"] == "list"


def test_journal_metrics_and_trace(env):
    d = env["daemon"]
    r = httpx.post(d.url + f"/v1beta/models/gemini-2.5-flash:generateContent?key={KEY}",
                   json={"contents": [{"parts": [{"text": "hi"}]}], "tools": [{"googleSearch": {}}]}, timeout=20)
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    db = d.state_dir / "state.db"
    deadline = time.monotonic() + 30  # a ceiling: the journal's writer flushes every 250 ms
    row = None
    while time.monotonic() < deadline and row is None:
        time.sleep(0.1)
        if db.exists():
            con = sqlite3.connect(db)
            try:
                row = con.execute("SELECT ingress, model_requested, status FROM journal WHERE request_id=?",
                                  (rid,)).fetchone()
            finally:
                con.close()
    assert row == ("gemini", "gemini-2.5-flash", 200)
    assert wait_for(lambda: total(scrape(d), "coderouter_requests_total", ingress="gemini") >= 1), \
        "gemini requests missing from /metrics"
    sock = next(d.state_dir.rglob("*.sock"), None)
    assert sock is not None
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://coderouterd") as c:
        trace = c.get(f"/v1/requests/{rid}").json()
    assert any("googleSearch" in n for n in trace["notes"])
    shown = corectl(["explain", rid], env={**{k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")},
                                          "COLUMNS": "220", "CODEROUTER_SOCKET": str(sock)})
    assert shown.returncode == 0, shown.stderr
    assert "gemini" in shown.stdout and "googleSearch" in shown.stdout, shown.stdout


def test_tool_loop_guard_breaks_in_googles_shape(env):
    """The same call with the same result three times: the guard answers itself, as a Gemini 400."""
    call = {"functionCall": {"name": "Bash", "args": {"command": "ls"}}}
    result = {"functionResponse": {"name": "Bash", "response": {"output": "a"}}}
    contents = [{"role": "user", "parts": [{"text": "go"}]}]
    for _ in range(3):
        contents += [{"role": "model", "parts": [call]}, {"role": "user", "parts": [result]}]
    generations = env["local"].count("/v1/chat/completions")
    r = httpx.post(env["daemon"].url + "/v1beta/models/m:generateContent",
                   json={"contents": contents, "tools": [{"functionDeclarations": [{"name": "Bash"}]}]},
                   headers={"x-goog-api-key": KEY, "x-coderouter-profile": "guarded"}, timeout=20)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["status"] == "INVALID_ARGUMENT" and "Bash" in err["message"]
    assert env["local"].count("/v1/chat/completions") == generations  # never sent upstream


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_written_as_text_is_repaired(env, stream):
    env["local"].set_behaviour("text_tools;format=hermes;split=3")
    client = _client(env)
    config = types.GenerateContentConfig(tools=[BASH], automatic_function_calling=NO_AFC)
    if stream:
        chunks = list(client.models.generate_content_stream(model="m", contents="run it", config=config))
        calls = [fc for c in chunks for fc in c.function_calls or ()]
        text = "".join(c.text or "" for c in chunks)
    else:
        r = client.models.generate_content(model="m", contents="run it", config=config)
        calls, text = r.function_calls, r.text or ""
    assert [(c.name, c.args) for c in calls] == [("Bash", {"command": "echo repaired-ok"})]
    assert "<tool_call>" not in text


def test_body_limit_in_googles_shape(env):
    big = {"contents": [{"parts": [{"text": "x" * (1_100_000)}]}]}
    r = httpx.post(env["daemon"].url + "/v1beta/models/m:generateContent", json=big,
                   headers={"x-goog-api-key": KEY}, timeout=20)
    assert r.status_code == 413 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "1 MB" in r.json()["error"]["message"]


def test_keep_alive_while_the_upstream_is_silent(env):
    """Past the stream hold, blank lines keep the stream alive (a `: ping` comment would break both SDKs)."""
    env["local"].set_behaviour("slow_first_byte;delay=1.2")
    url = env["daemon"].url + f"/v1beta/models/m:streamGenerateContent?alt=sse&key={KEY}"
    with httpx.stream("POST", url, json={"contents": [{"parts": [{"text": "hi"}]}]}, timeout=20) as r:
        raw = b"".join(r.iter_raw())
    head, _, rest = raw.partition(b"data: ")
    assert head and set(head) == {ord("\n")}, raw[:80]  # pings came first, and only blank lines
    env["local"].set_behaviour("slow_first_byte;delay=1.2")
    chunks = list(_client(env).models.generate_content_stream(model="m", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello from local"


PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d4944415478da63f8cf"
                    "c0f01f0005000201a5f9d0d70000000049454e44ae426082")


@pytest.mark.parametrize("profile", ["default", "cloud", "blind"])
def test_images_follow_the_same_rules(env, profile):
    """inlineData images reach an image-taking upstream as its own image part, and become a text note for a
    provider with capabilities.vision = false (as on every ingress)."""
    contents = [types.Content(role="user", parts=[types.Part(text="what is this?"),
                                                  types.Part(inline_data=types.Blob(mime_type="image/png",
                                                                                    data=PNG))])]
    r = _client(env, profile).models.generate_content(model="m", contents=contents)
    assert r.text
    up = _fake(env, profile).requests[-1]["json"]
    content = up["messages"][0]["content"]
    if profile == "default":
        assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    elif profile == "cloud":
        assert content[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                          "data": content[1]["source"]["data"]}}
    else:
        assert content[1] == {"type": "text", "text": "[image omitted: blind does not accept images]"}
