"""What each tool-call text format looks like once captured, and how it becomes a validated call.

Used by the streaming repairer (`tool_repair.py`); pure functions, no state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import json5
import orjson

_FUNCTION_HEAD = re.compile(r"<function=([^>\s]{1,128})>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\s]{1,128})>(.*?)</parameter>", re.S)
_FENCED_JSON = re.compile(r"```(?:json|JSON|json5)?[ \t]*\n(.*)\n[ \t]*```", re.S)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    required: tuple[str, ...] = ()
    types: dict[str, str] = field(default_factory=dict)  # property -> JSON-schema type, where declared


@dataclass(frozen=True, slots=True)
class RepairedCall:
    name: str
    arguments: dict
    format: str

    def arguments_json(self) -> str:
        return orjson.dumps(self.arguments).decode()


def offered_tools(body: dict) -> dict[str, ToolSpec]:
    """The tools a request offers, from either wire's shape (Anthropic ``input_schema`` or OpenAI
    ``function.parameters``). Tools without a name (server tools) are left out."""
    tools: dict[str, ToolSpec] = {}
    for tool in body.get("tools") or ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        fn = function if isinstance(function, dict) else tool
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        schema = fn.get("input_schema") if "input_schema" in fn else fn.get("parameters")
        schema = schema if isinstance(schema, dict) else {}
        required = tuple(r for r in schema.get("required") or () if isinstance(r, str))
        properties = schema.get("properties")
        props = properties if isinstance(properties, dict) else {}
        types = {k: v["type"] for k, v in props.items() if isinstance(v, dict) and isinstance(v.get("type"), str)}
        tools[name] = ToolSpec(name, required, types)
    return tools


class RepairSetting(Protocol):
    """A provider's config as tool repair reads it (config/schema.py's ProviderConfig)."""

    @property
    def tool_repair(self) -> str: ...

    def is_local(self) -> bool: ...


def repair_tools_for(provider_cfg: RepairSetting, body: dict) -> Mapping[str, ToolSpec] | None:
    """The tools to repair calls against for this provider and request, or None when repair does not apply:
    switched off, a remote provider under "auto", no tools offered, or tool_choice "none"."""
    mode = provider_cfg.tool_repair
    if mode == "off" or not body.get("tools"):
        return None
    choice = body.get("tool_choice")
    if choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
        return None
    if mode == "auto" and not provider_cfg.is_local():
        return None
    tools = body["tools"]
    if not isinstance(tools, list) or not any(_named(t) for t in tools):
        return None
    return OfferedTools(tools)


def _named(tool: object) -> bool:
    if not isinstance(tool, dict):
        return False
    function = tool.get("function")
    fn = function if isinstance(function, dict) else tool
    return isinstance(fn.get("name"), str) and bool(fn.get("name"))


class OfferedTools(Mapping[str, ToolSpec]):
    """`offered_tools` of a request, built on first use. Most answers carry no tool-call text at all, so the
    repairer never looks a tool up; building the specs of Claude Code's ~20 tools costs more than the rest of
    the repair on a plain answer (bench/README.md, "Tail and big body")."""

    __slots__ = ("_tools", "_specs")

    def __init__(self, tools: list) -> None:
        self._tools = tools
        self._specs: dict[str, ToolSpec] | None = None

    def _built(self) -> dict[str, ToolSpec]:
        if self._specs is None:
            self._specs = offered_tools({"tools": self._tools})
        return self._specs

    def __getitem__(self, name: str) -> ToolSpec:
        return self._built()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())

    def __bool__(self) -> bool:  # at least one named tool, checked before building (repair_tools_for)
        return True


def loads_near_json(text: str) -> object:
    """Strict JSON first (fast), then JSON with raw control characters in strings (models write literal
    newlines in file contents), then JSON5 (trailing commas, single quotes, comments). Raises ValueError."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text, strict=False)
    except ValueError:
        pass
    return json5.loads(text)


