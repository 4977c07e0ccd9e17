"""Anthropic Messages request -> OpenAI chat.completions request (an Anthropic client in front of an
OpenAI-speaking upstream; the answer comes back through openai_answer_to_anthropic.py)."""

from __future__ import annotations

import orjson

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
TOOL_IMAGE_PLACEHOLDER = "[image attached in the next user message]"

# Top-level request keys that have no OpenAI counterpart and are dropped with a warning.
_DROPPED_TOP_LEVEL = ("metadata", "context_management", "service_tier", "container", "mcp_servers")
# Keys handled explicitly, so they never trigger the "unknown key" warning.
_KNOWN_TOP_LEVEL = frozenset(
    {
        "model", "messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences",
        "temperature", "top_p", "top_k", "stream", "thinking", "output_config", *_DROPPED_TOP_LEVEL,
    }
)


class _Warnings:
    """Collects one warning per dropped kind of thing, in first-seen order."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        if message not in self.items:
            self.items.append(message)


def _not_expressible(what: str) -> str:
    return f"{what} dropped: not expressible on an OpenAI backend"


def _blocks_text(content: str | list | None, warnings: _Warnings, sep: str = "\n\n") -> str:
    """Text of a string-or-blocks content; non-text blocks are dropped with a warning."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content or ():
        if not isinstance(block, dict):
            continue
        if "cache_control" in block:
            warnings.add(_not_expressible("cache_control"))
        btype = block.get("type")
        if btype == "text":
            parts.append(block.get("text", ""))
        elif btype not in ("thinking", "redacted_thinking"):
            warnings.add(_not_expressible(f"{btype} content block"))
    return sep.join(parts)


def _image_part(block: dict, warnings: _Warnings) -> dict | None:
    source = block.get("source") or {}
    stype = source.get("type")
    if stype == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif stype == "url":
        url = source.get("url", "")
    else:
        warnings.add(_not_expressible(f"image source {stype!r}"))
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _document_text(block: dict, warnings: _Warnings) -> str | None:
    source = block.get("source") or {}
    if source.get("type") == "text":
        return source.get("data", "")
    if source.get("type") == "content":
        return _blocks_text(source.get("content"), warnings)
    warnings.add(_not_expressible(f"document source {source.get('type')!r}"))
    return None


def _parts_content(parts: list[dict]) -> str | list[dict]:
    # Text-only content is sent as a plain string: several local chat templates reject part lists.
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _tool_result(block: dict, warnings: _Warnings) -> tuple[dict, list[dict]]:
    """One tool message, plus image parts that must travel in a following user message."""
    content = block.get("content")
    images: list[dict] = []
    if isinstance(content, str) or content is None:
        text = content or ""
    else:
        texts: list[str] = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if "cache_control" in item:
                warnings.add(_not_expressible("cache_control"))
            itype = item.get("type")
            if itype == "text":
                texts.append(item.get("text", ""))
            elif itype == "image":
                part = _image_part(item, warnings)
                if part is not None:
                    images.append(part)
                    texts.append(TOOL_IMAGE_PLACEHOLDER)
            elif itype == "document":
                doc = _document_text(item, warnings)
                if doc is not None:
                    texts.append(doc)
            else:
                warnings.add(_not_expressible(f"{itype} block in tool_result"))
        text = "\n".join(texts)
    if block.get("is_error"):
        text = "Error: " + text
    message = {"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": text}
    return message, images


def _user_messages(content: str | list | None, warnings: _Warnings) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict] = []
    tool_images: list[dict] = []
    parts: list[dict] = []
    for block in content or ():
        if not isinstance(block, dict):
            continue
        if "cache_control" in block:
            warnings.add(_not_expressible("cache_control"))
        btype = block.get("type")
        if btype == "tool_result":
            message, images = _tool_result(block, warnings)
            tool_messages.append(message)
            if images:
                tool_images.append(
                    {"type": "text", "text": f"Image(s) returned by tool call {message['tool_call_id']}:"}
                )
                tool_images.extend(images)
        elif btype == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif btype == "image":
            part = _image_part(block, warnings)
            if part is not None:
                parts.append(part)
        elif btype == "document":
            doc = _document_text(block, warnings)
            if doc is not None:
                parts.append({"type": "text", "text": doc})
        elif btype not in ("thinking", "redacted_thinking"):
            warnings.add(_not_expressible(f"{btype} content block"))
    out = list(tool_messages)
    # Tool-result images come first so they sit next to the tool messages they belong to.
    user_parts = tool_images + parts
    if user_parts:
        out.append({"role": "user", "content": _parts_content(user_parts)})
    return out


