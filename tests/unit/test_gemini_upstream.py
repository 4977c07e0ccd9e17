"""A Gemini upstream's pieces on their own: the config kind, the adapter (URLs, key header, model ids), Google's
errors in the router's failure classes, the chat <-> Gemini translators and the server kind's context window."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from pydantic import ValidationError

from coderouterd.config.schema import ProviderConfig
from coderouterd.providers.adapters import adapter_for
from coderouterd.providers.adapters.gemini import gemini_http_error
from coderouterd.providers.errors import OVERFLOW, UpstreamError
from coderouterd.providers.gemini_upstream import (
    AnthropicToGemini,
    GeminiPassthrough,
    OpenAIToGemini,
    ResponsesToGemini,
)
from coderouterd.servers import by_name
from coderouterd.servers.gemini import method_path
from coderouterd.translate.chat_request_to_gemini import SKIP_SIGNATURE, CallSignatures, chat_to_gemini
from coderouterd.translate.gemini_answer_to_chat import (
    GeminiStreamToChat,
    gemini_response_to_chat,
    usage_as_anthropic,
)
from coderouterd.translate.gemini_request import GeminiRequest


def _error(status: int, code: str, message: str, *, details: list | None = None,
           headers: dict | None = None):
    err: dict = {"code": status, "message": message, "status": code}
    if details:
        err["details"] = details
    return gemini_http_error(status, orjson.dumps({"error": err}), headers or {})


# -- config and adapter ------------------------------------------------------------------------------------------


def test_kind_gemini_defaults_to_googles_address_and_wants_a_key_there():
    cfg = ProviderConfig(kind="gemini", api_key_env="GEMINI_API_KEY")
    assert cfg.base_url == "https://generativelanguage.googleapis.com"
    assert not cfg.is_local()
    with pytest.raises(ValidationError, match="api_key_env"):
        ProviderConfig(kind="gemini")
    assert ProviderConfig(kind="gemini", base_url="http://127.0.0.1:9").is_local()  # a local stand-in needs none
    with pytest.raises(ValidationError):
        ProviderConfig(kind="openai")  # other kinds still need their base_url


def test_adapter_urls_key_header_and_model_names(monkeypatch):
    monkeypatch.setenv("GEMINI_TEST_KEY", "AIza-x")
    for base in ("https://g.example", "https://g.example/v1beta"):
        a = adapter_for(ProviderConfig(kind="gemini", base_url=base, api_key_env="GEMINI_TEST_KEY"))
        assert a.api_base == "https://g.example" and a.wire == "gemini"
        assert a.models_url == "https://g.example/v1beta/models?pageSize=1000"
        assert a.headers(json=True) == {"content-type": "application/json", "x-goog-api-key": "AIza-x"}
    assert a.model_ids({"models": [{"name": "models/gemini-2.5-pro"}, {"name": "models/gemini-3-flash"}]}) == \
        ["gemini-2.5-pro", "gemini-3-flash"]
    url, body = a.ping_request("gemini-2.5-flash")
    assert url == "https://g.example/v1beta/models/gemini-2.5-flash:generateContent"
    assert body["generationConfig"] == {"maxOutputTokens": 1}
    assert issubclass(a.strategy_for("gemini"), GeminiPassthrough)
    assert issubclass(a.strategy_for("anthropic"), AnthropicToGemini)
    assert issubclass(a.strategy_for("openai"), OpenAIToGemini)
    assert issubclass(a.strategy_for("responses"), ResponsesToGemini)
    # One memory of call signatures per provider, shared by its strategies; another provider has its own.
    assert a.strategy_for("openai").call_signatures is a.strategy_for("anthropic").call_signatures is not None
    other = adapter_for(ProviderConfig(kind="gemini", base_url="https://g.example", api_key_env="GEMINI_TEST_KEY"))
    assert other.strategy_for("openai").call_signatures is not a.strategy_for("openai").call_signatures


def test_method_paths():
    assert method_path("gemini-2.5-flash", False) == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert method_path("models/gemini-2.5-flash", True) == \
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert method_path("a/b?c", False) == "/v1beta/models/a%2Fb%3Fc:generateContent"  # a name stays one segment


# -- errors ------------------------------------------------------------------------------------------------------


def test_resource_exhausted_is_a_rate_limit_with_googles_wait():
    e = _error(429, "RESOURCE_EXHAUSTED", "quota", details=[
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "22s"}])
    assert e.status == 429 and e.retry_after == 22.0 and e.failover and e.counts_against_provider
    assert not e.caused_by_request
    fractional = _error(429, "RESOURCE_EXHAUSTED", "q", details=[
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}])
    assert fractional.retry_after == 1.5
    header = _error(429, "RESOURCE_EXHAUSTED", "q", headers={"retry-after": "3"}, details=[
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "22s"}])
    assert header.retry_after == 3.0  # a header, when there is one, is the wait
    absurd = _error(429, "RESOURCE_EXHAUSTED", "q", details=[
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "99999999s"}])
    assert absurd.retry_after == 3600.0  # untrusted input: capped like Retry-After


@pytest.mark.parametrize(("status", "code"), [(500, "INTERNAL"), (503, "UNAVAILABLE"), (504, "DEADLINE_EXCEEDED")])
def test_server_errors_fail_over_and_count(status, code):
    e = _error(status, code, "The model is overloaded. Please try again later.")
    assert e.failover and e.counts_against_provider and not e.caused_by_request
    assert e.message == "The model is overloaded. Please try again later."


def test_invalid_argument_is_the_requests_fault():
    e = _error(400, "INVALID_ARGUMENT", "Function call is missing a thought_signature in functionCall parts.")
    assert e.caused_by_request and not e.failover and not e.counts_against_provider
    assert "thought_signature" in e.message


def test_input_token_count_error_is_an_overflow_with_its_numbers():
    e = _error(400, "INVALID_ARGUMENT",
               "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).")
    assert e.reason == OVERFLOW and e.overflow == (1196265, 1048575)


def test_auth_errors_fail_over_without_counting_as_a_fault():
    e = _error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers")
    assert e.auth_failure and e.failover


def test_a_wrong_key_and_an_account_precondition_are_the_providers_not_the_requests():
    # Google answers a wrong API key with a 400 INVALID_ARGUMENT (ErrorInfo reason API_KEY_INVALID), and an account
    # it will not serve (free tier not in this region, billing off) with a 400 FAILED_PRECONDITION. Neither is the
    # client's request: passed on as its 400, the client would be told its request is wrong and no other provider
    # would be tried.
    bad_key = _error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", details=[
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
         "domain": "googleapis.com"}])
    assert bad_key.auth_failure and bad_key.failover and not bad_key.caused_by_request
    region = _error(400, "FAILED_PRECONDITION", "User location is not supported for the API use.")
    assert region.failover and not region.caused_by_request
    assert "location" in region.message


# -- chat -> Gemini ----------------------------------------------------------------------------------------------


def test_chat_request_as_gemini():
    chat = {"model": "m", "max_tokens": 100, "temperature": 0.3, "top_p": 0.9, "stop": ["END"],
            "messages": [
                {"role": "system", "content": "sys one"}, {"role": "developer", "content": "sys two"},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]},
                {"role": "assistant", "content": "calling", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd":"ls"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "Read", "arguments": '{"p":"a"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a b"},
                {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "file"}]},
                {"role": "user", "content": "next"}],
            "tools": [{"type": "function", "function": {"name": "Bash", "description": "run",
                                                        "parameters": {"type": "object"}}},
                      {"type": "function", "function": {"name": "Read"}}],
            "tool_choice": {"type": "function", "function": {"name": "Bash"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            "reasoning_effort": "medium"}
    g = chat_to_gemini(chat)
    assert g["systemInstruction"] == {"parts": [{"text": "sys one\n\nsys two"}]}
    assert g["contents"] == [
        {"role": "user", "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "AAA"}}]},
        {"role": "model", "parts": [
            {"text": "calling"},
            {"functionCall": {"name": "Bash", "args": {"cmd": "ls"}, "id": "c1"}, "thoughtSignature": SKIP_SIGNATURE},
            {"functionCall": {"name": "Read", "args": {"p": "a"}, "id": "c2"}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "Bash", "response": {"output": "a b"}, "id": "c1"}},
            {"functionResponse": {"name": "Read", "response": {"output": "file"}, "id": "c2"}},
            {"text": "next"}]}]
    assert g["tools"] == [{"functionDeclarations": [
        {"name": "Bash", "description": "run", "parametersJsonSchema": {"type": "object"}},
        {"name": "Read", "parametersJsonSchema": {"type": "object", "properties": {}}}]}]
    assert g["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["Bash"]}}
    assert g["generationConfig"] == {"maxOutputTokens": 100, "temperature": 0.3, "topP": 0.9,
                                     "stopSequences": ["END"], "responseMimeType": "application/json",
                                     "responseJsonSchema": {"type": "object"},
                                     "thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True}}
    assert "model" not in g


def test_remembered_signatures_go_back_with_their_calls():
    memory = CallSignatures(size=2)
    tr = GeminiStreamToChat("m", memory)
    tr.feed(_resp([{"functionCall": {"name": "f", "id": "g1", "args": {}}, "thoughtSignature": "c2lnMQ=="},
                   {"functionCall": {"name": "f", "id": "g2", "args": {}}}], "STOP"))
    assert memory.get("g1") == "c2lnMQ==" and memory.get("g2") is None

    def turn(*ids: str) -> list[dict]:
        chat = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]}]}
        return chat_to_gemini(chat, memory)["contents"][1]["parts"]

    assert [p.get("thoughtSignature") for p in turn("g1", "g2")] == ["c2lnMQ==", None]
    assert [p.get("thoughtSignature") for p in turn("x1", "g1")] == [SKIP_SIGNATURE, "c2lnMQ=="]
    memory.remember("a", "1")
    memory.remember("b", "2")
    assert memory.get("g1") is None and memory.get("b") == "2"  # bounded: the oldest goes first


@pytest.mark.parametrize(("choice", "mode"), [("auto", "AUTO"), ("none", "NONE"), ("required", "ANY"), (None, "AUTO")])
def test_tool_choice_modes(choice, mode):
    chat = {"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    if choice is not None:
        chat["tool_choice"] = choice
    assert chat_to_gemini(chat)["toolConfig"] == {"functionCallingConfig": {"mode": mode}}


def test_images_by_reference_name_their_type():
    g = chat_to_gemini({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x.example/a.PNG?sig=1"}},
        {"type": "image_url", "image_url": "https://x.example/photo"}]}]})
    assert g["contents"][0]["parts"] == [
        {"fileData": {"mimeType": "image/png", "fileUri": "https://x.example/a.PNG?sig=1"}},
        {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://x.example/photo"}}]


def test_thinking_off_is_a_zero_budget():
    g = chat_to_gemini({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "none"})
    assert g["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0, "includeThoughts": False}


def test_thinking_effort_is_what_each_gemini_model_takes():
    """Google's thinking guide: 2.5 Pro cannot turn thinking off (a budget of 0 is refused; 128 is its least);
    Gemini 3 takes a level, not a budget (both is a 400), Pro "low"/"high", Flash also "minimal"/"medium"."""
    def cfg(effort: str, model: str) -> dict:
        chat = {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": effort}
        return chat_to_gemini(chat, model=model)["generationConfig"]["thinkingConfig"]

    assert cfg("none", "gemini-2.5-flash") == {"thinkingBudget": 0, "includeThoughts": False}
    assert cfg("none", "gemini-2.5-pro") == {"thinkingBudget": 128, "includeThoughts": False}
    assert cfg("high", "models/gemini-2.5-pro") == {"thinkingBudget": 24576, "includeThoughts": True}
    assert cfg("none", "gemini-3-pro-preview") == {"thinkingLevel": "low", "includeThoughts": False}
    assert cfg("medium", "gemini-3-pro-preview") == {"thinkingLevel": "high", "includeThoughts": True}
    assert cfg("none", "gemini-3-flash-preview") == {"thinkingLevel": "minimal", "includeThoughts": False}
    assert cfg("medium", "models/gemini-3-flash") == {"thinkingLevel": "medium", "includeThoughts": True}
    for effort in ("none", "minimal", "low", "medium", "high"):
        assert "thinkingBudget" not in cfg(effort, "gemini-3.1-pro")
    # Without a model named (the body's own is read when it has one): the 2.5 tiers.
    body = {"model": "gemini-3-pro", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"}
    assert chat_to_gemini(body)["generationConfig"]["thinkingConfig"]["thinkingLevel"] == "low"


# -- Gemini -> chat ----------------------------------------------------------------------------------------------


def _resp(parts: list, finish: str | None = None, usage: dict | None = None) -> dict:
    cand: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    out: dict = {"candidates": [cand], "modelVersion": "gemini-x"}
    if usage:
        out["usageMetadata"] = usage
    return out


USAGE = {"promptTokenCount": 100, "cachedContentTokenCount": 40, "candidatesTokenCount": 7,
         "thoughtsTokenCount": 5, "totalTokenCount": 112}


def test_whole_response_as_chat_completion():
    c = gemini_response_to_chat(_resp([{"text": "hmm", "thought": True}, {"text": "Hi "}, {"text": "there"},
                                       {"functionCall": {"name": "Bash", "args": {"c": 1}}, "thoughtSignature": "s"}],
                                      "STOP", USAGE), "asked")
    msg = c["choices"][0]["message"]
    assert msg["content"] == "Hi there" and msg["reasoning_content"] == "hmm" and c["model"] == "asked"
    assert msg["tool_calls"][0]["function"] == {"name": "Bash", "arguments": '{"c":1}'}
    assert msg["tool_calls"][0]["id"].startswith("call_")
    assert c["choices"][0]["finish_reason"] == "tool_calls"
    assert c["usage"] == {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112,
                          "prompt_tokens_details": {"cached_tokens": 40},
                          "completion_tokens_details": {"reasoning_tokens": 5}}


@pytest.mark.parametrize(("reason", "chat"), [("STOP", "stop"), ("MAX_TOKENS", "length"), ("SAFETY", "content_filter"),
                                              ("RECITATION", "content_filter"), ("OTHER", "stop")])
def test_finish_reasons(reason, chat):
    assert gemini_response_to_chat(_resp([{"text": "x"}], reason), "m")["choices"][0]["finish_reason"] == chat


def test_stream_as_chat_chunks():
    tr = GeminiStreamToChat("asked")
    chunks = tr.feed(_resp([{"text": "Hel"}], usage={"promptTokenCount": 10, "totalTokenCount": 10}))
    chunks += tr.feed(_resp([{"text": "lo"}]))
    chunks += tr.feed(_resp([{"functionCall": {"name": "f", "id": "g1", "args": {}}}], "STOP",
                            {"promptTokenCount": 10, "candidatesTokenCount": 3, "totalTokenCount": 13}))
    assert tr.finish_reason == "STOP" and tr.started_content
    chunks += tr.finish()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert chunks[1]["choices"][0]["delta"] == {"content": "lo"}
    assert chunks[2]["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "g1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-1]["usage"]["prompt_tokens"] == 10
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and all(c["model"] == "asked" for c in chunks)


def test_blocked_prompt_finishes_as_a_content_filter():
    tr = GeminiStreamToChat("m")
    assert tr.feed({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}) == []
    assert tr.finish()[0]["choices"][0]["finish_reason"] == "content_filter"


def test_usage_in_the_journals_shape():
    assert usage_as_anthropic(USAGE) == {"input_tokens": 60, "output_tokens": 12, "cache_creation_input_tokens": 0,
                                         "cache_read_input_tokens": 40}
    assert usage_as_anthropic(None) == {}


# -- server kind -------------------------------------------------------------------------------------------------


def test_context_window_from_models_get():
    kind = by_name("gemini")
    asked: list[str] = []

    async def get(path: str):
        asked.append(path)
        return 200, {"name": "models/gemini-2.5-pro", "inputTokenLimit": 1048576, "outputTokenLimit": 65536}

    w = asyncio.run(kind.window(get, "gemini-2.5-pro", {}))
    assert w.tokens == 1048576 and w.firm and asked == ["/v1beta/models/gemini-2.5-pro"]
    assert asyncio.run(kind.window(get, "", {})).tokens is None  # clients choose the model: no one window
    assert kind.cached_tokens == "usageMetadata.cachedContentTokenCount"


# -- the pass-through --------------------------------------------------------------------------------------------


def _passthrough(answer_model: str = "asked") -> GeminiPassthrough:
    rq = GeminiRequest(body={"contents": []}, chat={}, model="asked", stream=True, sse=True, response_id="r",
                       raw=b'{"contents":[],"x_unknown":{"kept":true}}')
    return GeminiPassthrough(native=rq, model="real", skip_prologue=False, client_body={}, answer_model=answer_model)


def test_pass_through_relays_bytes_renaming_only_the_model():
    st = _passthrough()
    assert st.request(b"ignored", True) == b'{"contents":[],"x_unknown":{"kept":true}}'
    assert st.url_path(True) == "/v1beta/models/real:streamGenerateContent?alt=sse"
    first = ('{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"f","args":{"a":1}},'
             '"thoughtSignature":"c2ln","futureField":1}]},"index":0}],"modelVersion":"real",'
             '"usageMetadata":{"promptTokenCount":9,"cachedContentTokenCount":4,"candidatesTokenCount":2,'
             '"thoughtsTokenCount":3,"totalTokenCount":14}}')
    last = '{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP"}]}'
    out = st.events([(None, first)]) + st.events([(None, last)])
    assert out == (b"data: " + first.replace('"modelVersion":"real"', '"modelVersion":"asked"').encode() +
                   b"\r\n\r\ndata: " + last.encode() + b"\r\n\r\n")
    assert st.eof() == b"" and st.done
    assert st.usage == {"input_tokens": 5, "output_tokens": 5, "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 4}


def test_pass_through_signs_only_calls_that_carry_no_signature():
    """A model turn whose first function call has no thoughtSignature (made by another upstream, relayed to the
    client unsigned) gets Google's placeholder for calls made elsewhere; a signed one goes up as it came."""
    signed = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "c2ln"}]}
    unsigned = {"role": "model", "parts": [{"text": "let me look"}, {"functionCall": {"name": "g", "args": {}}},
                                           {"functionCall": {"name": "h", "args": {}}}]}
    answer = {"role": "user", "parts": [{"functionResponse": {"name": "g", "response": {"output": "x"}}}]}
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}, signed, answer, unsigned, answer]}
    raw = orjson.dumps(body)
    rq = GeminiRequest(body=body, chat={}, model="m", stream=False, sse=False, response_id="r", raw=raw)
    st = GeminiPassthrough(native=rq, model="m", skip_prologue=False, client_body={}, answer_model="m")
    sent = orjson.loads(st.request(b"", False))
    assert sent["contents"][1] == signed
    assert sent["contents"][3]["parts"][1]["thoughtSignature"] == SKIP_SIGNATURE
    assert "thoughtSignature" not in sent["contents"][3]["parts"][2]  # only the first call of a step is signed
    assert "thoughtSignature" not in body["contents"][3]["parts"][1]  # the client's body itself is not changed
    whole = {"contents": [body["contents"][0], signed, answer]}
    rq_signed = GeminiRequest(body=whole, chat={}, model="m", stream=False, sse=False, response_id="r",
                              raw=orjson.dumps(whole))
    assert GeminiPassthrough(native=rq_signed, model="m", skip_prologue=False, client_body={},
                             answer_model="m").request(b"", False) == orjson.dumps(whole)  # relayed as its bytes