def json_end(text: str, start: int) -> int:
    """Index just past the JSON value (object or array) that opens at ``start``; -1 while it is unbalanced.
    String-aware, so brackets inside string values do not count."""
    depth = 0
    in_str: str | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == in_str:
                in_str = None
        elif ch in "\"'":
            in_str = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _arguments(value: object) -> dict | None:
    if value is None:
        return {}
    if isinstance(value, str):  # arguments written as a JSON string
        try:
            value = loads_near_json(value) if value.strip() else {}
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _call_from_object(obj: object, fmt: str, tools: Mapping[str, ToolSpec], *, need_arguments: bool = False
                      ) -> RepairedCall | None:
    if not isinstance(obj, dict):
        return None
    function = obj.get("function")
    fn = function if isinstance(function, dict) else obj
    name = fn.get("name")
    if not isinstance(name, str):
        return None
    key = next((k for k in ("arguments", "parameters", "args", "input") if k in fn), None)
    if key is None and need_arguments:
        return None
    if key is None and len(fn) > 1 + ("type" in fn) + ("id" in fn):
        return None  # other keys than a name: not the shape of a call
    return _validated(name, _arguments(fn.get(key)) if key else {}, fmt, tools)


def _validated(name: str, args: dict | None, fmt: str, tools: Mapping[str, ToolSpec]) -> RepairedCall | None:
    spec = tools.get(name)
    if spec is None or args is None:
        return None
    if any(r not in args for r in spec.required):
        return None
    return RepairedCall(name, args, fmt)


def _typed(value: str, schema_type: str | None) -> object:
    if schema_type in (None, "string"):
        return value
    try:
        return loads_near_json(value)
    except ValueError:
        return value


def _xml_function(body: str, tools: Mapping[str, ToolSpec]) -> RepairedCall | None:
    """``<function=NAME>`` then either ``<parameter=K>v</parameter>``… or a JSON object, then ``</function>``."""
    body = body.strip()
    m = _FUNCTION_HEAD.match(body)
    if not m or not body.endswith("</function>"):
        return None
    name = m.group(1)
    inner = body[m.end():-len("</function>")]
    if inner.strip().startswith("{"):
        try:
            parsed = loads_near_json(inner.strip())
        except ValueError:
            return None
        return _validated(name, parsed if isinstance(parsed, dict) else None, "function", tools)
    spec = tools.get(name)
    args: dict[str, object] = {}
    pos = 0
    for pm in _PARAMETER.finditer(inner):
        if pm.start() != pos:
            return None
        pos = pm.end()
        value = pm.group(2)
        # The template frames each value with one newline on either side; they are not part of the value.
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[pm.group(1)] = _typed(value, spec.types.get(pm.group(1)) if spec else None)
    if inner[pos:].strip():
        return None
    return _validated(name, args, "qwen_xml", tools)


def parse_capture(fmt: str, text: str, tools: Mapping[str, ToolSpec]) -> list[RepairedCall] | None:
    """The calls in one captured markup (opening marker included), or None when it is not a valid call."""
    text = text.strip()
    if fmt == "hermes":
        body = text[len("<tool_call>"):-len("</tool_call>")].strip()
        if body.startswith("<function="):
            call = _xml_function(body, tools)
            return [call] if call else None
        try:
            obj = loads_near_json(body)
        except ValueError:
            return None
        call = _call_from_object(obj, "hermes", tools)
        return [call] if call else None
    if fmt == "function":
        call = _xml_function(text, tools)
        return [call] if call else None
    if fmt in ("mistral", "python_tag", "bare", "fenced"):
        if fmt == "fenced":
            m = _FENCED_JSON.fullmatch(text)
            if not m:
                return None
            payload = m.group(1).strip()
        else:
            payload = text[len("[TOOL_CALLS]"):] if fmt == "mistral" else \
                text[len("<|python_tag|>"):] if fmt == "python_tag" else text
        payload = payload.strip()
        if fmt == "mistral" and "[ARGS]" in payload and payload[:1] not in "{[":
            name, _, raw_args = payload.partition("[ARGS]")
            try:
                args = loads_near_json(raw_args.strip())
            except ValueError:
                return None
            call = _validated(name.strip(), args if isinstance(args, dict) else None, "mistral", tools)
            return [call] if call else None
        try:
            obj = loads_near_json(payload)
        except ValueError:
            return None
        items = obj if isinstance(obj, list) and fmt == "mistral" else [obj]
        # A whole-answer JSON must say it is a call: a name and its arguments.
        calls = [_call_from_object(o, fmt, tools, need_arguments=fmt in ("bare", "fenced")) for o in items]
        if not calls or any(c is None for c in calls):
            return None
        return calls  # type: ignore[return-value]
    return None
