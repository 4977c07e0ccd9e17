import re

import pytest

from coderouterd.translate.anthropic_answer_to_openai import anthropic_response_to_openai
from coderouterd.translate.openai_answer_to_anthropic import (
    SYNTHETIC_SIGNATURE,
    openai_stop_to_anthropic,
    response_to_anthropic,
)
from coderouterd.translate.openai_request_to_anthropic import openai_request_to_anthropic
from coderouterd.translate.tool_arguments import parse_tool_arguments

ZERO_USAGE = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _resp(message: dict, finish="stop", usage=None, **choice_extra) -> dict:
    resp = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "up",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, **choice_extra}],
    }
    if usage is not None:
        resp["usage"] = usage
    return resp


THINK = {"type": "thinking", "thinking": "ponder", "signature": SYNTHETIC_SIGNATURE}

# (name, response, stop_sequences, expected content, stop_reason, stop_sequence)
RESPONSE_CASES = [
    ("text", _resp({"content": "Hello"}), None, [{"type": "text", "text": "Hello"}], "end_turn", None),
    ("reasoning_content field", _resp({"content": "Hi", "reasoning_content": "ponder"}), None,
     [THINK, {"type": "text", "text": "Hi"}], "end_turn", None),
    ("reasoning field", _resp({"content": "Hi", "reasoning": "ponder"}), None,
     [THINK, {"type": "text", "text": "Hi"}], "end_turn", None),
    ("think tags in content", _resp({"content": "<think>\nponder\n</think>\n\nHi"}), None,
     [THINK, {"type": "text", "text": "Hi"}], "end_turn", None),
    ("length", _resp({"content": "trunc"}, finish="length"), None,
     [{"type": "text", "text": "trunc"}], "max_tokens", None),
    ("content filter", _resp({"content": ""}, finish="content_filter"), None, [], "refusal", None),
    ("missing finish", _resp({"content": "x"}, finish=None), None, [{"type": "text", "text": "x"}], "end_turn", None),
    ("stop string reported by server", _resp({"content": "a"}, stop_reason="END"), ["END"],
     [{"type": "text", "text": "a"}], "stop_sequence", "END"),
    ("stop string left in content", _resp({"content": "abcEND"}), ["END"],
     [{"type": "text", "text": "abc"}], "stop_sequence", "END"),
    ("natural stop with stop sequences", _resp({"content": "abc"}), ["END"],
     [{"type": "text", "text": "abc"}], "end_turn", None),
    ("tool calls", _resp({"content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "Read", "arguments": '{"p":"é"}'}}]},
        finish="tool_calls"), None,
     [{"type": "tool_use", "id": "call_1", "name": "Bash", "input": {"command": "ls"}},
      {"type": "tool_use", "id": "call_2", "name": "Read", "input": {"p": "é"}}], "tool_use", None),
    ("tool calls with stop finish still tool_use", _resp({"content": "ok", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "T", "arguments": "{}"}}]}, finish="stop"), None,
     [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "c", "name": "T", "input": {}}], "tool_use", None),
    ("broken arguments repaired", _resp({"tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "T", "arguments": '{"a": 1,'}}]}, finish="tool_calls"),
     None, [{"type": "tool_use", "id": "c", "name": "T", "input": {"a": 1}}], "tool_use", None),
    ("empty choices", {"choices": []}, None, [], "end_turn", None),
]


@pytest.mark.parametrize("name,resp,stops,content,stop_reason,stop_sequence", RESPONSE_CASES,
                         ids=[c[0] for c in RESPONSE_CASES])
def test_response_to_anthropic(name, resp, stops, content, stop_reason, stop_sequence):
    out = response_to_anthropic(resp, "claude-opus-4-8", stop_sequences=stops)
    assert out["content"] == content
    assert out["stop_reason"] == stop_reason
    assert out["stop_sequence"] == stop_sequence
    assert out["type"] == "message" and out["role"] == "assistant" and out["model"] == "claude-opus-4-8"
    assert re.fullmatch(r"msg_[0-9a-f]{24}", out["id"])
    assert out["usage"] == ZERO_USAGE


def test_missing_tool_call_id_is_generated():
    resp = _resp({"tool_calls": [{"type": "function", "function": {"name": "T", "arguments": ""}},
                                 {"id": "", "type": "function", "function": {"name": "U", "arguments": "{}"}}]})
    blocks = response_to_anthropic(resp, "m")["content"]
    assert [b["input"] for b in blocks] == [{}, {}]
    ids = [b["id"] for b in blocks]
    assert all(re.fullmatch(r"toolu_[0-9a-f]{24}", i) for i in ids) and ids[0] != ids[1]


USAGE_CASES = [
    ("plain", {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
     {"input_tokens": 100, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
    ("cached", {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 80}},
     {"input_tokens": 20, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 80}),
    ("null details", {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": None},
     {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
]


@pytest.mark.parametrize("name,usage,expected", USAGE_CASES, ids=[c[0] for c in USAGE_CASES])
def test_usage_mapping(name, usage, expected):
    assert response_to_anthropic(_resp({"content": "x"}, usage=usage), "m")["usage"] == expected


STOP_CASES = [
    ("stop", "stop", False, "end_turn"),
    ("length", "length", False, "max_tokens"),
    ("tool_calls", "tool_calls", True, "tool_use"),
    ("function_call", "function_call", True, "tool_use"),
    ("stop with calls", "stop", True, "tool_use"),
    ("length with calls", "length", True, "tool_use"),
    ("tool_calls without calls", "tool_calls", False, "end_turn"),
    ("content_filter", "content_filter", False, "refusal"),
    ("none", None, False, "end_turn"),
    ("unknown", "eos", False, "end_turn"),
]


@pytest.mark.parametrize("name,finish,had_tools,expected", STOP_CASES, ids=[c[0] for c in STOP_CASES])
def test_openai_stop_to_anthropic(name, finish, had_tools, expected):
    assert openai_stop_to_anthropic(finish, had_tools) == expected


ARG_CASES = [
    ("valid", '{"a": [1, {"b": "c"}]}', {"a": [1, {"b": "c"}]}),
    ("dict passthrough", {"a": 1}, {"a": 1}),
    ("empty", "", {}),
    ("none", None, {}),
    ("truncated", '{"a": "x", "b": [1, 2', {"a": "x", "b": [1, 2]}),
    ("truncated inside string", '{"a": "unterminated', {"a": "unterminated"}),
    ("trailing comma", '{"a": 1,}', {"a": 1}),
    ("raw newline in string", '{"cmd": "line1\nline2"}', {"cmd": "line1\nline2"}),
    ("markdown fence", '```json\n{"a": 1}\n```', {"a": 1}),
    ("double encoded", '"{\\"a\\": 1}"', {"a": 1}),
    ("non object", "[1, 2]", {}),
    ("hopeless", "call the tool please", {}),
]


@pytest.mark.parametrize("name,raw,expected", ARG_CASES, ids=[c[0] for c in ARG_CASES])
def test_parse_tool_arguments(name, raw, expected):
    assert parse_tool_arguments(raw) == expected


# --- OpenAI-shaped client, Anthropic upstream --------------------------------------------------

INGRESS_REQUEST_CASES = [
    ("minimal defaults", {"model": "gpt", "messages": [{"role": "user", "content": "hi"}]},
     {"model": "up", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
      "max_tokens": 4096, "stream": False}),
    ("system and developer merged", {"messages": [{"role": "system", "content": "S1"},
                                                  {"role": "developer", "content": [{"type": "text", "text": "S2"}]},
                                                  {"role": "user", "content": "u"}], "max_tokens": 50, "stream": True},
     {"model": "up", "system": "S1\n\nS2", "messages": [{"role": "user", "content": [{"type": "text", "text": "u"}]}],
      "max_tokens": 50, "stream": True}),
    ("max_completion_tokens wins", {"messages": [], "max_tokens": 5, "max_completion_tokens": 9},
     {"model": "up", "messages": [], "max_tokens": 9, "stream": False}),
    ("tool round trip", {"messages": [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"pwd"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "/w"}]},
        {"role": "user", "content": "thanks"}]},
     {"model": "up", "max_tokens": 4096, "stream": False, "messages": [
         {"role": "user", "content": [{"type": "text", "text": "list"}]},
         {"role": "assistant", "content": [
             {"type": "tool_use", "id": "call_1", "name": "Bash", "input": {"command": "ls"}},
             {"type": "tool_use", "id": "call_2", "name": "Bash", "input": {"command": "pwd"}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"},
             {"type": "tool_result", "tool_use_id": "call_2", "content": "/w"},
             {"type": "text", "text": "thanks"}]}]}),
    ("images", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AA"}},
        {"type": "image_url", "image_url": {"url": "https://h/i.png"}}]}]},
     {"model": "up", "max_tokens": 4096, "stream": False, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "see"},
         {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AA"}},
         {"type": "image", "source": {"type": "url", "url": "https://h/i.png"}}]}]}),
    ("tools, choice, stop, sampling", {"messages": [{"role": "user", "content": "x"}], "stop": "END",
                                       "temperature": 1.5, "top_p": 0.5,
                                       "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                                                   "parameters": {"type": "object"}}}],
                                       "tool_choice": "required", "parallel_tool_calls": False},
     {"model": "up", "max_tokens": 4096, "stream": False, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
      "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
      "stop_sequences": ["END"], "temperature": 1.0, "top_p": 0.5}),
    ("named tool choice", {"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}],
                           "tool_choice": {"type": "function", "function": {"name": "f"}}, "stop": ["a", "b"]},
     {"model": "up", "max_tokens": 4096, "stream": False, "messages": [],
      "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
      "tool_choice": {"type": "tool", "name": "f"}, "stop_sequences": ["a", "b"]}),
]