def test_pass_through_holds_empty_responses_and_fails_on_an_error_event():
    st = _passthrough()
    empty = '{"candidates":[{"content":{"role":"model","parts":[{"text":""}]}}],"usageMetadata":{"promptTokenCount":1}}'
    assert st.events([(None, empty)]) == b"" and not st.started_content  # nothing said yet: may still fail over
    with pytest.raises(UpstreamError) as e:
        st.events([(None, '{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}')])
    assert not e.value.after_content and e.value.failover and "overloaded" in e.value.message
    cut = _passthrough()
    cut.events([(None, '{"candidates":[{"content":{"role":"model","parts":[{"text":"Hi"}]}}]}')])
    with pytest.raises(UpstreamError) as e:
        cut.eof()  # the body ended without a finishReason
    assert e.value.after_content


def test_pass_through_refuses_what_is_no_response():
    for data in ('{"candidates":"x"}', '[]', '{"something":"else"}'):
        with pytest.raises(UpstreamError):
            _passthrough().events([(None, data)])


def test_a_tool_call_repaired_from_text_finishes_the_chat_stream_as_tool_calls():
    """A local model behind the Gemini wire that writes its call as text: the repaired call's stream ends with
    finish_reason tool_calls (chat clients run tools on it), as on every other upstream wire."""
    from coderouterd.providers.gemini_upstream import OpenAIToGemini
    from coderouterd.translate.tool_repair import repair_tools_for

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {
                "type": "object", "required": ["command"], "properties": {"command": {"type": "string"}}}}}]}
    tools = repair_tools_for(ProviderConfig(kind="gemini", base_url="http://127.0.0.1:1"), body)
    assert tools is not None
    st = OpenAIToGemini(model="m", skip_prologue=False, client_body=body, answer_model="m", repair_tools=tools)
    text = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    out = st.events([(None, orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                                          "finishReason": "STOP"}]}).decode())]) + st.eof()
    chunks = [orjson.loads(line[len(b"data: "):]) for line in out.split(b"\n\n")
              if line.startswith(b"data: {")]
    calls = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls") or ()]
    assert [tc["function"]["name"] for tc in calls] == ["Bash"]
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["tool_calls"]


def test_a_null_max_completion_tokens_leaves_max_tokens_as_the_limit():
    # OpenAI SDK users and guards (default_max_tokens) may leave max_completion_tokens present but null.
    body = chat_to_gemini({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": None,
                           "max_tokens": 77})
    assert body["generationConfig"]["maxOutputTokens"] == 77
