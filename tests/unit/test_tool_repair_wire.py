"""Tool-call repair on each (client wire, upstream wire) strategy, stream and non-stream: the client sees real
tool calls, the right stop/finish reason and the upstream's usage, and never the markup."""

from __future__ import annotations

import orjson
import pytest

from coderouterd.config.schema import ProviderConfig
from coderouterd.providers.strategies import (
    AnthropicPassthrough,
    AnthropicToOpenAIUpstream,
    OpenAIPassthrough,
    OpenAIToAnthropicUpstream,
)
from coderouterd.translate.tool_repair import repair_tools_for
from coderouterd.wire.sse import SSEParser

BASH = {"name": "Bash", "input_schema": {"type": "object", "required": ["command"],
                                         "properties": {"command": {"type": "string"}}}}
ANTHROPIC_BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], "tools": [BASH]}
OPENAI_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"type": "function", "function": {"name": "Bash", "parameters": BASH["input_schema"]}}]}
TOOLS = repair_tools_for(ProviderConfig(base_url="http://127.0.0.1:1"), ANTHROPIC_BODY)
TEXT = 'Let me look.\n\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
QUOTED = 'Like this:\n```\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>\n```'
USAGE = {"prompt_tokens": 11, "completion_tokens": 22}


def pieces(text: str, n: int = 3) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)]


