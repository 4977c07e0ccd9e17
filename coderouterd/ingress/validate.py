"""Request validation at the edge: every shape the translators and routers rely on is checked here, before any
of them runs, so a client's mistake is a 400 naming the field (`messages[2].content[0].text: expected a
string`) and never an exception deep inside a translation.

Small tables per ingress rather than pydantic models: the request path already holds the parsed body, and a
table walk over it costs a fraction of building model objects (measured, see docs/decisions.md). Each ingress
has one entry point returning the problem as "path: reason", or None. A future ingress adds its own tables and
entry point here, reusing the checkers.

Only what matters to us is checked (types we read, values we forward or compute with); unknown keys and
unknown block types pass, as the upstream APIs keep growing."""

from __future__ import annotations

from typing import TypeGuard

import orjson

# Deeper than this and orjson (limit 254) could not serialise the request again after translation adds a
# level or two; no real request comes anywhere near it.
MAX_DEPTH = 200
_PROBE_WRAP = 254 - MAX_DEPTH  # orjson serialises at most 254 levels: wrapped this much, dumps fails iff too deep
# The longest model name a client may ask for. Real names are far shorter (hub paths with a quantisation tag,
# an absolute GGUF path: ~60-200 characters); the name is kept in routing tables, the journal and metrics
# labels, so an unbounded one is memory a client chooses (issue 34: 1 MB names settled at +580 MB of RSS).
MAX_MODEL_NAME_CHARS = 256


def _type_name(v: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(v), "null" if v is None else type(v).__name__
    )


# -- checkers: (accepted types, or a predicate; what was expected) ----------------------------------------
# Plain type tuples where they suffice: a `type(v) in types` test is the cheapest check Python has.

def _is_str(v: object) -> TypeGuard[str]:
    return type(v) is str


def model_name_problem(model: str) -> str | None:
    if len(model) > MAX_MODEL_NAME_CHARS:
        return f"model: longer than {MAX_MODEL_NAME_CHARS} characters ({len(model)})"
    return None


STR = ((str,), "a string")
INT = ((int,), "an integer")
POS_INT = (lambda v: type(v) is int and v >= 1, "a positive integer")
NUM = ((int, float), "a number")
BOOL = ((bool,), "a boolean")
OBJ = ((dict,), "an object")
ARRAY = ((list,), "an array")
STR_LIST = (lambda v: type(v) is list and all(type(x) is str for x in v), "an array of strings")
STR_OR_STR_LIST = (lambda v: type(v) is str or (type(v) is list and all(type(x) is str for x in v)),
                   "a string or an array of strings")
STR_OR_OBJ = ((str, dict), "a string or an object")

# A field table: (key, checker, required). An optional key may be absent or null.
Fields = tuple[tuple[str, tuple, bool], ...]


def check_fields(obj: dict, fields: Fields, path: str) -> str | None:
    for key, (ok, expected), required in fields:
        v = obj.get(key)
        if v is None:
            if required:
                return f"{path}{key}: field required ({expected})"
        elif type(v) not in ok if type(ok) is tuple else not ok(v):
            return f"{path}{key}: expected {expected}, got {_type_name(v)}"
    return None


def too_deep(value: object) -> bool:
    """True when `value` nests more than MAX_DEPTH levels: one C-speed serialisation of the value wrapped in
    enough lists to reach orjson's own limit, instead of a Python walk over every node."""
    for _ in range(_PROBE_WRAP):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True
    return False


def depth_problem(body: object, raw: bytes | None) -> str | None:
    """The depth limit on its own too, for an ingress whose other checks live elsewhere (Responses)."""
    # Each container costs at least one opening byte: a small body with fewer cannot be too deep. (Counting
    # is slower than the probe itself on large bodies, so only small ones are counted.)
    if raw is not None and len(raw) < 4096 and raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH:
        return None
    return f"request body: nested deeper than {MAX_DEPTH} levels" if too_deep(body) else None


# -- Anthropic Messages ------------------------------------------------------------------------------------

_ROLES_ANTHROPIC = frozenset({"user", "assistant", "system"})
_NO_CC: dict = {}
_CACHE = ("cache_control", OBJ, False)

