"""Gemini API requests (`models/{model}:generateContent`, what Gemini CLI and google-genai send) as OpenAI
chat-completions bodies.

The chat body is the canonical form the router works on (guards, budgets, affinity and both upstream translators
read it), as for the Responses ingress. What chat cannot say (the client's tool names when they are not valid
upstream names, whether thoughts are wanted back, a JSON answer to be had through a forced tool) is kept in the
`GeminiRequest`, so the answer can be written back exactly as a Gemini client reads it.

The body is validated first (ingress/validate_gemini.py): this module reads the shapes it checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

from ..ids import new_id

# Upstream function names must match ^[a-zA-Z0-9_-]{1,64}$ (OpenAI, Anthropic); Gemini also allows dots and
# colons (MCP tools) and 128 characters. Others are renamed on the way up and back on the way down.
_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
# The forced tool that carries a JSON answer for an upstream with no structured output (an Anthropic one).
JSON_TOOL = "structured_output"
# Gemini's OpenAPI subset in `parameters`: which keys keep their meaning in JSON Schema (the rest are dropped:
# `propertyOrdering`, `example`, ... mean nothing to an upstream's schema check).
_SCHEMA_KEYS = frozenset({"description", "enum", "format", "title", "default", "pattern", "minimum", "maximum",
                          "required"})
# int64 fields that proto JSON writes as strings ("1").
_SCHEMA_INTS = frozenset({"minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"})
_TOOL_KINDS_DROPPED = ("googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "googleMaps",
                       "computerUse", "fileSearch", "retrieval", "enterpriseWebSearch")


class GeminiRequestError(ValueError):
    """A request this daemon will not serve: `param` names the field, for a 400 INVALID_ARGUMENT."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(slots=True)
class GeminiRequest:
    """One Gemini request: the client's body, its chat translation and what is needed to answer it."""

    body: dict
    chat: dict
    model: str  # as the path named it (`models/` stripped)
    stream: bool
    sse: bool  # streamed as SSE `data:` lines (`?alt=sse`), else as one JSON array written as it grows
    response_id: str
    # upstream tool name -> the client's, for names an upstream would refuse
    names: dict[str, str] = field(default_factory=dict)
    include_thoughts: bool = False
    # JSON Schema of the answer (responseMimeType application/json): for an upstream without structured output it
    # becomes the forced tool JSON_TOOL, whose arguments are the answer's text.
    json_schema: dict | None = None
    json_mode: bool = False
    dropped_tools: list[str] = field(default_factory=list)
    raw: bytes = b""

    @property
    def notes(self) -> list[str]:
        """For the decision trace: what the upstream will not see."""
        return [f"Gemini tool {t!r} dropped: no upstream runs it" for t in self.dropped_tools]

    @property
    def session_key(self) -> str | None:
        # `cachedContent` names a cached prefix: the client's own name for what the session shares.
        key = self.body.get("cachedContent")
        return key if isinstance(key, str) and key else None

    def client_tool_name(self, upstream: str) -> str:
        return self.names.get(upstream, upstream)


# -- field names ------------------------------------------------------------------------------------------------
# The Gemini API reads proto JSON, which takes a field by its lowerCamel name or its proto name: google-genai writes
# nested messages in snake_case ({"inlineData": {"mime_type": ...}}, "thinkingConfig": {"include_thoughts": true}).
# Both become lowerCamel before anything reads the body, except inside the values that are the client's own data
# (call arguments, function results, JSON Schemas, property names).

_FREE = object()  # a value that is data: its keys are kept as they are


class _Map:
    """A map from the client's own names (a schema's `properties`) to messages of one kind."""

    __slots__ = ("spec",)

    def __init__(self, spec: dict) -> None:
        self.spec = spec


_SCHEMA_SPEC: dict = {}
_SCHEMA_SPEC.update({"properties": _Map(_SCHEMA_SPEC), "items": _SCHEMA_SPEC, "anyOf": _SCHEMA_SPEC,
                     "default": _FREE, "example": _FREE, "enum": _FREE})
_MEDIA_SPEC: dict = {"inlineData": {}, "fileData": {}}
_PART_SPEC: dict = {**_MEDIA_SPEC, "functionCall": {"args": _FREE},
                    "functionResponse": {"response": _FREE, "parts": _MEDIA_SPEC}}
