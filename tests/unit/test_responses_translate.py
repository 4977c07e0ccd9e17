"""Responses API translation, table-driven: request → chat body, chat stream → Responses events, chat completion →
Responses object, validation, and the passthrough's encrypted-reasoning rule."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coderouterd.ingress.validate_responses import validate_responses
from coderouterd.providers.responses_strategies import own_reasoning_only
from coderouterd.translate.responses_objects import chat_completion_to_response
from coderouterd.translate.responses_request import ResponsesRequestError, translate_request
from coderouterd.translate.responses_stream import ChatStreamToResponses

DEV = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev rules"}]}
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
FN = {"type": "function", "name": "exec_command", "description": "run", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}
NS = {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
      "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]}


def chat(body: dict) -> dict:
    return translate_request({"model": "m", **body}).chat


# -- request translation ----------------------------------------------------------------------------------------

REQUEST_CASES = [
    ("string input", {"input": "hello"}, {"messages": [{"role": "user", "content": "hello"}]}),
    ("instructions and developer items go first, merged",
     {"instructions": "inst", "input": [USER, DEV]},
     {"messages": [{"role": "system", "content": "inst\n\ndev rules"}, {"role": "user", "content": "hi"}]}),
    ("system item", {"input": [{"type": "message", "role": "system", "content": "sys"}, USER]},
     {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}),
    ("message without type (easy input)", {"input": [{"role": "user", "content": "x"}]},
     {"messages": [{"role": "user", "content": "x"}]}),
    ("input_image becomes an image_url part",
     {"input": [{"type": "message", "role": "user", "content": [
         {"type": "input_text", "text": "see"},
         {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "low"}]}]},
     {"messages": [{"role": "user", "content": [
         {"type": "text", "text": "see"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "low"}}]}]}),
    ("assistant output_text",
     {"input": [USER, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]}]},
     {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ("text, reasoning and parallel calls of one turn merge into one assistant message; outputs become tool",
     {"input": [USER,
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "E"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "b"}, {"type": "input_text", "text": "c"}]}]},
     {"messages": [
         {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "ok", "reasoning_content": "plan", "tool_calls": [
             {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}},
             {"id": "c2", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
         {"role": "tool", "tool_call_id": "c2", "content": "bc"}]}),
    ("sampling and limits",
     {"input": "x", "max_output_tokens": 77, "temperature": 0.2, "top_p": 0.5, "reasoning": {"effort": "xhigh"},
      "prompt_cache_key": "s1"},
     {"max_tokens": 77, "temperature": 0.2, "top_p": 0.5, "reasoning_effort": "high", "prompt_cache_key": "s1"}),
    ("json_schema text format becomes response_format",
     {"input": "x", "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"},
                                        "strict": True}}},
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}}}),
    ("function tools, tool_choice and parallel_tool_calls",
     {"input": "x", "tools": [FN], "tool_choice": {"type": "function", "name": "exec_command"},
      "parallel_tool_calls": False},
     {"tools": [{"type": "function", "function": {"name": "exec_command", "description": "run",
                                                  "parameters": FN["parameters"]}}],
      "tool_choice": {"type": "function", "function": {"name": "exec_command"}}, "parallel_tool_calls": False}),
    ("hosted tools dropped", {"input": "x", "tools": [{"type": "web_search"}, {"type": "file_search"}]},
     {"messages": [{"role": "user", "content": "x"}]}),
]


@pytest.mark.parametrize("case,body,expected", REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_request_translation(case, body, expected):
    got = chat(body)
    for key, value in expected.items():
        assert got[key] == value, key
    if not body.get("tools") or all(t["type"] != "function" for t in body["tools"]):
        assert "tools" not in got


def test_hosted_tools_are_noted_for_the_trace():
    rq = translate_request({"model": "m", "input": "x", "tools": [FN, {"type": "web_search"}]})
    assert rq.dropped_tools == ["web_search"] and "web_search" in rq.notes[0]


def test_namespace_tools_flatten_and_round_trip():
    rq = translate_request({"model": "m", "input": [USER, {
        "type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1",
        "arguments": "{}"}], "tools": [FN, NS], "tool_choice": {"type": "function", "name": "spawn_agent",
                                                                 "namespace": "multi_agent_v1"}})
    flat = rq.chat["tools"][1]["function"]["name"]
    assert flat == "multi_agent_v1__spawn_agent"
    assert rq.client_tool_name(flat) == ("multi_agent_v1", "spawn_agent")
    assert rq.client_tool_name("exec_command") == (None, "exec_command")
    assert rq.chat["messages"][-1]["tool_calls"][0]["function"]["name"] == flat
    assert rq.chat["tool_choice"] == {"type": "function", "function": {"name": flat}}


def test_flattened_name_never_shadows_a_plain_function():
    plain = {**FN, "name": "multi_agent_v1__spawn_agent"}
    rq = translate_request({"model": "m", "input": "x", "tools": [plain, NS]})
    names = [t["function"]["name"] for t in rq.chat["tools"]]
    assert len(set(names)) == 2
    assert rq.client_tool_name(names[1]) == ("multi_agent_v1", "spawn_agent")
    assert rq.client_tool_name(names[0]) == (None, "multi_agent_v1__spawn_agent")


def test_previous_response_id_is_refused_naming_it():
    with pytest.raises(ResponsesRequestError) as e:
        translate_request({"model": "m", "input": "x", "previous_response_id": "resp_1"})
    assert e.value.param == "previous_response_id"


def test_session_key_is_the_prompt_cache_key():
    assert translate_request({"model": "m", "input": "x", "prompt_cache_key": "k"}).session_key == "k"
    assert translate_request({"model": "m", "input": "x"}).session_key is None


# -- validation -------------------------------------------------------------------------------------------------

VALIDATION_CASES = [
    ([], "request body"),
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": 3}, "input"),
    ({"model": "m", "input": [3]}, "input[0]"),
    ({"model": "m", "input": [{"type": "message", "role": "bot", "content": "x"}]}, "input[0].role"),
    ({"model": "m", "input": [{"type": "message", "role": "user", "content": 5}]}, "input[0].content"),
    ({"model": "m", "input": [{"type": "message", "role": "user", "content": [{"text": "x"}]}]},
     "input[0].content[0]"),
    ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "x", "tools": {}}, "tools"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "n"}]}, "tools[0].tools"),
    ({"model": "m", "input": "x", "instructions": 1}, "instructions"),
    # tool outputs as content parts are read like message content: same shapes, same 400s
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": 5}]}]}, "input[0].output[0].text"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": [3]}]},
     "input[0].output[0]"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": 7}]}, "input[0].output"),
    ({"model": "m", "input": [{"type": "custom_tool_call_output", "call_id": "c", "output": [
        {"type": "output_text", "text": {"a": 1}}]}]}, "input[0].output[0].text"),
    # arguments are parsed back into objects for an Anthropic upstream: their nesting is bounded
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                               "arguments": "[" * 5000 + "]" * 5000}]}, "input[0].arguments"),
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                               "arguments": '{"a":' * 300 + "1" + "}" * 300}]}, "input[0].arguments"),
]


@pytest.mark.parametrize("body,param", VALIDATION_CASES)
def test_validation_names_the_field(body, param):
    problem = validate_responses(body)
    assert problem is not None and problem.split(":")[0] == param


def test_deep_arguments_name_the_limit_and_shallow_ones_pass():
    from coderouterd.ingress.validate import MAX_DEPTH

    deep = {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                     "arguments": '{"a":' * 300 + "1" + "}" * 300}]}
    assert validate_responses(deep) == f"input[0].arguments: nested deeper than {MAX_DEPTH} levels"
    ok = {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                   "arguments": '{"a":' * 100 + "1" + "}" * 100}]}
    assert validate_responses(ok) is None


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                                                  max_size=3), max_leaves=8)
_PART = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "text", "input_image", "x"])},
                               optional={"text": _JSONISH, "image_url": _JSONISH, "detail": _JSONISH})
_OUTPUT_ITEM = st.fixed_dictionaries({
    "type": st.sampled_from(["function_call_output", "custom_tool_call_output"]), "call_id": st.just("c"),
    "output": st.one_of(_JSONISH, st.lists(st.one_of(_PART, _JSONISH), max_size=4))})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=_OUTPUT_ITEM)
def test_any_tool_output_is_a_400_or_translates(item):
    """Whatever a tool output holds: refused naming a field under input[0], or translated to a chat body that
    serialises and an Anthropic body that serialises (never an exception, which would be a 500)."""
    from coderouterd.translate.openai_request_to_anthropic import openai_request_to_anthropic

    body = {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                    item]}
    problem = validate_responses(body)
    if problem is not None:
        assert problem.startswith("input[1]"), problem
        return
    rq = translate_request(body)
    orjson.dumps(rq.chat)
    orjson.dumps(openai_request_to_anthropic(rq.chat, "m"))


def test_translation_survives_what_validation_would_refuse():
    """The translation is robust on its own (a caller that skips validation gets no exception)."""
    from coderouterd.translate.openai_request_to_anthropic import openai_request_to_anthropic

    rq = translate_request({"model": "m", "input": [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 5000 + "]" * 5000},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": 5},
                                                                    {"type": "input_text", "text": "ok"}]}]})
    assert rq.chat["messages"][-1]["content"] == "ok"
    anthropic = openai_request_to_anthropic(rq.chat, "m")
    orjson.dumps(anthropic)
    assert anthropic["messages"][0]["content"][0]["input"] == {}


def test_codex_shaped_body_is_valid():
    body = {"model": "m", "stream": True, "store": False, "input": [DEV, USER], "tools": [FN, NS, {
        "type": "web_search", "external_web_access": False}], "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
        "client_metadata": {"x": "y"}}
    assert validate_responses(body) is None


# -- stream -----------------------------------------------------------------------------------------------------

def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    c: dict = {"choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        c["usage"] = usage
    return c


def _run(chunks: list[dict], *, tools=None, skip_prologue=False):
    rq = translate_request({"model": "m", "input": "x", "tools": tools or []})
    tr = ChatStreamToResponses(rq, "m", skip_prologue=skip_prologue)
    events = []
    for c in chunks:
        events += tr.feed(c)
    events += tr.finish()
    return events


USAGE = {"prompt_tokens": 10, "completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 4},
         "completion_tokens_details": {"reasoning_tokens": 2}}

STREAM_CASES = [
    ("text",
     [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "He"}), _chunk({"content": "y"}),
      _chunk({}, "stop"), _chunk(usage=USAGE)],
     ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done", "response.completed"]),
    ("reasoning_content then text",
     [_chunk({"reasoning_content": "hm"}), _chunk({"content": "ok"}), _chunk({}, "stop")],
     ["response.created", "response.in_progress", "response.output_item.added",
      "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.completed"]),
    ("think tags split across chunks",
     [_chunk({"content": "<thi"}), _chunk({"content": "nk>hm</th"}), _chunk({"content": "ink>ok"}), _chunk({}, "stop")],
     ["response.created", "response.in_progress", "response.output_item.added",
      "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.completed"]),
    ("length ends incomplete", [_chunk({"content": "a"}), _chunk({}, "length")],
     ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.incomplete"]),
]


@pytest.mark.parametrize("case,chunks,types", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_stream_event_grammar(case, chunks, types):
    events = _run(chunks)
    assert [e["type"] for e in events] == types
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    ids = {e["item_id"] for e in events if "item_id" in e}
    done = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
    assert ids <= set(done)


def test_completed_usage_and_output():
    events = _run([_chunk({"reasoning_content": "hm"}), _chunk({"content": "ok"}), _chunk({}, "stop"),
                   _chunk(usage=USAGE)])
    resp = events[-1]["response"]
    assert resp["status"] == "completed"
    assert resp["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 6,
                             "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 16}
    assert [o["type"] for o in resp["output"]] == ["reasoning", "message"]
    assert resp["output"][1]["content"][0]["text"] == "ok"


def test_interleaved_parallel_tool_calls_reassemble_byte_exact():
    a, b = '{"cmd":"echo \\"hé\\""}', '{"x":"日本"}'
    chunks = [_chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                      "function": {"name": "multi_agent_v1__spawn_agent", "arguments": ""}}]}),
              _chunk({"tool_calls": [{"index": 1, "id": "c2", "type": "function",
                                      "function": {"name": "exec_command", "arguments": ""}}]})]
    for i in range(max(len(a), len(b))):
        if i < len(a):
            chunks.append(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": a[i]}}]}))
        if i < len(b):
            chunks.append(_chunk({"tool_calls": [{"index": 1, "function": {"arguments": b[i]}}]}))
    chunks.append(_chunk({}, "tool_calls"))
    events = _run(chunks, tools=[FN, NS])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    calls = events[-1]["response"]["output"]
    assert [(c["call_id"], c["name"], c.get("namespace"), c["arguments"]) for c in calls] == [
        ("c1", "spawn_agent", "multi_agent_v1", a), ("c2", "exec_command", None, b)]
    for call in calls:
        deltas = [e["delta"] for e in events
                  if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == call["id"]]
        assert "".join(deltas) == call["arguments"] and len(deltas) == len(call["arguments"])
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[0]["namespace"] == "multi_agent_v1" and added[0]["arguments"] == ""


def test_skip_prologue_continues_numbering_after_it():
    events = _run([_chunk({"content": "a"}), _chunk({}, "stop")], skip_prologue=True)
    assert events[0]["type"] == "response.output_item.added" and events[0]["sequence_number"] == 2


def test_fail_after_content_is_response_failed_next_in_sequence():
    rq = translate_request({"model": "m", "input": "x"})
    tr = ChatStreamToResponses(rq, "m")
    events = tr.feed(_chunk({"content": "a"}))
    failed = tr.fail("server_error", "boom")
    assert failed[0]["type"] == "response.failed"
    assert failed[0]["sequence_number"] == events[-1]["sequence_number"] + 1
    assert failed[0]["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert tr.finish() == []


# -- non-stream -------------------------------------------------------------------------------------------------

def test_chat_completion_to_response():
    rq = translate_request({"model": "m", "input": "x", "tools": [NS]})
    completion = {"choices": [{"message": {"role": "assistant", "content": "<think>hm</think>done", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}}]},
        "finish_reason": "tool_calls"}], "usage": USAGE}
    resp = chat_completion_to_response(rq, completion, "m")
    assert resp["status"] == "completed" and resp["id"] == rq.response_id
    assert [o["type"] for o in resp["output"]] == ["reasoning", "message", "function_call"]
    assert resp["output"][0]["summary"][0]["text"] == "hm"
    assert resp["output"][1]["content"][0]["text"] == "done"
    assert (resp["output"][2]["namespace"], resp["output"][2]["name"]) == ("multi_agent_v1", "spawn_agent")
    assert resp["usage"]["input_tokens_details"]["cached_tokens"] == 4
    orjson.dumps(resp)


# -- encrypted reasoning goes back only to the provider that issued it -----------------------------------------

def test_encrypted_reasoning_only_back_to_its_issuer():
    items = [{"type": "reasoning", "summary": [], "encrypted_content": "coderouter:native:BLOB"},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}],
              "encrypted_content": "coderouter:other:X"},
             {"type": "reasoning", "summary": [], "encrypted_content": "foreign"},
             USER]
    mine = own_reasoning_only(items, "native")
    assert mine[0]["encrypted_content"] == "BLOB"
    assert "encrypted_content" not in mine[1] and mine[1]["summary"][0]["text"] == "s"
    assert len(mine) == 3 and mine[2] == USER  # nothing readable left in the foreign one: dropped
