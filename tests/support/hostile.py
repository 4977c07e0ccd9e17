"""Hostile request bodies for the fuzz test (tests/e2e/test_fuzz.py) and the long run (bench/fuzz.py).

Each case is a real client body (Claude-Code-shaped Anthropic, OpenAI chat, count_tokens, Codex Responses) with a few random
mutations at random places (and, deterministically, every place given a value of every type: `typed_cases`): a value replaced by JSON of another type (or nested very deep), a key dropped or
added, a list emptied, the whole body replaced. What must hold for every case is in `check_response`."""

from __future__ import annotations

import copy
import json

import orjson
from hypothesis import strategies as st

ANTHROPIC_BASE = {
    "model": "claude-sonnet-5",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "fix the test"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look first", "signature": "sig"},
            {"type": "text", "text": "Reading the file."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.py", "limit": 10}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "def f(): pass"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            ]},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
        ]},
    ],
    "tools": [{"name": "Read", "description": "Read a file",
               "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                                "required": ["path"]}}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "temperature": 1,
    "stop_sequences": ["\n\nHuman:"],
    "metadata": {"user_id": "u1"},
    "stream": False,
}

OPENAI_BASE = {
    "model": "gpt-5",
    "messages": [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": [{"type": "text", "text": "list files"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    ],
    "tools": [{"type": "function", "function": {"name": "shell", "description": "run",
                                                "parameters": {"type": "object", "properties": {}}}}],
    "tool_choice": "auto",
    "max_tokens": 64,
    "temperature": 0.2,
    "stop": ["END"],
    "stream": False,
    "stream_options": {"include_usage": True},
    "response_format": {"type": "text"},
}

RESPONSES_BASE = {  # what Codex CLI sends (store=false: the whole conversation in `input`)
    "model": "gpt-5-codex",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "list files"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "E"},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {"type": "function_call", "call_id": "c2", "name": "spawn_agent", "namespace": "multi_agent_v1",
         "arguments": "{\"task\": {\"steps\": [1, 2]}}"},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "spawned"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]},
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": [{"type": "output_text", "text": "ok"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ],
    "tools": [{"type": "function", "name": "exec_command", "description": "run",
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
              {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
               "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
              {"type": "custom", "name": "apply_patch"},
              {"type": "web_search"}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1",
    "max_output_tokens": 64,
    "text": {"verbosity": "low"},
}

GEMINI_BASE = {  # what Gemini CLI sends (the model is in the path), with the shapes google-genai adds
    "contents": [
        {"role": "user", "parts": [{"text": "list files"},
                                   {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                                   {"fileData": {"mimeType": "application/pdf", "fileUri": "https://x/a.pdf"}}]},
        {"role": "model", "parts": [{"text": "plan", "thought": True, "thoughtSignature": "c2ln"},
                                    {"functionCall": {"name": "read_file", "args": {"file_path": "a"}}},
                                    {"functionCall": {"name": "ls", "args": {"dir": {"deep": [1]}}, "id": "c2"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "x"}}},
                                   {"functionResponse": {"name": "ls", "id": "c2", "response": {"error": "no"},
                                                         "parts": [{"inlineData": {"mimeType": "image/png",
                                                                                   "data": "AAAA"}}]}}]},
    ],
    "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI."}]},
    "tools": [{"functionDeclarations": [
        {"name": "read_file", "description": "read", "parameters": {
            "type": "OBJECT", "properties": {"file_path": {"type": "STRING", "nullable": True, "minLength": "1"}},
            "required": ["file_path"]}},
        {"name": "mcp.ls", "parametersJsonSchema": {"type": "object", "properties": {"dir": {}}}}]},
        {"googleSearch": {}}],
    "toolConfig": {"functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["read_file", "mcp.ls"]}},
    "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "maxOutputTokens": 64,
                         "stopSequences": ["END"], "candidateCount": 1,
                         "thinkingConfig": {"includeThoughts": True, "thinking_budget": 512},
                         "responseMimeType": "application/json",
                         "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "ARRAY",
                                                                                "items": {"type": "STRING"}}}}},
}

