"""The Gemini API ingress's translations, both ways: a Gemini request as the chat body the router works on, and
chat answers (whole and streamed) as Gemini responses; plus its validation, field names and stream framing."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from coderouterd.ingress.gemini import GeminiResponder, error_body, model_path
from coderouterd.ingress.validate_gemini import validate_gemini
from coderouterd.translate.gemini_answer import ChatStreamToGemini, chat_completion_to_gemini
from coderouterd.translate.gemini_request import (
    JSON_TOOL,
    GeminiRequestError,
    camel_keys,
    gemini_schema,
    translate_request,
)


def tr(body: dict, **kw):
    return translate_request(body, kw.pop("model", "m"), stream=kw.pop("stream", False), sse=True)


def user(*parts: dict) -> dict:
    return {"role": "user", "parts": list(parts)}


def model(*parts: dict) -> dict:
    return {"role": "model", "parts": list(parts)}


# -- request ----------------------------------------------------------------------------------------------------

def test_text_system_and_generation_config():
    rq = tr({"systemInstruction": {"parts": [{"text": "be "}, {"text": "brief"}]},
             "contents": [user({"text": "hi"}, {"text": " there"})],
             "generationConfig": {"maxOutputTokens": 100, "temperature": 0.5, "topP": 0.9, "topK": 40,
                                  "stopSequences": ["END"], "candidateCount": 1, "seed": 7}}, stream=True)
    assert rq.chat == {"model": "m", "stream": True, "max_tokens": 100, "temperature": 0.5, "top_p": 0.9,
                       "stop": ["END"], "seed": 7,
                       "messages": [{"role": "system", "content": "be \nbrief"},
                                    {"role": "user", "content": "hi there"}]}


def test_candidate_count_above_one_is_refused():
    with pytest.raises(GeminiRequestError) as e:
        tr({"contents": [user({"text": "hi"})], "generationConfig": {"candidateCount": 2}})
    assert e.value.param == "generationConfig.candidateCount" and "only 1" in e.value.message


def test_images_and_other_media():
    rq = tr({"contents": [user({"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
                               {"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}},
                               {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://x/a.jpg"}})]})
    content = rq.chat["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "look"}
    assert content[1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
    assert content[2]["type"] == "text" and "application/pdf" in content[2]["text"]  # a note, not a refusal
    assert content[3] == {"type": "image_url", "image_url": {"url": "https://x/a.jpg"}}


def test_function_calls_and_responses_paired_in_order():
    """Responses without ids answer the calls of the turn before: by name, else in order."""
    rq = tr({"contents": [
        user({"text": "go"}),
        model({"text": "thinking it over", "thought": True, "thoughtSignature": "c2ln"}, {"text": "I'll look."},
              {"functionCall": {"name": "read_file", "args": {"file_path": "a"}}},
              {"functionCall": {"name": "ls", "args": {}}}),
        user({"functionResponse": {"name": "ls", "response": {"output": "a b"}}},
             {"functionResponse": {"name": "read_file", "response": {"error": "no such file"}}},
             {"text": "and now?"}),
    ]})
    m = rq.chat["messages"]
    assert m[1]["role"] == "assistant" and m[1]["content"] == "I'll look."
    assert m[1]["reasoning_content"] == "thinking it over"
    ids = [c["id"] for c in m[1]["tool_calls"]]
    assert [c["function"] for c in m[1]["tool_calls"]] == [
        {"name": "read_file", "arguments": '{"file_path":"a"}'}, {"name": "ls", "arguments": "{}"}]
    assert len(set(ids)) == 2
    assert m[2] == {"role": "tool", "tool_call_id": ids[1], "content": "a b"}
    assert m[3] == {"role": "tool", "tool_call_id": ids[0], "content": "Error: no such file"}
    assert m[4] == {"role": "user", "content": "and now?"}
    # The same history gives the same ids on the next turn (prefix caches keep matching).
    assert [c["id"] for c in tr(rq.body).chat["messages"][1]["tool_calls"]] == ids


def test_function_response_ids_are_used_when_given():
    rq = tr({"contents": [user({"text": "go"}), model({"functionCall": {"name": "ls", "args": {}, "id": "c1"}}),
                          user({"functionResponse": {"name": "ls", "id": "c1", "response": {"x": 1}}})]})
    assert rq.chat["messages"][1]["tool_calls"][0]["id"] == "c1"
    assert rq.chat["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": '{"x":1}'}


def test_function_response_with_no_call_is_refused():
    with pytest.raises(GeminiRequestError):
        tr({"contents": [user({"functionResponse": {"name": "ls", "response": {}}})]})


def test_gemini_schema_to_json_schema():
    schema = {"type": "OBJECT", "propertyOrdering": ["a"], "required": ["a"],
              "properties": {"a": {"type": "STRING", "enum": ["x", "y"], "nullable": True},
                             "b": {"type": "ARRAY", "minItems": "1", "items": {"type": "INTEGER", "format": "int32"}},
                             "c": {"anyOf": [{"type": "NUMBER"}, {"type": "BOOLEAN"}], "example": 3}}}
    assert gemini_schema(schema) == {
        "type": "object", "required": ["a"],
        "properties": {"a": {"type": ["string", "null"], "enum": ["x", "y"]},
                       "b": {"type": "array", "minItems": 1, "items": {"type": "integer", "format": "int32"}},
                       "c": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}}}


def test_tools_tool_config_and_names():
    decls = [{"name": "Bash", "description": "run", "parameters": {"type": "OBJECT", "properties": {}}},
             {"name": "mcp.server:search", "parametersJsonSchema": {"type": "object", "properties": {"q": {}}}},
             {"name": "noargs"}]
    body = {"contents": [user({"text": "x"})], "tools": [{"functionDeclarations": decls}, {"googleSearch": {}}]}
    rq = tr(body)
    tools = rq.chat["tools"]
    assert tools[0]["function"] == {"name": "Bash", "description": "run",
                                    "parameters": {"type": "object", "properties": {}}}
    flat = tools[1]["function"]["name"]
    assert flat == "mcp_server_search" and rq.client_tool_name(flat) == "mcp.server:search"
    assert tools[1]["function"]["parameters"] == decls[1]["parametersJsonSchema"]
    assert tools[2]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert rq.chat["tool_choice"] == "auto" and rq.dropped_tools == ["googleSearch"]
    none = tr({**body, "toolConfig": {"functionCallingConfig": {"mode": "NONE"}}})
    assert none.chat["tool_choice"] == "none"
    anyof = tr({**body, "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}})
    assert anyof.chat["tool_choice"] == "required" and len(anyof.chat["tools"]) == 3
    one = tr({**body, "toolConfig": {"functionCallingConfig": {"mode": "ANY",
                                                               "allowedFunctionNames": ["mcp.server:search"]}}})
    assert one.chat["tool_choice"] == {"type": "function", "function": {"name": "mcp_server_search"}}
    assert [t["function"]["name"] for t in one.chat["tools"]] == ["mcp_server_search"]
    # The client's own name in its history goes up under the upstream's.
    hist = tr({**body, "contents": [user({"text": "x"}), model({"functionCall": {"name": "mcp.server:search"}}),
                                    user({"functionResponse": {"name": "mcp.server:search", "response": {}}})]})
    assert hist.chat["messages"][1]["tool_calls"][0]["function"]["name"] == "mcp_server_search"


def test_thinking_and_json_output():
    rq = tr({"contents": [user({"text": "x"})], "generationConfig": {
        "thinkingConfig": {"thinkingBudget": 0, "includeThoughts": True},
        "responseMimeType": "application/json", "responseSchema": {"type": "OBJECT",
                                                                  "properties": {"a": {"type": "STRING"}}}}})
    assert rq.chat["reasoning_effort"] == "none" and rq.include_thoughts
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert rq.json_schema == schema
    assert rq.chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    for budget, effort in ((512, "low"), (8192, "medium"), (24576, "high")):
        b = {"contents": [], "generationConfig": {"thinkingConfig": {"thinkingBudget": budget}}}
        assert tr(b).chat["reasoning_effort"] == effort
    assert "reasoning_effort" not in tr({"contents": [], "generationConfig": {
        "thinkingConfig": {"thinkingBudget": -1}}}).chat
    plain_json = tr({"contents": [], "generationConfig": {"responseMimeType": "application/json"}})
    assert plain_json.chat["response_format"] == {"type": "json_object"} and plain_json.json_schema is None


def test_upper_case_types_inside_json_schemas_are_lowered():
    """Gemini CLI's classifier writes Gemini's type names in responseJsonSchema; its tools may too."""
    schema = {"type": "OBJECT", "properties": {"score": {"type": "INTEGER", "description": "STRING"},
                                               "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
                                               "any": {"anyOf": [{"type": "NULL"}, {"type": "BOOLEAN"}]}},
              "required": ["score"]}
    body = {"contents": [], "tools": [{"functionDeclarations": [{"name": "f", "parametersJsonSchema": schema}]}],
            "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": schema}}
    rq = translate_request(body, "m", stream=False, sse=True, raw=orjson.dumps(body))
    lowered = {"type": "object", "properties": {"score": {"type": "integer", "description": "STRING"},
                                                "tags": {"type": "array", "items": {"type": "string"}},
                                                "any": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}},
               "required": ["score"]}
    assert rq.json_schema == lowered and rq.chat["tools"][0]["function"]["parameters"] == lowered
    plain = {"contents": [], "tools": [{"functionDeclarations": [{"name": "f", "parametersJsonSchema": {
        "type": "object"}}]}]}
    params = {"type": "object"}
    plain["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] = params
    out = translate_request(plain, "m", stream=False, sse=True, raw=orjson.dumps(plain))
    assert out.chat["tools"][0]["function"]["parameters"] is params  # nothing to lower: not copied


def test_snake_case_field_names_become_camel_but_data_keeps_its_keys():
    body = {"contents": [{"role": "user", "parts": [{"inline_data": {"mime_type": "image/png", "data": "x"}}]},
                         {"role": "model", "parts": [{"function_call": {"name": "f", "args": {"file_path": "a"}}}]}],
            "generation_config": {"thinking_config": {"include_thoughts": True},
                                  "response_json_schema": {"properties": {"snake_name": {}}}},
            "tools": [{"function_declarations": [{"name": "f", "parameters": {
                "type": "OBJECT", "properties": {"file_path": {"type": "STRING", "min_length": 1}}}}]}]}
    out = camel_keys(body, orjson.dumps(body))
    assert out["contents"][0]["parts"][0] == {"inlineData": {"mimeType": "image/png", "data": "x"}}
    assert out["contents"][1]["parts"][0]["functionCall"]["args"] == {"file_path": "a"}
    assert out["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}
    assert out["generationConfig"]["responseJsonSchema"] == {"properties": {"snake_name": {}}}
    props = out["tools"][0]["functionDeclarations"][0]["parameters"]["properties"]
    assert props == {"file_path": {"type": "STRING", "minLength": 1}}
    camel = {"contents": [{"parts": [{"text": "snake_case_here: x"}]}]}
    assert camel_keys(camel, orjson.dumps(camel)) is camel  # nothing to do: not walked


@pytest.mark.parametrize("body,where", [
    ([], "request body"),
    ({}, "contents"),
    ({"contents": [{"parts": "x"}]}, "contents[0].parts"),
    ({"contents": [{"role": "assistant", "parts": []}]}, "contents[0].role"),
    ({"contents": [{"parts": [{"inlineData": {"mimeType": "image/png"}}]}]}, "contents[0].parts[0].inlineData.data"),
    ({"contents": [{"parts": [{"functionResponse": {"name": "f", "parts": [7]}}]}]},
     "contents[0].parts[0].functionResponse.parts[0]"),
    ({"contents": [], "tools": [{"functionDeclarations": [{"name": ""}]}]}, "tools[0].functionDeclarations[0].name"),
    ({"contents": [], "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}},
     "toolConfig.functionCallingConfig.mode"),
    ({"contents": [], "generationConfig": {"thinkingConfig": {"thinkingBudget": "x"}}},
     "generationConfig.thinkingConfig.thinkingBudget"),
])
def test_validation_names_the_field(body, where):
    problem = validate_gemini(body, "m")
    assert problem is not None and problem.startswith(where), problem


def test_count_tokens_body_may_have_no_contents():
    assert validate_gemini({}, "m", count_tokens=True) is None


def test_model_path():
    assert model_path("/v1beta/models/qwen3:30b:generateContent").rpartition(":") == (
        "qwen3:30b", ":", "generateContent")
    assert model_path("/v1/models/Qwen/Qwen3-8B:streamGenerateContent").rpartition(":")[0] == "Qwen/Qwen3-8B"
    assert model_path("/v1beta/files") == ""


# -- answers ----------------------------------------------------------------------------------------------------

def _rq(**gen):
    return tr({"contents": [user({"text": "x"})], "generationConfig": gen}, model="gemini-x")


def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    c: dict = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if delta or finish else []}
    if usage:
        c["usage"] = usage
    return c


def test_whole_answer():
    rq = _rq(thinkingConfig={"includeThoughts": True})
    comp = {"choices": [{"message": {"role": "assistant", "content": "Done.", "reasoning_content": "hmm",
                                     "tool_calls": [{"id": "call_1", "type": "function", "function": {
                                         "name": "ls", "arguments": '{"path": "/"}'}}]},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 60}}}
    r = chat_completion_to_gemini(rq, comp, "gemini-x")
    cand = r["candidates"][0]
    assert cand["content"]["parts"] == [{"text": "hmm", "thought": True}, {"text": "Done."},
                                        {"functionCall": {"name": "ls", "args": {"path": "/"}, "id": "call_1"}}]
    assert cand["finishReason"] == "STOP" and r["modelVersion"] == "gemini-x"
    u = r["usageMetadata"]
    assert u["promptTokenCount"] == 100 and u["cachedContentTokenCount"] == 60
    assert u["thoughtsTokenCount"] + u["candidatesTokenCount"] == 20 and u["totalTokenCount"] == 120


@pytest.mark.parametrize("finish,expected", [("stop", "STOP"), ("length", "MAX_TOKENS"), ("tool_calls", "STOP"),
                                             ("content_filter", "SAFETY"), ("weird", "OTHER"), (None, "STOP")])
def test_finish_reasons(finish, expected):
    comp = {"choices": [{"message": {"content": "x"}, "finish_reason": finish}]}
    assert chat_completion_to_gemini(_rq(), comp, "m")["candidates"][0]["finishReason"] == expected


def test_stream_buffers_tool_arguments_until_the_call_is_whole():
    t = ChatStreamToGemini(_rq(), "gemini-x")
    out = t.feed(_chunk({"content": "Let me "}))
    out += t.feed(_chunk({"content": "look."}))
    out += t.feed(_chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "read", "arguments": ""}}]}))
    for frag in ('{"pa', 'th": "a\\"b', '"}'):
        out += t.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": frag}}]}))
    assert len(out) == 2  # nothing of the call went out before it was whole
    out += t.feed(_chunk(finish="tool_calls"))
    out += t.feed(_chunk(usage={"prompt_tokens": 50, "completion_tokens": 9,
                                "prompt_tokens_details": {"cached_tokens": 32}}))
    out += t.finish()
    texts = [r["candidates"][0]["content"]["parts"] for r in out]
    assert texts[:2] == [[{"text": "Let me "}], [{"text": "look."}]]
    last = out[-1]["candidates"][0]
    assert last["content"]["parts"] == [{"functionCall": {"name": "read", "args": {"path": 'a"b'}, "id": "call_a"}}]
    assert last["finishReason"] == "STOP"
    assert all("finishReason" not in r["candidates"][0] for r in out[:-1])
    assert out[-1]["usageMetadata"] == {"promptTokenCount": 50, "candidatesTokenCount": 9, "totalTokenCount": 59,
                                        "cachedContentTokenCount": 32}
    counts = [r["usageMetadata"]["candidatesTokenCount"] for r in out]
    assert counts == sorted(counts)  # cumulative


def test_stream_thoughts_only_when_asked_and_think_tags():
    hidden = ChatStreamToGemini(_rq(), "m")
    out = hidden.feed(_chunk({"reasoning_content": "hmm"})) + hidden.feed(_chunk({"content": "<think>inner</think>Hi"}))
    out += hidden.finish()
    assert [p for r in out for p in r["candidates"][0]["content"]["parts"]] == [{"text": "Hi"}, {"text": ""}]
    assert out[-1]["usageMetadata"]["thoughtsTokenCount"] > 0
    shown = ChatStreamToGemini(_rq(thinkingConfig={"includeThoughts": True}), "m")
    out = shown.feed(_chunk({"reasoning_content": "hmm"})) + shown.feed(_chunk({"content": "Hi"})) + shown.finish()
    assert out[0]["candidates"][0]["content"]["parts"] == [{"text": "hmm", "thought": True}]


def test_forced_json_tool_comes_back_as_text():
    rq = _rq(responseMimeType="application/json", responseJsonSchema={"type": "object"})
    t = ChatStreamToGemini(rq, "m")
    t.feed(_chunk({"tool_calls": [{"index": 0, "id": "t", "function": {"name": JSON_TOOL, "arguments": '{"a":'}}]}))
    t.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}, finish="tool_calls"))
    assert t.finish()[-1]["candidates"][0]["content"]["parts"] == [{"text": '{"a": 1}'}]
    wrapped = _rq(responseMimeType="application/json", responseJsonSchema={"type": "array"})
    comp = {"choices": [{"message": {"tool_calls": [{"id": "t", "function": {
        "name": JSON_TOOL, "arguments": '{"value": [1, 2]}'}}]}, "finish_reason": "tool_calls"}]}
    assert chat_completion_to_gemini(wrapped, comp, "m")["candidates"][0]["content"]["parts"] == [{"text": "[1,2]"}]


# -- the responder ----------------------------------------------------------------------------------------------

class _Sent:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def __call__(self, message: dict) -> None:
        self.messages.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    @property
    def headers(self) -> dict:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}


def _events(*objs: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\r\n\r\n" for o in objs)


def test_array_stream_framing_across_batches_and_pings():
    sent = _Sent()
    r = GeminiResponder(sent, "req_1", sse=False)

    async def run() -> None:
        await r.start_stream({})
        await r.ping()
        await r.event(_events({"a": 1}, {"a": 2}))
        await r.event(_events({"a": 3}))
        await r.finish()

    asyncio.run(run())
    assert sent.headers["content-type"].startswith("application/json")
    assert orjson.loads(sent.body) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_array_stream_ends_with_the_error_as_last_element():
    sent = _Sent()
    r = GeminiResponder(sent, "req_1", sse=False)

    async def run() -> None:
        await r.start_stream({})
        await r.event(_events({"a": 1}))
        await r.error(503, "upstream went away", kind="overloaded_error")

    asyncio.run(run())
    assert orjson.loads(sent.body) == [{"a": 1}, error_body(503, "upstream went away")]


def test_sse_stream_error_is_a_bare_error_object():
    sent = _Sent()
    r = GeminiResponder(sent, "req_1", sse=True)

    async def run() -> None:
        await r.start_stream({})
        await r.event(_events({"a": 1}))
        await r.stream_error("api_error", "boom")

    asyncio.run(run())
    assert sent.headers["content-type"] == "text/event-stream"
    head, _, tail = sent.body.partition(b"\r\n\r\n")
    assert head == b'data: {"a":1}'
    assert orjson.loads(tail) == {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}


@pytest.mark.parametrize("status,name,code", [(400, "INVALID_ARGUMENT", 400), (401, "UNAUTHENTICATED", 401),
                                              (404, "NOT_FOUND", 404), (429, "RESOURCE_EXHAUSTED", 429),
                                              (500, "INTERNAL", 500), (501, "UNIMPLEMENTED", 501),
                                              (503, "UNAVAILABLE", 503), (504, "DEADLINE_EXCEEDED", 504),
                                              (529, "UNAVAILABLE", 503)])
def test_error_statuses(status, name, code):
    sent = _Sent()
    # A reason that names no final refusal (budget_exceeded on a 400 is FAILED_PRECONDITION: docs/protocols.md).
    asyncio.run(GeminiResponder(sent, "req_1").error(status, "x", code="some_reason"))
    assert sent.messages[0]["status"] == code
    err = orjson.loads(sent.body)["error"]
    assert (err["code"], err["status"]) == (code, name)
    assert err["details"][0]["reason"] == "some_reason"