A_TOP: Fields = (
    ("system", ((str, list), "a string or an array of text blocks"), False),
    ("temperature", NUM, False),
    ("top_p", NUM, False),
    ("top_k", INT, False),
    ("stop_sequences", STR_LIST, False),
    ("tools", ARRAY, False),
    ("tool_choice", OBJ, False),
    ("thinking", OBJ, False),
    ("output_config", OBJ, False),
    ("metadata", OBJ, False),
)
A_BLOCKS: dict[str, Fields] = {
    "text": (("text", STR, True), _CACHE),
    "image": (("source", OBJ, True), _CACHE),
    "document": (("source", OBJ, True), _CACHE, ("title", STR, False)),
    "tool_use": (("id", STR, True), ("name", STR, True), ("input", OBJ, False), _CACHE),
    "tool_result": (("tool_use_id", STR, True), ("is_error", BOOL, False), _CACHE),
    "thinking": (("thinking", STR, True), ("signature", STR, False)),
    "redacted_thinking": (("data", STR, True),),
}
A_SOURCES: dict[str, Fields] = {
    "base64": (("data", STR, True), ("media_type", STR, False)),
    "url": (("url", STR, True),),
    "text": (("data", STR, True), ("media_type", STR, False)),
}
A_TOOL: Fields = (("name", STR, True), ("type", STR, False), ("description", STR, False),
                  ("input_schema", OBJ, False), _CACHE)
A_TOOL_CHOICE: Fields = (("type", STR, True), ("name", STR, False), ("disable_parallel_tool_use", BOOL, False))
A_THINKING: Fields = (("type", STR, True), ("budget_tokens", INT, False))
A_OUTPUT_CONFIG: Fields = (("format", OBJ, False),)
A_FORMAT: Fields = (("type", STR, False), ("schema", OBJ, False))


def _a_source(block: dict, path: str) -> str | None:
    source = block["source"]
    stype = source.get("type")
    if not _is_str(stype):
        return f"{path}source.type: expected a string, got {_type_name(stype)}"
    fields = A_SOURCES.get(stype)
    if fields is not None:
        return check_fields(source, fields, f"{path}source.")
    if stype == "content":
        return _a_blocks(source.get("content"), f"{path}source.content", allow_str=True)
    return None


def _a_block(block: object, path: str) -> str | None:
    if type(block) is dict and block.get("type") == "text" and type(block.get("text")) is str and \
            type(block.get("cache_control", _NO_CC)) is dict:
        return None  # the common case, checked inline: most blocks are plain text
    if type(block) is not dict:
        return f"{path}: expected a content block object, got {_type_name(block)}"
    btype = block.get("type")
    if not _is_str(btype):
        return f"{path}.type: field required (a string)" if btype is None else \
            f"{path}.type: expected a string, got {_type_name(btype)}"
    fields = A_BLOCKS.get(btype)
    if fields is None:
        return None  # a block type we do not translate: passed through or dropped with a warning
    prefix = path + "."
    problem = check_fields(block, fields, prefix)
    if problem:
        return problem
    if btype == "tool_result":
        content = block.get("content")
        if content is not None:
            return _a_blocks(content, f"{prefix}content", allow_str=True)
    elif btype in ("image", "document"):
        return _a_source(block, prefix)
    return None


def _a_blocks(content: object, path: str, *, allow_str: bool) -> str | None:
    if type(content) is str and allow_str:
        return None
    if type(content) is not list:
        return f"{path}: expected a string or an array of content blocks, got {_type_name(content)}"
    for j, b in enumerate(content):
        problem = _a_block(b, f"{path}[{j}]")
        if problem:
            return problem
    return None


def _a_system(system: str | list) -> str | None:  # checked as one of these (A_BODY)
    if type(system) is str:
        return None
    for i, b in enumerate(system):
        if type(b) is not dict:
            return f"system[{i}]: expected a text block object, got {_type_name(b)}"
        if b.get("type") != "text":
            return f"system[{i}].type: expected 'text'"
        problem = check_fields(b, A_BLOCKS["text"], f"system[{i}].")
        if problem:
            return problem
    return None