_CONTENT_SPEC: dict = {"parts": _PART_SPEC}
_BODY_SPEC: dict = {
    "contents": _CONTENT_SPEC, "systemInstruction": _CONTENT_SPEC,
    "tools": {"functionDeclarations": {"parameters": _SCHEMA_SPEC, "parametersJsonSchema": _FREE,
                                       "response": _SCHEMA_SPEC, "responseJsonSchema": _FREE}},
    "generationConfig": {"responseSchema": _SCHEMA_SPEC, "responseJsonSchema": _FREE},
    "generateContentRequest": {},  # countTokens' long form: filled below with the body's own spec
}
_BODY_SPEC["generateContentRequest"] = _BODY_SPEC
_SNAKE_KEY = re.compile(rb'"[a-z][a-z0-9]*_[a-z0-9_]+"\s*:')


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _walk(value: object, spec: object) -> object:
    if spec is _FREE:
        return value
    if isinstance(value, list):
        return [_walk(v, spec) for v in value]
    if not isinstance(value, dict):
        return value
    if isinstance(spec, _Map):
        return {k: _walk(v, spec.spec) for k, v in value.items()}
    assert isinstance(spec, dict)
    out = {}
    for k, v in value.items():
        key = _camel(k) if "_" in k else k
        out[key] = _walk(v, spec.get(key, {}))
    return out


def camel_keys(body: dict, raw: bytes) -> dict:
    """The body with every field name lowerCamel (see above). Most clients write camelCase already: a body whose
    bytes hold no snake_case key at all is returned as it is, unwalked."""
    if not _SNAKE_KEY.search(raw):
        return body
    walked = _walk(body, _BODY_SPEC)
    assert isinstance(walked, dict)
    return walked


def _upstream_name(name: str, taken: dict[str, str]) -> str:
    if _NAME_OK.match(name):
        return name
    base = _NAME_BAD_CHARS.sub("_", name)[:60] or "tool"
    flat, n = base, 1
    while flat in taken and taken[flat] != name:
        n += 1
        flat = f"{base}_{n}"
    return flat


