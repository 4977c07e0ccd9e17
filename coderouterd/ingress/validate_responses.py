"""Validation of Responses API bodies at the edge: a clear message naming the offending field (OpenAI's `param`
convention: dotted path with [i] indices), before anything is translated or sent upstream."""

from __future__ import annotations

from .validate import ARRAY, OBJ, STR, _type_name, check_fields, model_name_problem, o_arguments

_ROLES = {"user", "assistant", "system", "developer"}
_PART_FIELDS = {"input_text": (("text", STR, False),), "output_text": (("text", STR, False),),
                "text": (("text", STR, False),), "input_image": (("image_url", STR, False), ("detail", STR, False))}
_ITEM_FIELDS = {"reasoning": (("summary", ARRAY, False),), "function_call": (("namespace", STR, False),)}
_ITEM_ID_FIELDS = {"function_call": ("call_id", "name"), "function_call_output": ("call_id",)}


_OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})


def _problem_in_parts(content: object, where: str) -> str | None:
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                return f"{where}[{j}]: expected a content part object with a 'type'"
            problem = check_fields(part, _PART_FIELDS.get(part["type"], ()), f"{where}[{j}].")
            if problem:
                return problem
    elif not isinstance(content, str):
        return f"{where}: expected a string or an array of content parts"
    return None


def _problem_in_item(i: int, item: object) -> str | None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        return f"{where}: expected an object, got {_type_name(item)}"
    itype = item.get("type", "message")
    if not isinstance(itype, str):
        return f"{where}.type: expected a string"
    if itype == "message":
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:  # a list or object here is unhashable: check first
            return f"{where}.role: expected one of user, assistant, system, developer, got {item.get('role')!r}"
        problem = _problem_in_parts(item.get("content"), f"{where}.content")
        if problem:
            return problem
    elif itype in _OUTPUT_ITEMS and item.get("output") is not None:
        # A tool's output is a string or content parts, read like a message's content (issue 23: a number as
        # a part's text was a 500)
        problem = _problem_in_parts(item["output"], f"{where}.output")
        if problem:
            return problem
    for key in _ITEM_ID_FIELDS.get(itype, ()):
        if not isinstance(item.get(key), str) or not item.get(key):
            return f"{where}.{key}: field required (a non-empty string)"
    if itype == "function_call":
        args = item.get("arguments", "")
        if not isinstance(args, str):
            return f"{where}.arguments: expected a JSON string"
        # Parsed back into an object for an Anthropic upstream: its nesting is bounded like a body's.
        problem = o_arguments(args, f"{where}.arguments")
        if problem:
            return problem
    # The shapes the translation reads (edge guard, issue 11): checked here so they are 400s, not 500s.
    return check_fields(item, _ITEM_FIELDS.get(itype, ()), f"{where}.")


def validate_responses(body: object) -> str | None:
    if not isinstance(body, dict):
        return f"request body: expected a JSON object, got {_type_name(body)}"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "model: field required (a non-empty string)" if model is None else "model: expected a non-empty string"
    problem = model_name_problem(model)
    if problem:
        return problem
    items = body.get("input")
    if items is None:
        return "input: field required (a string or an array of input items)"
    if isinstance(items, list):
        for i, item in enumerate(items):
            problem = _problem_in_item(i, item)
            if problem:
                return problem
    elif not isinstance(items, str):
        return f"input: expected a string or an array of input items, got {_type_name(items)}"
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return f"instructions: expected a string, got {_type_name(instructions)}"
    for key in ("stream", "parallel_tool_calls", "store"):
        v = body.get(key)
        if v is not None and not isinstance(v, bool):
            return f"{key}: expected a boolean, got {_type_name(v)}"
    mt = body.get("max_output_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        return "max_output_tokens: expected a positive integer"
    for key in ("temperature", "top_p"):
        v = body.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            return f"{key}: expected a number, got {_type_name(v)}"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return f"tools: expected an array, got {_type_name(tools)}"
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("type"), str):
                return f"tools[{i}].type: field required"
            if t["type"] == "function" and (not isinstance(t.get("name"), str) or not t["name"]):
                return f"tools[{i}].name: field required for a function tool"
            if t["type"] == "namespace" and not isinstance(t.get("tools"), list):
                return f"tools[{i}].tools: expected an array of functions in a namespace tool"
    for key in ("reasoning", "text"):
        v = body.get(key)
        if v is not None and not isinstance(v, dict):
            return f"{key}: expected an object, got {_type_name(v)}"
    return check_fields(body.get("reasoning") or {}, (("effort", STR, False),), "reasoning.") or \
        check_fields(body.get("text") or {}, (("format", OBJ, False),), "text.")
