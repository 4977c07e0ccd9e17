"""OpenAI Responses API requests (what Codex CLI sends) as OpenAI chat-completions bodies.

The chat body is the canonical form the router works on: guards, budgets and the Anthropic translator all read
it. What cannot be said in chat (namespaced tools, hosted tools, encrypted reasoning) is recorded in the
`ResponsesRequest` so that the answer can be turned back into exactly what the client expects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from ..ids import new_id

# Tools the Responses API runs on OpenAI's side; a chat upstream cannot run them, so they are dropped.
HOSTED_TOOL_TYPES = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "code_interpreter",
    "computer_use_preview", "image_generation", "mcp", "local_shell", "tool_search",
})
# Separator between a namespace and its function in a flattened tool name. Function names upstream must
# match ^[a-zA-Z0-9_-]{1,64}$ (OpenAI, Anthropic), so no dot or slash.
NS_SEP = "__"

_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "none": "none"}


class ResponsesRequestError(ValueError):
    """A request this daemon will not serve: `param` names the field, for a 400 in OpenAI's shape."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(slots=True)
class ResponsesRequest:
    """One Responses request: the client's body, its chat translation and what is needed to answer it."""

    body: dict
    chat: dict
    response_id: str
    created_at: int
    # flattened function name -> (namespace, name) for tools that came inside a `namespace` tool
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    dropped_tools: list[str] = field(default_factory=list)
    # (provider-issued) encrypted reasoning carried by the input, for a passthrough to the provider that issued it
    has_encrypted_reasoning: bool = False
    raw: bytes = b""  # the client's body as it came, for an upstream that serves the Responses API itself

    @property
    def notes(self) -> list[str]:
        """For the decision trace: what a translating upstream will not see."""
        return [f"hosted tool {t!r} dropped for upstreams without the Responses API" for t in self.dropped_tools]

    @property
    def session_key(self) -> str | None:
        key = self.body.get("prompt_cache_key")
        return key if isinstance(key, str) and key else None

    def client_tool_name(self, flat: str) -> tuple[str | None, str]:
        """(namespace, name) as the client declared the tool the model called by its flattened name."""
        ns = self.namespaced.get(flat)
        return ns if ns is not None else (None, flat)


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                t = p.get("text") if p.get("type") in ("input_text", "output_text", "text", "summary_text") else None
                if t is None and p.get("type") == "refusal":
                    t = p.get("refusal")
                if isinstance(t, str):
                    parts.append(t)
            elif isinstance(p, str):
                parts.append(p)
        return "".join(parts)
    return ""


def _user_parts(content: str | list | None) -> str | list[dict]:
    """Responses input parts as chat content parts; plain text collapses to a string (what local servers
    and their templates handle best)."""
    if isinstance(content, str):
        return content
    parts: list[dict] = []
    for p in content or ():
        if not isinstance(p, dict):
            continue
        ptype = p.get("type")
        if ptype in ("input_text", "output_text", "text"):
            text = p.get("text")
            parts.append({"type": "text", "text": text if isinstance(text, str) else ""})  # validated: defence
        elif ptype == "input_image":
            url = p.get("image_url")
            if isinstance(url, str) and url:
                image: dict = {"url": url}
                if p.get("detail") in ("low", "high", "auto"):
                    image["detail"] = p["detail"]
                parts.append({"type": "image_url", "image_url": image})
    if all(x["type"] == "text" for x in parts):
        return "".join(x["text"] for x in parts)
    return parts


def _tool_output(output: object) -> str | list[dict]:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _user_parts(output)
    return orjson.dumps(output).decode() if output is not None else ""


class _Messages:
    """Builds the chat message list: consecutive assistant pieces (text, reasoning, calls) merge into one
    assistant message, as chat requires the calls of one turn to sit in one message. An assistant message's
    text and reasoning are gathered as lists and joined once by `done`: linear however many pieces merge."""

    def __init__(self) -> None:
        self.system: list[str] = []
        self.messages: list[dict] = []
        self._pending_reasoning: list[str] = []

    def _assistant(self) -> dict:
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": None}
            self.messages.append(last)
        if self._pending_reasoning:
            last.setdefault("reasoning_content", []).append("\n\n".join(self._pending_reasoning))
            self._pending_reasoning = []
        return last

    def assistant_text(self, text: str) -> None:
        msg = self._assistant()
        if msg.get("tool_calls"):  # text after calls in the same turn: a new message keeps the order
            msg = {"role": "assistant", "content": None}
            self.messages.append(msg)
        if msg["content"] is None:
            msg["content"] = []
        msg["content"].append(text)

    def tool_call(self, call: dict) -> None:
        self._assistant().setdefault("tool_calls", []).append(call)

    def reasoning(self, text: str) -> None:
        if text:
            self._pending_reasoning.append(text)

    def add(self, msg: dict) -> None:
        self._pending_reasoning = []  # reasoning belongs to the assistant turn that follows it, if any
        self.messages.append(msg)

    def done(self) -> list[dict]:
        for m in self.messages:
            if m["role"] == "assistant":
                if isinstance(m["content"], list):
                    m["content"] = "".join(m["content"])
                if "reasoning_content" in m:
                    m["reasoning_content"] = "\n\n".join(m["reasoning_content"])
        return self.messages


