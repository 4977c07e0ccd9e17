import copy

import orjson
import pytest

from coderouterd.translate.anthropic_request_to_openai import request_to_openai

CC = {"type": "ephemeral"}
SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def _cc_schema(i: int) -> dict:
    return {
        "$schema": SCHEMA_URL,
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": f"command {i}"},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 9007199254740991},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "additionalProperties": False},
        },
        "required": ["command"],
        "additionalProperties": False,
    }


CC_TOOLS = [{"name": f"Tool{i}", "description": f"Tool number {i}.", "input_schema": _cc_schema(i)} for i in range(25)]


def _claude_code_body() -> dict:
    return {
        "model": "claude-opus-4-8",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "List the files", "cache_control": CC},
                ],
            },
            {"role": "system", "content": "Available agent types: Explore."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I will list.", "signature": "sig=="},
                    {"type": "text", "text": "Running ls."},
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.txt\nb.png"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_02", "name": "Read", "input": {"file_path": "b.png"}},
                    {"type": "tool_use", "id": "toolu_03", "name": "Bash", "input": {"command": "false"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_02",
                        "content": [
                            {"type": "text", "text": "Read image"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                        ],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_03", "content": "exit 1", "is_error": True},
                    {"type": "text", "text": "continue", "cache_control": CC},
                ],
            },
        ],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": CC},
            {"type": "text", "text": "Long instructions.", "cache_control": CC},
        ],
        "tools": CC_TOOLS,
        "metadata": {"user_id": '{"device_id":"d"}'},
        "max_tokens": 64000,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }


def _expected_tool(i: int) -> dict:
    params = _cc_schema(i)
    del params["$schema"]
    return {"type": "function", "function": {"name": f"Tool{i}", "description": f"Tool number {i}.", "parameters": params}}