def validate_anthropic(body: object, *, count_tokens: bool = False, raw: bytes | None = None) -> str | None:
    """POST /v1/messages and /v1/messages/count_tokens (which needs no max_tokens)."""
    if type(body) is not dict:
        return f"request body: expected a JSON object, got {_type_name(body)}"
    model = body.get("model")
    if not _is_str(model) or not model:
        return "model: field required (a non-empty string)" if model is None else \
            f"model: expected a non-empty string, got {_type_name(model) if model != '' else 'an empty string'}"
    if len(model) > MAX_MODEL_NAME_CHARS:
        return model_name_problem(model)
    if not count_tokens:
        mt = body.get("max_tokens")
        if mt is None:
            return "max_tokens: field required"
        if type(mt) is not int or mt < 1:
            return f"max_tokens: expected a positive integer, got {_type_name(mt)}"
        st = body.get("stream")
        if st is not None and type(st) is not bool:
            return f"stream: expected a boolean, got {_type_name(st)}"
    msgs = body.get("messages")
    if msgs is None:
        return "messages: field required"
    if type(msgs) is not list:
        return f"messages: expected an array, got {_type_name(msgs)}"
    for i, m in enumerate(msgs):
        if type(m) is not dict:
            return f"messages[{i}]: expected an object, got {_type_name(m)}"
        role = m.get("role")
        if not _is_str(role) or role not in _ROLES_ANTHROPIC:
            return f"messages[{i}].role: expected 'user' or 'assistant', got " + (
                repr(role[:40]) if _is_str(role) else _type_name(role))
        problem = _a_blocks(m.get("content"), f"messages[{i}].content", allow_str=True)
        if problem:
            return problem
    problem = check_fields(body, A_TOP, "")
    if problem:
        return problem
    if body.get("system") is not None:
        problem = _a_system(body["system"])
        if problem:
            return problem
    for i, t in enumerate(body.get("tools") or ()):
        if type(t) is not dict:
            return f"tools[{i}]: expected an object, got {_type_name(t)}"
        if type(t.get("name")) is str and type(t.get("input_schema", _NO_CC)) is dict and \
                type(t.get("description", "")) is str and "cache_control" not in t and "type" not in t:
            continue  # the usual custom tool
        problem = check_fields(t, A_TOOL, f"tools[{i}].")
        if problem:
            return problem
    for key, fields in (("tool_choice", A_TOOL_CHOICE), ("thinking", A_THINKING),
                        ("output_config", A_OUTPUT_CONFIG)):
        if body.get(key) is not None:
            problem = check_fields(body[key], fields, f"{key}.")
            if problem:
                return problem
    fmt = (body.get("output_config") or {}).get("format")
    if fmt is not None:
        problem = check_fields(fmt, A_FORMAT, "output_config.format.")
        if problem:
            return problem
    return depth_problem(body, raw)


# -- OpenAI chat.completions -------------------------------------------------------------------------------

_ROLES_OPENAI = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

O_TOP: Fields = (
    ("stream_options", OBJ, False),
    ("temperature", NUM, False),
    ("top_p", NUM, False),
    ("top_k", INT, False),
    ("n", POS_INT, False),
    ("presence_penalty", NUM, False),
    ("frequency_penalty", NUM, False),
    ("seed", INT, False),
    ("stop", STR_OR_STR_LIST, False),
    ("tools", ARRAY, False),
    ("tool_choice", STR_OR_OBJ, False),
    ("parallel_tool_calls", BOOL, False),
    ("response_format", OBJ, False),
    ("user", STR, False),
)
O_MESSAGE: Fields = (("name", STR, False), ("tool_call_id", STR, False),
                     ("tool_calls", ARRAY, False))
O_PARTS: dict[str, Fields] = {
    "text": (("text", STR, True),),
    "image_url": (("image_url", STR_OR_OBJ, True),),
}
O_TOOL_CALL: Fields = (("id", STR, False), ("type", STR, False), ("function", OBJ, True))
O_FUNCTION_CALL: Fields = (("name", STR, True), ("arguments", STR, False))
O_TOOL: Fields = (("type", STR, False), ("function", OBJ, False))
O_FUNCTION: Fields = (("name", STR, True), ("description", STR, False), ("parameters", OBJ, False))
O_STREAM_OPTIONS: Fields = (("include_usage", BOOL, False),)
O_RESPONSE_FORMAT: Fields = (("type", STR, True), ("json_schema", OBJ, False))
O_JSON_SCHEMA: Fields = (("schema", OBJ, False), ("name", STR, False))


def _o_content(content: object, path: str) -> str | None:
    if content is None or type(content) is str:
        return None
    if type(content) is not list:
        return f"{path}: expected a string or an array of content parts, got {_type_name(content)}"
    for j, p in enumerate(content):
        if type(p) is not dict:
            return f"{path}[{j}]: expected a content part object, got {_type_name(p)}"
        ptype = p.get("type")
        if not _is_str(ptype):
            return f"{path}[{j}].type: expected a string, got {_type_name(ptype)}"
        fields = O_PARTS.get(ptype)
        if fields is not None:
            problem = check_fields(p, fields, f"{path}[{j}].")
            if problem:
                return problem
            image = p.get("image_url")
            if type(image) is dict and not _is_str(image.get("url")):
                return f"{path}[{j}].image_url.url: expected a string, got {_type_name(image.get('url'))}"
    return None


