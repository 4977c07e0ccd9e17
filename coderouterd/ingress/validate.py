"""Request validation: a clear message naming the offending field, in front of every upstream call."""

from __future__ import annotations

_ROLES_ANTHROPIC = {"user", "assistant", "system"}
_ROLES_OPENAI = {"system", "developer", "user", "assistant", "tool", "function"}


def _type_name(v) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(v), "null" if v is None else type(v).__name__
    )


def validate_anthropic(body, *, count_tokens: bool = False) -> str | None:
    if not isinstance(body, dict):
        return f"request body: expected a JSON object, got {_type_name(body)}"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "model: field required (a non-empty string)" if model is None else "model: expected a non-empty string"
    if not count_tokens:
        mt = body.get("max_tokens")
        if mt is None:
            return "max_tokens: field required"
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            return "max_tokens: expected a positive integer"
        st = body.get("stream")
        if st is not None and not isinstance(st, bool):
            return f"stream: expected a boolean, got {_type_name(st)}"
    msgs = body.get("messages")
    if msgs is None:
        return "messages: field required"
    if not isinstance(msgs, list):
        return f"messages: expected an array, got {_type_name(msgs)}"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return f"messages.{i}: expected an object"
        role = m.get("role")
        if role not in _ROLES_ANTHROPIC:
            return f"messages.{i}.role: expected 'user' or 'assistant', got {role!r}"
        c = m.get("content")
        if isinstance(c, list):
            for j, b in enumerate(c):
                if not isinstance(b, dict) or not isinstance(b.get("type"), str):
                    return f"messages.{i}.content.{j}: expected a content block object with a 'type'"
        elif not isinstance(c, str):
            return f"messages.{i}.content: expected a string or an array of content blocks"
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        return "system: expected a string or an array of text blocks"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: expected an array"
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                return f"tools.{i}.name: field required"
    return None


def validate_openai(body) -> str | None:
    if not isinstance(body, dict):
        return f"request body: expected a JSON object, got {_type_name(body)}"
    model = body.get("model")
    if not isinstance(model, str):
        return "model: field required (a string)" if model is None else "model: expected a string"
    msgs = body.get("messages")
    if msgs is None:
        return "messages: field required"
    if not isinstance(msgs, list) or not msgs:
        return "messages: expected a non-empty array"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return f"messages[{i}]: expected an object"
        if m.get("role") not in _ROLES_OPENAI:
            return f"messages[{i}].role: invalid role {m.get('role')!r}"
    st = body.get("stream")
    if st is not None and not isinstance(st, bool):
        return f"stream: expected a boolean, got {_type_name(st)}"
    mt = body.get("max_tokens", body.get("max_completion_tokens"))
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        return "max_tokens: expected a positive integer"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools: expected an array"
    return None