def gemini_schema(schema: object) -> object:
    """Gemini's Schema (OpenAPI subset, upper-case types, `nullable`, int64 as strings) as JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    out: dict = {}
    t = schema.get("type")
    if isinstance(t, str) and t.upper() != "TYPE_UNSPECIFIED":
        out["type"] = t.lower()
    for key, value in schema.items():
        if key in _SCHEMA_KEYS:
            out[key] = value
        elif key in _SCHEMA_INTS:
            try:
                out[key] = int(value)
            except (TypeError, ValueError):
                continue
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {k: gemini_schema(v) for k, v in value.items()}
        elif key == "items":
            out["items"] = gemini_schema(value)
        elif key == "anyOf" and isinstance(value, list):
            out["anyOf"] = [gemini_schema(v) for v in value]
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


# Gemini's type names, which its clients also write inside JSON Schemas (Gemini CLI's routing classifier sends
# `responseJsonSchema: {"type": "OBJECT", ...}`, which the Gemini API accepts and a grammar builder does not).
_GEMINI_TYPES = frozenset({"OBJECT", "STRING", "INTEGER", "NUMBER", "BOOLEAN", "ARRAY", "NULL"})
_UPPER_TYPE = re.compile(rb'"(?:OBJECT|STRING|INTEGER|NUMBER|BOOLEAN|ARRAY|NULL)"')
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "contains")


def json_schema_types(schema: object) -> object:
    """A JSON Schema with Gemini's upper-case type names lower-cased (nothing else changes)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    t = out.get("type")
    if isinstance(t, str) and t in _GEMINI_TYPES:
        out["type"] = t.lower()
    elif isinstance(t, list):
        out["type"] = [x.lower() if isinstance(x, str) and x in _GEMINI_TYPES else x for x in t]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: json_schema_types(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [json_schema_types(v) for v in out[key]]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = json_schema_types(out[key])
    return out


def _function_tools(tools: list, names: dict[str, str], dropped: list[str], upper: bool) -> list[dict]:
    out: list[dict] = []
    for tool in tools:
        for decl in tool.get("functionDeclarations") or ():
            name = decl["name"]
            flat = _upstream_name(name, names)
            if flat != name:
                names[flat] = name
            fn: dict = {"name": flat}
            if decl.get("description"):
                fn["description"] = decl["description"]
            if isinstance(decl.get("parametersJsonSchema"), dict):
                params = decl["parametersJsonSchema"]
                if upper:
                    params = json_schema_types(params)
            elif isinstance(decl.get("parameters"), dict):
                params = gemini_schema(decl["parameters"])
            else:
                params = {"type": "object", "properties": {}}
            fn["parameters"] = params
            out.append({"type": "function", "function": fn})
        for kind in _TOOL_KINDS_DROPPED:
            if tool.get(kind) is not None:
                dropped.append(kind)
    return out


def _tool_choice(config: dict | None, tools: list[dict], names: dict[str, str]) -> tuple[list[dict], object]:
    """(tools, chat tool_choice) from toolConfig.functionCallingConfig: AUTO/VALIDATED → auto, ANY → required
    (one allowed name → that function), NONE → none; allowedFunctionNames narrows the tools offered."""
    fcc = (config or {}).get("functionCallingConfig") or {}
    mode = str(fcc.get("mode") or "AUTO").upper()
    allowed = fcc.get("allowedFunctionNames")
    if isinstance(allowed, list) and allowed:
        wanted = set(allowed)
        tools = [t for t in tools if names.get(t["function"]["name"], t["function"]["name"]) in wanted]
        if not tools:
            raise GeminiRequestError("toolConfig.functionCallingConfig.allowedFunctionNames",
                                     "allowedFunctionNames names no declared function")
    if mode == "NONE":
        return tools, "none"
    if mode == "ANY":
        if len(tools) == 1:
            return tools, {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        return tools, "required"
    return tools, "auto" if tools else None


def _data_url(mime: str, data: str) -> str:
    return f"data:{mime};base64,{data}"


def _is_media(part: dict) -> bool:
    # A key holding null is absent, as in proto JSON (and as the validation reads it).
    return part.get("inlineData") is not None or part.get("fileData") is not None


def _media_part(part: dict) -> dict:
    """An inlineData / fileData part: an image as an image_url part (the same part every other ingress's images
    become, so `capabilities.vision = false` replaces it with a note the same way); other media as a note,
    never a refusal (Gemini CLI's read_file sends PDFs and audio this way, and a refused turn ends the session)."""
    if part.get("inlineData") is not None:
        blob = part["inlineData"]
        mime = str(blob.get("mimeType") or "")
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": _data_url(mime, str(blob.get("data") or ""))}}
        return {"type": "text", "text": f"[{mime or 'binary'} attachment omitted: the model cannot read it]"}
    ref = part["fileData"]
    mime = str(ref.get("mimeType") or "")
    uri = str(ref.get("fileUri") or "")
    if mime.startswith("image/") and uri.startswith(("http://", "https://")):
        return {"type": "image_url", "image_url": {"url": uri}}
    return {"type": "text", "text": f"[file {uri} ({mime or 'unknown type'}) omitted: the model cannot read it]"}


def _user_content(parts: list[dict]) -> str | list[dict]:
    """Chat content parts; plain text collapses to a string (what local servers and their templates handle best)."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _response_text(response: object) -> str:
    """A functionResponse's `response` as the tool message's text: Gemini CLI sends {"output": text} or
    {"error": text}; anything else goes as its JSON."""
    if isinstance(response, dict):
        if set(response) == {"output"} and isinstance(response["output"], str):
            return response["output"]
        if set(response) == {"error"} and isinstance(response["error"], str):
            return f"Error: {response['error']}"
        if set(response) == {"content"} and isinstance(response["content"], str):
            return response["content"]
    return orjson.dumps(response).decode() if response is not None else ""


class _Conversation:
    """Builds the chat messages from `contents`. Calls get ids (the client's, else one made from their place,
    the same on every turn so prefix caches keep matching); a functionResponse without an id is paired with the
    oldest unanswered call of the same name, else the oldest unanswered call."""

    def __init__(self, names: dict[str, str]) -> None:
        self.messages: list[dict] = []
        self.pending: list[tuple[str, str]] = []  # (call id, client name) of the last model turn, unanswered
        self.upstream = {v: k for k, v in names.items()}  # client name -> upstream name

    def model_turn(self, i: int, parts: list) -> None:
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[dict] = []
        for j, part in enumerate(parts):
            if part.get("functionCall") is not None:
                fc = part["functionCall"]
                name = fc["name"]
                call_id = fc.get("id") or f"call_g{i}_{j}"
                self.pending.append((call_id, name))
                args = fc.get("args")
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": self.upstream.get(name, name),
                                           "arguments": orjson.dumps(args if isinstance(args, dict) else {}).decode()}})
            elif isinstance(part.get("text"), str):
                (reasoning if part.get("thought") is True else text).append(part["text"])
            # executableCode / codeExecutionResult / a bare thoughtSignature have no chat equivalent
        if not (text or calls or reasoning):
            return
        msg: dict = {"role": "assistant", "content": "".join(text) or (None if calls else "")}
        if calls:
            msg["tool_calls"] = calls
        if reasoning:
            msg["reasoning_content"] = "".join(reasoning)
        self.messages.append(msg)

    def _answer(self, fr: dict) -> str:
        given = fr.get("id")
        if isinstance(given, str) and given:
            for k, (cid, _n) in enumerate(self.pending):
                if cid == given:
                    del self.pending[k]
                    return given
            return given
        name = fr.get("name")
        for k, (cid, n) in enumerate(self.pending):
            if n == name:
                del self.pending[k]
                return cid
        if self.pending:
            return self.pending.pop(0)[0]
        raise GeminiRequestError("contents", f"functionResponse {name!r} answers no functionCall of the turn "
                                             "before it")

    def user_turn(self, parts: list) -> None:
        tools: list[dict] = []
        rest: list[dict] = []
        media_after_tools: list[dict] = []
        for part in parts:
            if part.get("functionResponse") is not None:
                fr = part["functionResponse"]
                tools.append({"role": "tool", "tool_call_id": self._answer(fr),
                              "content": _response_text(fr.get("response"))})
                # Gemini 3's multimodal function responses: the media follow as user content (tool messages
                # are text-only in chat).
                for inner in fr.get("parts") or ():
                    if isinstance(inner, dict) and _is_media(inner):
                        media_after_tools.append(_media_part(inner))
            elif _is_media(part):
                rest.append(_media_part(part))
            elif isinstance(part.get("text"), str) and part.get("thought") is not True:
                rest.append({"type": "text", "text": part["text"]})
        self.pending = []
        self.messages.extend(tools)
        rest = media_after_tools + rest
        if rest:
            self.messages.append({"role": "user", "content": _user_content(rest)})


def _system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, dict):
        return "\n".join(p["text"] for p in system.get("parts") or () if isinstance(p.get("text"), str))
    return ""


# thinkingBudget -> reasoning_effort (the only control every chat upstream reads); 0 turns thinking off.
def _effort(thinking: dict) -> str | None:
    level = thinking.get("thinkingLevel")
    if isinstance(level, str) and level.lower() in ("minimal", "low", "medium", "high"):
        return "low" if level.lower() == "minimal" else level.lower()
    budget = thinking.get("thinkingBudget")
    if not isinstance(budget, int) or budget < 0:
        return None  # -1: dynamic, the upstream's own default
    if budget == 0:
        return "none"
    return "low" if budget <= 1024 else "medium" if budget <= 8192 else "high"


def translate_request(body: dict, model: str, *, stream: bool, sse: bool, raw: bytes | None = None) -> GeminiRequest:
    """The Gemini body (already validated) as a chat-completions body plus the context to answer it. `raw`: its
    bytes, to skip looking for upper-case type names in JSON Schemas when there are none."""
    upper = raw is None or _UPPER_TYPE.search(raw) is not None
    gen = body.get("generationConfig") or {}
    count = gen.get("candidateCount")
    if count is not None and count not in (0, 1):  # 0 is proto3's "unset"
        raise GeminiRequestError("generationConfig.candidateCount",
                                 f"candidateCount {count} is not supported by coderouterd: only 1 candidate")
    names: dict[str, str] = {}
    dropped: list[str] = []
    tools = _function_tools(body.get("tools") or [], names, dropped, upper)
    conv = _Conversation(names)
    for i, content in enumerate(body.get("contents") or ()):
        if content.get("role") == "model":
            conv.model_turn(i, content.get("parts") or [])
        else:  # "user" (or "function", the older role of function responses)
            conv.user_turn(content.get("parts") or [])
    messages = conv.messages
    system = _system_text(body.get("systemInstruction"))
    if system:
        messages = [{"role": "system", "content": system}] + messages
    chat: dict = {"model": model, "messages": messages, "stream": stream}
    if tools:
        tools, choice = _tool_choice(body.get("toolConfig"), tools, names)
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    if isinstance(gen.get("maxOutputTokens"), int):
        chat["max_tokens"] = gen["maxOutputTokens"]
    for src, dst in (("temperature", "temperature"), ("topP", "top_p"), ("seed", "seed"),
                     ("presencePenalty", "presence_penalty"), ("frequencyPenalty", "frequency_penalty")):
        if gen.get(src) is not None:
            chat[dst] = gen[src]
    if gen.get("stopSequences"):
        chat["stop"] = list(gen["stopSequences"])
    thinking = gen.get("thinkingConfig") or {}
    effort = _effort(thinking)
    if effort is not None:
        chat["reasoning_effort"] = effort
    json_schema = None
    json_mode = gen.get("responseMimeType") == "application/json"
    if json_mode:
        if isinstance(gen.get("responseJsonSchema"), dict):
            json_schema = gen["responseJsonSchema"]
            if upper:
                schema_ = json_schema_types(json_schema)
                json_schema = schema_ if isinstance(schema_, dict) else json_schema
        elif isinstance(gen.get("responseSchema"), dict):
            schema = gemini_schema(gen["responseSchema"])
            json_schema = schema if isinstance(schema, dict) else None
        if json_schema is not None:
            chat["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "response", "schema": json_schema}}
        else:
            chat["response_format"] = {"type": "json_object"}
    return GeminiRequest(body=body, chat=chat, model=model, stream=stream, sse=sse, response_id=new_id("resp"),
                         names=names, include_thoughts=thinking.get("includeThoughts") is True,
                         json_schema=json_schema, json_mode=json_mode, dropped_tools=dropped)