def o_arguments(args: str, path: str) -> str | None:
    # Arguments are parsed back into objects when the upstream speaks Anthropic: bound their nesting too.
    if args.count("{") + args.count("[") <= MAX_DEPTH:
        return None
    try:
        value = orjson.loads(args)
    except orjson.JSONDecodeError as e:
        if e.msg.startswith("depth limit"):  # orjson stops at 1024 levels, malformed or not
            return f"{path}: nested deeper than {MAX_DEPTH} levels"
        return None  # repaired or replaced by {} downstream
    return f"{path}: nested deeper than {MAX_DEPTH} levels" if too_deep(value) else None


def _o_message(m: object, i: int) -> str | None:
    if type(m) is not dict:
        return f"messages[{i}]: expected an object, got {_type_name(m)}"
    role = m.get("role")
    if not _is_str(role) or role not in _ROLES_OPENAI:
        return f"messages[{i}].role: invalid role " + (repr(role[:40]) if _is_str(role) else _type_name(role))
    problem = _o_content(m.get("content"), f"messages[{i}].content") or check_fields(m, O_MESSAGE,
                                                                                       f"messages[{i}].")
    if problem:
        return problem
    for j, call in enumerate(m.get("tool_calls") or ()):
        path = f"messages[{i}].tool_calls[{j}]"
        if type(call) is not dict:
            return f"{path}: expected an object, got {_type_name(call)}"
        problem = check_fields(call, O_TOOL_CALL, path + ".") or \
            check_fields(call["function"], O_FUNCTION_CALL, path + ".function.")
        if problem:
            return problem
        args = call["function"].get("arguments")
        if args is not None:
            problem = o_arguments(args, path + ".function.arguments")
            if problem:
                return problem
    return None


def validate_openai(body: object, *, raw: bytes | None = None) -> str | None:
    """POST /v1/chat/completions."""
    if type(body) is not dict:
        return f"request body: expected a JSON object, got {_type_name(body)}"
    model = body.get("model")
    if not _is_str(model):
        return "model: field required (a string)" if model is None else \
            f"model: expected a string, got {_type_name(model)}"
    if len(model) > MAX_MODEL_NAME_CHARS:
        return model_name_problem(model)
    msgs = body.get("messages")
    if msgs is None:
        return "messages: field required"
    if type(msgs) is not list or not msgs:
        return f"messages: expected a non-empty array, got {_type_name(msgs) if msgs != [] else 'an empty one'}"
    for i, m in enumerate(msgs):
        problem = _o_message(m, i)
        if problem:
            return problem
    st = body.get("stream")
    if st is not None and type(st) is not bool:
        return f"stream: expected a boolean, got {_type_name(st)}"
    for key in ("max_tokens", "max_completion_tokens"):
        mt = body.get(key)
        if mt is not None and (type(mt) is not int or mt < 1):
            return f"{key}: expected a positive integer, got {_type_name(mt)}"
    problem = check_fields(body, O_TOP, "")
    if problem:
        return problem
    for i, t in enumerate(body.get("tools") or ()):
        if type(t) is not dict:
            return f"tools[{i}]: expected an object, got {_type_name(t)}"
        problem = check_fields(t, O_TOOL, f"tools[{i}].")
        if problem:
            return problem
        if t.get("function") is not None:
            problem = check_fields(t["function"], O_FUNCTION, f"tools[{i}].function.")
            if problem:
                return problem
    choice = body.get("tool_choice")
    if type(choice) is dict:
        fn = choice.get("function")
        if fn is not None and (type(fn) is not dict or not _is_str(fn.get("name"))):
            return "tool_choice.function.name: expected a string"
    for key, fields in (("stream_options", O_STREAM_OPTIONS), ("response_format", O_RESPONSE_FORMAT)):
        if body.get(key) is not None:
            problem = check_fields(body[key], fields, f"{key}.")
            if problem:
                return problem
    js = (body.get("response_format") or {}).get("json_schema")
    if js is not None:
        problem = check_fields(js, O_JSON_SCHEMA, "response_format.json_schema.")
        if problem:
            return problem
    return depth_problem(body, raw)