@pytest.mark.parametrize("name,body,expected", INGRESS_REQUEST_CASES, ids=[c[0] for c in INGRESS_REQUEST_CASES])
def test_openai_request_to_anthropic(name, body, expected):
    assert openai_request_to_anthropic(body, "up") == expected


INGRESS_RESPONSE_CASES = [
    ("text", {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
              "usage": {"input_tokens": 3, "output_tokens": 2}},
     {"role": "assistant", "content": "hi"}, "stop",
     {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}),
    ("thinking and tools", {"content": [
        {"type": "thinking", "thinking": "plan", "signature": "s"},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls", "n": 1}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 5}},
     {"role": "assistant", "content": None, "reasoning_content": "plan", "tool_calls": [
         {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls","n":1}'}}]},
     "tool_calls",
     {"prompt_tokens": 105, "completion_tokens": 4, "total_tokens": 109, "prompt_tokens_details": {"cached_tokens": 90}}),
    ("max tokens", {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "stop_reason": "max_tokens"},
     {"role": "assistant", "content": "ab"}, "length",
     {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}),
    ("refusal", {"content": [], "stop_reason": "refusal"}, {"role": "assistant", "content": ""}, "content_filter",
     {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}),
    ("stop sequence", {"content": [{"type": "text", "text": "a"}], "stop_reason": "stop_sequence", "stop_sequence": "X"},
     {"role": "assistant", "content": "a"}, "stop",
     {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}),
]


@pytest.mark.parametrize("name,resp,message,finish,usage", INGRESS_RESPONSE_CASES,
                         ids=[c[0] for c in INGRESS_RESPONSE_CASES])
def test_anthropic_response_to_openai(name, resp, message, finish, usage):
    out = anthropic_response_to_openai({"id": "msg_1", "type": "message", **resp}, "gpt-x", created=42)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", out.pop("id"))
    assert out == {
        "object": "chat.completion",
        "created": 42,
        "model": "gpt-x",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


def test_round_trip_openai_request_through_anthropic_and_back():
    from coderouterd.translate.anthropic_request_to_openai import request_to_openai

    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ],
        "max_tokens": 10,
    }
    back, warnings = request_to_openai(openai_request_to_anthropic(body, "m"), "m", stream=False)
    assert warnings == []
    assert back["messages"] == body["messages"]