def openai_stream(text: str) -> list[tuple[None, str]]:
    chunks = [{"id": "c1", "object": "chat.completion.chunk", "model": "q",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    for p in pieces(text):
        chunks.append({"id": "c1", "object": "chat.completion.chunk", "model": "q",
                       "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]})
    chunks.append({"id": "c1", "object": "chat.completion.chunk", "model": "q",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"id": "c1", "object": "chat.completion.chunk", "model": "q", "choices": [], "usage": USAGE})
    return [(None, orjson.dumps(c).decode()) for c in chunks] + [(None, "[DONE]")]


def anthropic_stream(text: str) -> list[tuple[str, str]]:
    evs = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                 "content": [], "model": "q", "usage": {"input_tokens": 11,
                                                                                       "output_tokens": 1}}},
           {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    evs += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces(text)]
    evs += [{"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": 22}},
            {"type": "message_stop"}]
    return [(e["type"], orjson.dumps(e).decode()) for e in evs]


def parse(out: bytes) -> list[dict]:
    return [orjson.loads(d) for _n, d in SSEParser().feed(out) if d != "[DONE]"]


def anthropic_result(events: list[dict]) -> tuple[str, list[dict], str | None]:
    text, calls, stop = "", [], None
    args: dict[int, str] = {}
    for e in events:
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            calls.append({"index": e["index"], "name": e["content_block"]["name"]})
            args[e["index"]] = ""
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            text += e["delta"]["text"]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            args[e["index"]] += e["delta"]["partial_json"]
        elif e["type"] == "message_delta":
            stop = e["delta"]["stop_reason"]
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    assert starts == list(range(len(starts)))  # contiguous block indices
    return text, [{"name": c["name"], "input": orjson.loads(args[c["index"]])} for c in calls], stop


def openai_result(chunks: list[dict]) -> tuple[str, list[dict], str | None]:
    text, calls, finish = "", {}, None
    for c in chunks:
        for ch in c.get("choices") or ():
            d = ch.get("delta") or {}
            text += d.get("content") or ""
            for tc in d.get("tool_calls") or ():
                slot = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                slot["name"] += (tc.get("function") or {}).get("name") or ""
                slot["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    return text, [{"name": v["name"], "input": orjson.loads(v["arguments"])} for v in calls.values()], finish


def make(cls, body, tools=TOOLS):
    return cls(model="q", skip_prologue=False, client_body=body, repair_tools=tools)


CALL = [{"name": "Bash", "input": {"command": "ls -la"}}]


def test_anthropic_client_openai_upstream_stream():
    st = make(AnthropicToOpenAIUpstream, ANTHROPIC_BODY)
    text, calls, stop = anthropic_result(parse(st.events(openai_stream(TEXT))))
    assert (text, calls, stop) == ("Let me look.", CALL, "tool_use")
    assert st.repaired == 1 and st.repair_formats == ["hermes"]
    assert st.usage["output_tokens"] == 22 and st.usage["input_tokens"] == 11


def test_openai_client_openai_upstream_stream():
    st = make(OpenAIPassthrough, OPENAI_BODY)
    out = parse(st.events(openai_stream(TEXT)))
    assert openai_result(out) == ("Let me look.", CALL, "tool_calls")
    assert st.usage["output_tokens"] == 22 and st.done


def test_openai_passthrough_keeps_bytes_of_plain_chunks():
    st = make(OpenAIPassthrough, OPENAI_BODY)
    events = openai_stream("Hello there, no tools needed.")
    out = st.events(events[:3])
    assert out == b"".join(b"data: " + d.encode() + b"\n\n" for _n, d in events[:3])


def test_anthropic_passthrough_stream():
    st = make(AnthropicPassthrough, ANTHROPIC_BODY)
    text, calls, stop = anthropic_result(parse(st.events(anthropic_stream(TEXT))))
    assert (text, calls, stop) == ("Let me look.", CALL, "tool_use")
    assert st.usage["output_tokens"] == 22 and st.done


def test_anthropic_passthrough_call_only_drops_the_empty_text_block():
    st = make(AnthropicPassthrough, ANTHROPIC_BODY)
    events = parse(st.events(anthropic_stream(TEXT.split("\n\n", 1)[1])))
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == ["tool_use"]
    assert anthropic_result(events)[1:] == (CALL, "tool_use")


def test_openai_client_anthropic_upstream_stream():
    st = make(OpenAIToAnthropicUpstream, OPENAI_BODY)
    assert openai_result(parse(st.events(anthropic_stream(TEXT)))) == ("Let me look.", CALL, "tool_calls")


@pytest.mark.parametrize("cls,body,stream,result", [
    (AnthropicToOpenAIUpstream, ANTHROPIC_BODY, openai_stream, anthropic_result),
    (OpenAIPassthrough, OPENAI_BODY, openai_stream, openai_result),
    (AnthropicPassthrough, ANTHROPIC_BODY, anthropic_stream, anthropic_result),
    (OpenAIToAnthropicUpstream, OPENAI_BODY, anthropic_stream, openai_result),
])
def test_quoted_call_stays_text(cls, body, stream, result):
    st = make(cls, body)
    text, calls, stop = result(parse(st.events(stream(QUOTED))))
    assert text == QUOTED and calls == [] and stop in ("end_turn", "stop") and st.repaired == 0


def test_without_repair_tools_the_markup_is_text():
    st = make(AnthropicToOpenAIUpstream, ANTHROPIC_BODY, tools=None)
    text, calls, stop = anthropic_result(parse(st.events(openai_stream(TEXT))))
    assert text == TEXT and calls == [] and stop == "end_turn"


def openai_completion(text: str) -> bytes:
    return orjson.dumps({"id": "c", "object": "chat.completion", "model": "q", "usage": USAGE, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})


def anthropic_message(text: str) -> bytes:
    return orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "q",
                         "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                         "stop_sequence": None, "usage": {"input_tokens": 11, "output_tokens": 22}})


def _anthropic_body(msg: dict):
    text = "".join(b["text"] for b in msg["content"] if b["type"] == "text")
    calls = [{"name": b["name"], "input": b["input"]} for b in msg["content"] if b["type"] == "tool_use"]
    return text, calls, msg["stop_reason"]


def _openai_body(resp: dict):
    m = resp["choices"][0]["message"]
    calls = [{"name": c["function"]["name"], "input": orjson.loads(c["function"]["arguments"])}
             for c in m.get("tool_calls") or ()]
    return m.get("content") or "", calls, resp["choices"][0]["finish_reason"]


@pytest.mark.parametrize("cls,body,upstream,result", [
    (AnthropicToOpenAIUpstream, ANTHROPIC_BODY, openai_completion, _anthropic_body),
    (OpenAIPassthrough, OPENAI_BODY, openai_completion, _openai_body),
    (AnthropicPassthrough, ANTHROPIC_BODY, anthropic_message, _anthropic_body),
    (OpenAIToAnthropicUpstream, OPENAI_BODY, anthropic_message, _openai_body),
])
def test_non_streaming(cls, body, upstream, result):
    st = make(cls, body)
    assert result(orjson.loads(st.response(upstream(TEXT)))) == ("Let me look.", CALL,
                                                                  "tool_use" if "Anthropic" in cls.__name__[:9]
                                                                  else "tool_calls")
    assert st.repaired == 1 and st.usage
    st = make(cls, body)
    text, calls, _ = result(orjson.loads(st.response(upstream(QUOTED))))
    assert text == QUOTED and calls == [] and st.repaired == 0


def test_policy_auto_is_for_local_providers_only():
    local = ProviderConfig(base_url="http://127.0.0.1:8080/v1")
    lan = ProviderConfig(base_url="http://192.168.1.20:1234/v1")
    remote = ProviderConfig(base_url="https://openrouter.ai/api/v1")
    assert repair_tools_for(local, ANTHROPIC_BODY) and repair_tools_for(lan, OPENAI_BODY)
    assert repair_tools_for(remote, ANTHROPIC_BODY) is None
    assert repair_tools_for(ProviderConfig(base_url="https://x.example/v1", tool_repair="on"), ANTHROPIC_BODY)
    assert repair_tools_for(ProviderConfig(base_url="http://127.0.0.1:1", tool_repair="off"), ANTHROPIC_BODY) is None
    assert repair_tools_for(local, {**ANTHROPIC_BODY, "tools": []}) is None
    assert repair_tools_for(local, {**ANTHROPIC_BODY, "tool_choice": {"type": "none"}}) is None