def _assistant_message(content: str | list | None, warnings: _Warnings) -> dict | None:
    if isinstance(content, str):
        return {"role": "assistant", "content": content} if content else None
    texts: list[str] = []
    tool_calls: list[dict] = []
    for block in content or ():
        if not isinstance(block, dict):
            continue
        if "cache_control" in block:
            warnings.add(_not_expressible("cache_control"))
        btype = block.get("type")
        if btype == "text":
            if block.get("text"):
                texts.append(block["text"])
        elif btype == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            tool_calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": arguments},
                }
            )
        elif btype not in ("thinking", "redacted_thinking"):
            warnings.add(_not_expressible(f"{btype} content block"))
    if not texts and not tool_calls:
        return None  # e.g. a turn that held only thinking
    message: dict = {"role": "assistant", "content": "\n\n".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _as_parts(content: str | list[dict] | None) -> list[dict]:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def _merged_user(group: list[dict]) -> dict:
    """One user message for a run of them: the same content as merging them pairwise (text-only content
    joined with blank lines, a part list once an image or document is among them), in one pass."""
    texts: list[str] = []  # while every part so far is text
    parts: list[dict] | None = None  # from the first part that is not
    for m in group:
        new = _as_parts(m["content"])
        if parts is None and all(p["type"] == "text" for p in new):
            if len(texts) == 1 and not texts[0]:
                texts.clear()  # an empty text so far adds no separator (as an empty string content)
            texts.extend(p["text"] for p in new)
            continue
        if parts is None:
            joined = "\n\n".join(texts)
            parts = [{"type": "text", "text": joined}] if joined else []
        parts.extend(new)
    return {"role": "user", "content": parts if parts is not None else "\n\n".join(texts)}


def _merged_assistant(group: list[dict]) -> dict:
    texts = [m["content"] for m in group if m.get("content")]
    message: dict = {"role": "assistant", "content": "\n\n".join(texts) if texts else None}
    calls = [c for m in group for c in m.get("tool_calls", ())]
    if calls:
        message["tool_calls"] = calls
    return message


def _merge_runs(messages: list[dict]) -> list[dict]:
    """Consecutive user (or assistant) messages become one, as chat templates expect roles to alternate.
    Each run is merged once, at its end: linear in the request, however many messages a run holds."""
    out: list[dict] = []
    i, n = 0, len(messages)
    while i < n:
        role = messages[i]["role"]
        j = i + 1
        if role in ("user", "assistant"):
            while j < n and messages[j]["role"] == role:
                j += 1
        if j - i == 1:
            out.append(messages[i])
        else:
            group = messages[i:j]
            out.append(_merged_user(group) if role == "user" else _merged_assistant(group))
        i = j
    return out


def _system_texts(system: str | list | None, warnings: _Warnings) -> list[str]:
    if isinstance(system, str):
        return [system] if system else []
    texts: list[str] = []
    for block in system or ():
        if not isinstance(block, dict):
            continue
        if "cache_control" in block:
            warnings.add(_not_expressible("cache_control"))
        text = block.get("text", "")
        # The billing header changes every session and would defeat the backend's prefix cache.
        if block.get("type") == "text" and text and not text.lstrip().startswith(BILLING_HEADER_PREFIX):
            texts.append(text)
    return texts


def _tool(tool: dict, warnings: _Warnings) -> dict | None:
    if "cache_control" in tool:
        warnings.add(_not_expressible("cache_control"))
    ttype = tool.get("type")
    if ttype not in (None, "custom") and "input_schema" not in tool:
        warnings.add(_not_expressible(f"server tool {ttype}"))
        return None
    schema = tool.get("input_schema") or {"type": "object", "properties": {}}
    if "$schema" in schema:
        schema = {k: v for k, v in schema.items() if k != "$schema"}
    function: dict = {"name": tool.get("name", "")}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = schema
    return {"type": "function", "function": function}


def _tool_choice(choice: dict) -> str | dict | None:
    ctype = choice.get("type")
    if ctype == "auto":
        return "auto"
    if ctype == "any":
        return "required"
    if ctype == "none":
        return "none"
    if ctype == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return None


def force_named_tool_as_required(req: dict) -> dict:
    """For a server that reads `tool_choice` only as a string (llama-server): a named tool choice becomes
    "required" with only that tool offered, which constrains the model the same way. Returns `req` itself
    when there is nothing to change."""
    choice = req.get("tool_choice")
    if not isinstance(choice, dict):
        return req
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    tools = req.get("tools")
    if not isinstance(name, str) or not isinstance(tools, list):
        return req
    named = [t for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
             and t["function"].get("name") == name]
    if not named:
        return req
    return {**req, "tools": named, "tool_choice": "required"}


def request_to_openai(body: dict, model: str, *, stream: bool) -> tuple[dict, list[str]]:
    """Translate an Anthropic Messages request for ``model``; returns (request, warnings)."""
    warnings = _Warnings()
    system_texts = _system_texts(body.get("system"), warnings)
    messages: list[dict] = []
    for entry in body.get("messages") or ():
        role = entry.get("role")
        content = entry.get("content")
        if role == "system":
            # Many templates (Qwen3's among them) reject a system message anywhere but first.
            text = _blocks_text(content, warnings)
            if text:
                system_texts.append(text)
        elif role == "assistant":
            msg = _assistant_message(content, warnings)
            if msg is not None:
                messages.append(msg)
        else:
            messages.extend(_user_messages(content, warnings))
    messages = _merge_runs(messages)
    if system_texts:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system_texts)})

    req: dict = {"model": model, "messages": messages}

    tools = [t for t in (_tool(tool, warnings) for tool in body.get("tools") or ()) if t is not None]
    if tools:
        req["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            mapped = _tool_choice(choice)
            if mapped is not None:
                req["tool_choice"] = mapped
            if choice.get("disable_parallel_tool_use"):
                req["parallel_tool_calls"] = False

    if body.get("max_tokens") is not None:
        req["max_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            req[key] = body[key]
    if body.get("stop_sequences"):
        req["stop"] = list(body["stop_sequences"])

    output_config = body.get("output_config")
    if isinstance(output_config, dict):
        fmt = output_config.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            req["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": fmt.get("schema") or {}},
            }
        for key in output_config:
            if key != "format":
                warnings.add(_not_expressible(f"output_config.{key}"))

    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        req["chat_template_kwargs"] = {"enable_thinking": False}

    req["stream"] = stream
    if stream:
        req["stream_options"] = {"include_usage": True}

    for key in _DROPPED_TOP_LEVEL:
        if key in body:
            warnings.add(_not_expressible(key))
    for key in body:
        if key not in _KNOWN_TOP_LEVEL:
            warnings.add(_not_expressible(key))
    return req, warnings.items