def _flatten_tools(tools: list | None, namespaced: dict[str, tuple[str, str]], dropped: list[str]) -> list[dict]:
    out: list[dict] = []
    plain: set[str] = set()
    for t in tools or ():
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str):
            plain.add(t["name"])
    # Next suffix to try per flattened name: n tools under one name take n tries in all, not n² (and names
    # grow by digits, not by one "_" per duplicate).
    suffix: dict[str, int] = {}
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        ttype = t.get("type")
        if ttype == "function":
            out.append(_chat_tool(t["name"], t))
        elif ttype == "namespace":
            ns = str(t.get("name") or "")
            for inner in t.get("tools") or ():
                if not isinstance(inner, dict) or inner.get("type", "function") != "function":
                    continue
                name = str(inner.get("name") or "")
                flat = base = f"{ns}{NS_SEP}{name}"
                while flat in plain or flat in namespaced:  # never shadow a plain function of the same name
                    n = suffix.get(base, 1) + 1
                    suffix[base] = n
                    flat = f"{base}_{n}"
                namespaced[flat] = (ns, name)
                desc = inner.get("description") or ""
                if t.get("description"):
                    desc = f"{desc}\n\n({ns}: {t['description']})" if desc else f"({ns}: {t['description']})"
                out.append(_chat_tool(flat, {**inner, "description": desc}))
        elif isinstance(ttype, str):
            dropped.append(ttype if ttype != "custom" else f"custom:{t.get('name')}")
    return out


def _chat_tool(name: str, t: dict) -> dict:
    fn: dict = {"name": name}
    if t.get("description"):
        fn["description"] = t["description"]
    fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
    if t.get("strict") is True:
        fn["strict"] = True
    return {"type": "function", "function": fn}


def _flat_names(namespaced: dict[str, tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> the first flattened name given to it: one lookup per call item, not a scan."""
    by_pair: dict[tuple[str, str], str] = {}
    for flat, pair in namespaced.items():
        by_pair.setdefault(pair, flat)
    return by_pair


def _flat_name(item: dict, by_pair: dict[tuple[str, str], str]) -> str:
    name = str(item.get("name") or "")
    ns = item.get("namespace")
    if not ns:
        return name
    return by_pair.get((ns, name)) or f"{ns}{NS_SEP}{name}"


def _tool_choice(choice: str | dict | None, by_pair: dict[tuple[str, str], str]) -> str | dict | None:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        ctype = choice.get("type")
        if ctype == "function" and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": _flat_name(choice, by_pair)}}
        if ctype == "allowed_tools":
            return "required" if choice.get("mode") == "required" else "auto"
    return None


def translate_request(body: dict) -> ResponsesRequest:
    """The Responses body (already validated) as a chat-completions body plus the context to answer it."""
    if body.get("previous_response_id"):
        raise ResponsesRequestError(
            "previous_response_id",
            "previous_response_id is not supported by coderouterd (it keeps no conversation state): "
            "send the whole conversation in `input`, as Codex does with store=false")
    namespaced: dict[str, tuple[str, str]] = {}
    dropped: list[str] = []
    tools = _flatten_tools(body.get("tools"), namespaced, dropped)
    by_pair = _flat_names(namespaced) if namespaced else {}
    m = _Messages()
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        m.system.append(body["instructions"])
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    encrypted = False
    for item in items or ():
        itype = item.get("type", "message")
        if itype == "message":
            role = item.get("role")
            content = item.get("content")
            if role in ("system", "developer"):
                text = _text_of(content)
                if text:
                    m.system.append(text)
            elif role == "assistant":
                text = _text_of(content)
                if text:
                    m.assistant_text(text)
            else:
                m.add({"role": "user", "content": _user_parts(content)})
        elif itype == "function_call":
            m.tool_call({"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                         "function": {"name": _flat_name(item, by_pair),
                                      "arguments": item.get("arguments") or "{}"}})
        elif itype == "function_call_output":
            m.add({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                   "content": _tool_output(item.get("output"))})
        elif itype == "custom_tool_call":
            m.tool_call({"id": str(item.get("call_id") or ""), "type": "function",
                         "function": {"name": str(item.get("name") or ""),
                                      "arguments": orjson.dumps({"input": item.get("input") or ""}).decode()}})
        elif itype == "custom_tool_call_output":
            m.add({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                   "content": _tool_output(item.get("output"))})
        elif itype == "reasoning":
            encrypted = encrypted or bool(item.get("encrypted_content"))
            summary = "\n\n".join(_text_of([s]) for s in item.get("summary") or () if isinstance(s, dict))
            m.reasoning(summary or _text_of(item.get("content")))
        # other item types (item_reference, web_search_call, …) have no chat equivalent and are left out
    messages = m.done()
    if m.system:
        messages = [{"role": "system", "content": "\n\n".join(m.system)}] + messages
    chat: dict = {"model": body.get("model") or "", "messages": messages, "stream": bool(body.get("stream"))}
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), by_pair)
        if choice is not None:
            chat["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if isinstance(body.get("max_output_tokens"), int):
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p"):
        if isinstance(body.get(key), (int, float)) and not isinstance(body.get(key), bool):
            chat[key] = body[key]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") in _EFFORTS:
        chat["reasoning_effort"] = _EFFORTS[reasoning["effort"]]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_schema":
            schema: dict = {"name": fmt.get("name") or "output", "schema": fmt.get("schema") or {}}
            if fmt.get("strict") is not None:
                schema["strict"] = fmt["strict"]
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif fmt.get("type") == "json_object":
            chat["response_format"] = {"type": "json_object"}
    if isinstance(body.get("prompt_cache_key"), str):
        chat["prompt_cache_key"] = body["prompt_cache_key"]
    if isinstance(body.get("user"), str):
        chat["user"] = body["user"]
    return ResponsesRequest(body=body, chat=chat, response_id=new_id("resp"), created_at=int(time.time()),
                            namespaced=namespaced, dropped_tools=dropped, has_encrypted_reasoning=encrypted)