INGRESSES = {
    "messages": ("/v1/messages", "anthropic", ANTHROPIC_BASE),
    "count_tokens": ("/v1/messages/count_tokens", "anthropic", ANTHROPIC_BASE),
    "chat": ("/v1/chat/completions", "openai", OPENAI_BASE),
    "responses": ("/v1/responses", "openai", RESPONSES_BASE),
    "gemini": ("/v1beta/models/gemini-2.5-pro:generateContent", "gemini", GEMINI_BASE),
    "gemini_count": ("/v1/models/gemini-2.5-pro:countTokens", "gemini", GEMINI_BASE),
}

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64), st.floats(allow_nan=False,
                                                                                        allow_infinity=False),
    st.text(max_size=12), st.sampled_from(["user", "assistant", "text", "tool_use", "image", "base64", "auto",
                                           "function", "tool", "system", "json_schema", ""]),
)
json_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=8)


def _deep(depth: int, kind: str):
    v: object = {} if kind == "dict" else []
    for _ in range(depth):
        v = {"a": v} if kind == "dict" else [v]
    return v


def _containers(body) -> list[tuple]:
    """Every (parent, key) pair in the body, so a mutation can land anywhere."""
    out: list[tuple] = []
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((node, k))
                stack.append(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out.append((node, i))
                stack.append(v)
    return out


@st.composite
def hostile_body(draw, base: dict) -> bytes:
    body = copy.deepcopy(base)
    if draw(st.booleans()):
        body["stream"] = True  # the streaming paths translate incrementally: fuzz them too
    if draw(st.integers(0, 40)) == 0:
        body = draw(json_values)  # a body that is not an object at all, or a stray object
        return _dumps(body)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 4]))):
        spots = _containers(body)
        if not spots:
            break
        parent, key = spots[draw(st.integers(0, len(spots) - 1))]
        op = draw(st.integers(0, 9))
        if op <= 4:
            parent[key] = draw(json_values)
        elif op == 5 and isinstance(parent, dict):
            del parent[key]
        elif op == 6:
            parent[key] = _deep(draw(st.integers(150, 400)), draw(st.sampled_from(["dict", "list"])))
        elif op == 7 and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
        elif op == 8:
            parent[key] = [parent[key]]
        else:
            parent[key] = draw(st.sampled_from(["", [], {}, 0, -1, 1e300, "x" * 3000, DEEP_JSON_TEXT]))
    return _dumps(body)


# Tool-call arguments are JSON inside a string: parsed back into objects for an Anthropic upstream.
DEEP_JSON_TEXT = "[" * 5000 + "]" * 5000
# One value of each JSON type, and the strings that reach parsers: what a typed case puts at a leaf.
TYPED_VALUES = (None, True, -1, 1.5, "", [], {"a": 1}, DEEP_JSON_TEXT, '{"a":' * 300 + "1" + "}" * 300)


def typed_cases(base: dict) -> list[tuple[str, bytes]]:
    """Every place in the body (each key of each object, each element of each list) given each of
    TYPED_VALUES in turn: (where, body). Deterministic, so a shape the random mutations rarely reach (a
    number as a tool output part's text) is always tried."""
    out: list[tuple[str, bytes]] = []
    paths: list[tuple] = []
    stack: list[tuple[object, tuple]] = [(base, ())]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            paths.append(path + (k,))
            stack.append((v, path + (k,)))
    for path in paths:
        for value in TYPED_VALUES:
            body = copy.deepcopy(base)
            parent = body
            for k in path[:-1]:
                parent = parent[k]
            parent[path[-1]] = value
            out.append(("".join(f"[{k!r}]" for k in path) + f" = {str(value)[:20]}", _dumps(body)))
    return out


def _dumps(body) -> bytes:
    try:
        return orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):
        # Deeper than orjson writes, or integers beyond 64 bits: exactly what a hostile client may send.
        return json.dumps(body).encode()


def check_response(status: int, headers, content: bytes, shape: str) -> str | None:
    """What is wrong with the daemon's answer to a hostile body, or None."""
    if status >= 500:
        return f"{status} for client input: {content[:300]!r}"
    if status < 400:
        return None
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return f"{status} not JSON: {content[:200]!r}"
    if shape == "gemini":  # Google's shape: {"error": {"code", "message", "status"}}
        err = data.get("error") if isinstance(data, dict) else None
        ok = isinstance(err, dict) and err.get("code") == status and isinstance(err.get("message"), str) \
            and isinstance(err.get("status"), str)
    elif shape == "anthropic":
        ok = isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict) \
            and isinstance(data["error"].get("type"), str) and isinstance(data["error"].get("message"), str)
    else:
        ok = isinstance(data, dict) and isinstance(data.get("error"), dict) \
            and isinstance(data["error"].get("message"), str)
    return None if ok else f"{status} not in the {shape} error shape: {content[:200]!r}"
