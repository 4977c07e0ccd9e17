"""OpenAI chat.completions request -> Anthropic Messages request (an OpenAI-shaped client in front of an
Anthropic-speaking upstream; the answer comes back through anthropic_answer_to_openai.py)."""

from __future__ import annotations

from coderouterd.translate.tool_arguments import parse_tool_arguments

DEFAULT_MAX_TOKENS = 4096


def _parts_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _image_block(part: dict) -> dict:
    image = part.get("image_url")
    url = image.get("url", "") if isinstance(image, dict) else str(image or "")
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _user_blocks(content: str | list | None) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict] = []
    for part in content or ():
        if not isinstance(part, dict):
            continue
        ptype = part.get("type")
        if ptype == "text" and part.get("text"):
            blocks.append({"type": "text", "text": part["text"]})
        elif ptype == "image_url":
            blocks.append(_image_block(part))
    return blocks


def _assistant_blocks(msg: dict) -> list[dict]:
    # Reasoning from earlier turns is not sent back: Anthropic would reject it without a real signature.
    blocks: list[dict] = []
    text = _parts_text(msg.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in msg.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name") or "",
                "input": parse_tool_arguments(function.get("arguments")),
            }
        )
    return blocks


def _append(messages: list[dict], role: str, blocks: list[dict]) -> None:
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _tool_choice(choice: object) -> dict | None:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    return None


def openai_request_to_anthropic(body: dict, model: str) -> dict:
    """Translate an OpenAI chat.completions request into an Anthropic Messages request."""
    system: list[str] = []
    messages: list[dict] = []
    for msg in body.get("messages") or ():
        role = msg.get("role")
        if role in ("system", "developer"):
            text = _parts_text(msg.get("content"))
            if text:
                system.append(text)
        elif role == "assistant":
            _append(messages, "assistant", _assistant_blocks(msg))
        elif role in ("tool", "function"):
            result = {
                "type": "tool_result",
                "tool_use_id": msg.get("tool_call_id") or msg.get("name") or "",
                "content": _parts_text(msg.get("content")),
            }
            _append(messages, "user", [result])
        else:
            _append(messages, "user", _user_blocks(msg.get("content")))

    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    req: dict = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if system:
        req["system"] = "\n\n".join(system)

    tools = []
    for tool in body.get("tools") or ():
        function = tool.get("function") if tool.get("type") == "function" else None
        if not isinstance(function, dict):
            continue
        entry: dict = {"name": function.get("name", "")}
        if function.get("description"):
            entry["description"] = function["description"]
        entry["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
        tools.append(entry)
    if tools:
        req["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice is not None:
            req["tool_choice"] = choice

    stop = body.get("stop")
    if isinstance(stop, str):
        req["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        req["stop_sequences"] = list(stop)
    if body.get("temperature") is not None:
        # OpenAI allows up to 2, Anthropic up to 1.
        req["temperature"] = min(float(body["temperature"]), 1.0)
    for key in ("top_p", "top_k"):
        if body.get(key) is not None:
            req[key] = body[key]
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        req["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    req["stream"] = bool(body.get("stream"))
    return req