CC_EXPECTED = {
    "model": "qwen3-coder:30b",
    "messages": [
        {
            "role": "system",
            "content": "You are Claude Code.\n\nLong instructions.\n\nAvailable agent types: Explore.",
        },
        {"role": "user", "content": "<system-reminder>ctx</system-reminder>\n\nList the files"},
        {
            "role": "assistant",
            "content": "Running ls.",
            "tool_calls": [
                {"id": "toolu_01", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "a.txt\nb.png"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "toolu_02", "type": "function", "function": {"name": "Read", "arguments": '{"file_path":"b.png"}'}},
                {"id": "toolu_03", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"false"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_02", "content": "Read image\n[image attached in the next user message]"},
        {"role": "tool", "tool_call_id": "toolu_03", "content": "Error: exit 1"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Image(s) returned by tool call toolu_02:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
                {"type": "text", "text": "continue"},
            ],
        },
    ],
    "tools": [_expected_tool(i) for i in range(25)],
    "max_tokens": 64000,
    "stream": True,
    "stream_options": {"include_usage": True},
}

CC_WARNINGS = [
    "cache_control dropped: not expressible on an OpenAI backend",
    "output_config.effort dropped: not expressible on an OpenAI backend",
    "metadata dropped: not expressible on an OpenAI backend",
    "context_management dropped: not expressible on an OpenAI backend",
]


def test_claude_code_request_exact():
    body = _claude_code_body()
    original = copy.deepcopy(body)
    req, warnings = request_to_openai(body, "qwen3-coder:30b", stream=True)
    assert req == CC_EXPECTED
    assert warnings == CC_WARNINGS
    assert body == original, "the input body must not be mutated"
    assert len(orjson.dumps(req)) > 0


def test_claude_code_non_stream_fallback_has_no_stream_options():
    body = _claude_code_body()
    del body["stream"]
    req, _ = request_to_openai(body, "m", stream=False)
    assert req["stream"] is False
    assert "stream_options" not in req


def _user(content):
    return {"role": "user", "content": content}


BASE = {"model": "claude-x", "max_tokens": 100}

# (name, body (merged over BASE), expected request minus model/stream keys, expected warnings)
CASES = [
    ("string system and content", {"system": "be brief", "messages": [_user("hi")]},
     {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 100},
     []),
    ("no system at all", {"messages": [_user("hi")]},
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}, []),
    ("system role only", {"messages": [{"role": "system", "content": [{"type": "text", "text": "S"}]}, _user("u")]},
     {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}], "max_tokens": 100}, []),
    ("billing header only system is dropped",
     {"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}], "messages": [_user("u")]},
     {"messages": [{"role": "user", "content": "u"}], "max_tokens": 100}, []),
    ("consecutive user messages merged", {"messages": [_user("a"), _user([{"type": "text", "text": "b"}])]},
     {"messages": [{"role": "user", "content": "a\n\nb"}], "max_tokens": 100}, []),
    ("url image and text parts",
     {"messages": [_user([{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                          {"type": "text", "text": "what is it"}])]},
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                                                {"type": "text", "text": "what is it"}]}], "max_tokens": 100}, []),
    ("tool result text blocks joined",
     {"messages": [_user([{"type": "tool_result", "tool_use_id": "t1",
                           "content": [{"type": "text", "text": "l1"}, {"type": "text", "text": "l2"}]}])]},
     {"messages": [{"role": "tool", "tool_call_id": "t1", "content": "l1\nl2"}], "max_tokens": 100}, []),
    ("empty tool result", {"messages": [_user([{"type": "tool_result", "tool_use_id": "t1"}])]},
     {"messages": [{"role": "tool", "tool_call_id": "t1", "content": ""}], "max_tokens": 100}, []),
    ("assistant with only thinking is skipped and users merge",
     {"messages": [_user("a"), {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
                   _user("b")]},
     {"messages": [{"role": "user", "content": "a\n\nb"}], "max_tokens": 100}, []),
    ("assistant string content", {"messages": [_user("a"), {"role": "assistant", "content": "b"}]},
     {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "max_tokens": 100}, []),
    ("sampling and stop", {"messages": [_user("a")], "temperature": 0.2, "top_p": 0.9, "top_k": 40,
                           "stop_sequences": ["END", "\n\n"]},
     {"messages": [{"role": "user", "content": "a"}], "max_tokens": 100, "temperature": 0.2, "top_p": 0.9,
      "top_k": 40, "stop": ["END", "\n\n"]}, []),
    ("thinking disabled", {"messages": [_user("a")], "thinking": {"type": "disabled"}},
     {"messages": [{"role": "user", "content": "a"}], "max_tokens": 100,
      "chat_template_kwargs": {"enable_thinking": False}}, []),
    ("thinking enabled adds nothing", {"messages": [_user("a")], "thinking": {"type": "enabled", "budget_tokens": 2000}},
     {"messages": [{"role": "user", "content": "a"}], "max_tokens": 100}, []),
    ("structured output", {"messages": [_user("a")], "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}}},
     {"messages": [{"role": "user", "content": "a"}], "max_tokens": 100,
      "response_format": {"type": "json_schema", "json_schema": {
          "name": "out", "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}}}, []),
    ("service tier and unknown key warn", {"messages": [_user("a")], "service_tier": "auto", "frobnicate": 1},
     {"messages": [{"role": "user", "content": "a"}], "max_tokens": 100},
     ["service_tier dropped: not expressible on an OpenAI backend",
      "frobnicate dropped: not expressible on an OpenAI backend"]),
    ("pdf document dropped with warning",
     {"messages": [_user([{"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                            "data": "JVBER"}}, {"type": "text", "text": "sum"}])]},
     {"messages": [{"role": "user", "content": "sum"}], "max_tokens": 100},
     ["document source 'base64' dropped: not expressible on an OpenAI backend"]),
    ("text document becomes text",
     {"messages": [_user([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "D"}}])]},
     {"messages": [{"role": "user", "content": "D"}], "max_tokens": 100}, []),
]


@pytest.mark.parametrize("name,body,expected,warnings", CASES, ids=[c[0] for c in CASES])
def test_request_cases(name, body, expected, warnings):
    req, got_warnings = request_to_openai({**BASE, **body}, "local", stream=False)
    assert req.pop("model") == "local"
    assert req.pop("stream") is False
    assert req == expected
    assert got_warnings == warnings


TOOL = {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}
FN_TOOL = {"type": "function", "function": {"name": "Bash", "description": "run", "parameters": {"type": "object", "properties": {}}}}

# (name, tools, tool_choice, expected keys)
TOOL_CASES = [
    ("auto", [TOOL], {"type": "auto"}, {"tools": [FN_TOOL], "tool_choice": "auto"}),
    ("any", [TOOL], {"type": "any"}, {"tools": [FN_TOOL], "tool_choice": "required"}),
    ("none", [TOOL], {"type": "none"}, {"tools": [FN_TOOL], "tool_choice": "none"}),
    ("named", [TOOL], {"type": "tool", "name": "Bash"},
     {"tools": [FN_TOOL], "tool_choice": {"type": "function", "function": {"name": "Bash"}}}),
    ("no parallel", [TOOL], {"type": "auto", "disable_parallel_tool_use": True},
     {"tools": [FN_TOOL], "tool_choice": "auto", "parallel_tool_calls": False}),
    ("choice without tools is dropped", [], {"type": "any"}, {}),
    ("missing schema gets empty object", [{"name": "N"}], None,
     {"tools": [{"type": "function", "function": {"name": "N", "parameters": {"type": "object", "properties": {}}}}]}),
    ("server tool dropped", [{"type": "web_search_20250305", "name": "web_search"}, TOOL], None, {"tools": [FN_TOOL]}),
]


@pytest.mark.parametrize("name,tools,choice,expected", TOOL_CASES, ids=[c[0] for c in TOOL_CASES])
def test_tools_and_tool_choice(name, tools, choice, expected):
    body = {**BASE, "messages": [_user("a")], "tools": tools}
    if choice is not None:
        body["tool_choice"] = choice
    req, warnings = request_to_openai(body, "m", stream=False)
    got = {k: req[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if k in req}
    assert got == expected
    if name == "server tool dropped":
        assert warnings == ["server tool web_search_20250305 dropped: not expressible on an OpenAI backend"]


def test_each_warning_kind_reported_once():
    body = {
        **BASE,
        "system": [{"type": "text", "text": "a", "cache_control": CC}, {"type": "text", "text": "b", "cache_control": CC}],
        "messages": [_user([{"type": "text", "text": "x", "cache_control": CC}])],
        "tools": [{**TOOL, "cache_control": CC}],
    }
    _, warnings = request_to_openai(body, "m", stream=True)
    assert warnings == ["cache_control dropped: not expressible on an OpenAI backend"]


def test_a_named_tool_choice_becomes_required_with_that_tool_alone_for_servers_reading_only_strings():
    from coderouterd.translate.anthropic_request_to_openai import (
        force_named_tool_as_required,
        request_to_openai,
    )

    tools = [{"name": n, "description": n, "input_schema": {"type": "object", "properties": {}}} for n in "abc"]
    body = {"model": "m", "max_tokens": 5, "tools": tools, "tool_choice": {"type": "tool", "name": "b"},
            "messages": [{"role": "user", "content": "x"}]}
    oa, _ = request_to_openai(body, "m", stream=False)
    assert oa["tool_choice"] == {"type": "function", "function": {"name": "b"}}  # OpenAI's own form by default
    forced = force_named_tool_as_required(oa)
    assert forced["tool_choice"] == "required" and [t["function"]["name"] for t in forced["tools"]] == ["b"]
    assert oa["tool_choice"] != "required"  # the original is not changed
    for unchanged in ({**oa, "tool_choice": "auto"}, {**oa, "tool_choice": {"type": "function",
                                                                           "function": {"name": "zz"}}}):
        assert force_named_tool_as_required(unchanged) is unchanged
