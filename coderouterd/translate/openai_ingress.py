"""OpenAI-shaped clients in front of an Anthropic-speaking upstream (the reverse direction)."""

from __future__ import annotations

import secrets
import time

import orjson

from coderouterd.translate.openai_to_anthropic import parse_tool_arguments

DEFAULT_MAX_TOKENS = 4096

_STOP_TO_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def anthropic_stop_to_openai(stop_reason: str | None) -> str:
    return _STOP_TO_FINISH.get(stop_reason or "end_turn", "stop")


def new_completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def _parts_text(content) -> str:
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


def _user_blocks(content) -> list[dict]:
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


def _tool_choice(choice) -> dict | None:
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


def openai_usage(usage: dict | None) -> dict:
    usage = usage or {}
    cached = usage.get("cache_read_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + cached + (usage.get("cache_creation_input_tokens") or 0)
    completion = usage.get("output_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def anthropic_response_to_openai(resp: dict, model: str, *, created: int | None = None) -> dict:
    """Translate a non-streaming Anthropic message into a chat.completion."""
    texts: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict] = []
    for block in resp.get("content") or ():
        btype = block.get("type")
        if btype == "text":
            texts.append(block.get("text", ""))
        elif btype == "thinking":
            reasoning.append(block.get("thinking", ""))
        elif btype == "tool_use":
            tool_calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
    text = "".join(texts)
    message: dict = {"role": "assistant", "content": text if text or not tool_calls else None}
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    finish = "tool_calls" if tool_calls else anthropic_stop_to_openai(resp.get("stop_reason"))
    return {
        "id": new_completion_id(),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": openai_usage(resp.get("usage")),
    }


class AnthropicStreamToOpenAI:
    """State machine: parsed Anthropic stream events in, OpenAI chunk dicts out."""

    def __init__(
        self, model: str, *, include_usage: bool, completion_id: str | None = None, created: int | None = None
    ) -> None:
        self.model = model
        self.include_usage = include_usage
        self.completion_id = completion_id or new_completion_id()
        self.created = int(time.time()) if created is None else created
        self._role_sent = False
        self._finish_sent = False
        self._finished = False
        self._tool_index: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_calls index
        self._usage = {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        self._started_content = False

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def _emit(self, out: list[dict], delta: dict, finish_reason: str | None = None) -> None:
        if not self._role_sent:
            self._role_sent = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        out.append(self._chunk(delta, finish_reason))

    def _record_usage(self, usage: dict | None) -> None:
        for key in self._usage:
            value = (usage or {}).get(key)
            if isinstance(value, int):
                self._usage[key] = value

    def feed(self, event: dict) -> list[dict]:
        out: list[dict] = []
        if self._finished:
            return out
        etype = event.get("type")
        if etype == "message_start":
            self._record_usage((event.get("message") or {}).get("usage"))
            if not self._role_sent:
                self._role_sent = True
                out.append(self._chunk({"role": "assistant", "content": ""}))
        elif etype == "content_block_start":
            block = event.get("content_block") or {}
            btype = block.get("type")
            if btype == "tool_use":
                tool_index = len(self._tool_index)
                self._tool_index[event.get("index", tool_index)] = tool_index
                start_input = block.get("input")
                call = {
                    "index": tool_index,
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        # Some servers send the whole input at start instead of as deltas.
                        "arguments": orjson.dumps(start_input).decode() if start_input else "",
                    },
                }
                self._started_content = True
                self._emit(out, {"tool_calls": [call]})
            elif btype == "text" and block.get("text"):
                self._started_content = True
                self._emit(out, {"content": block["text"]})
            elif btype == "thinking" and block.get("thinking"):
                self._started_content = True
                self._emit(out, {"reasoning_content": block["thinking"]})
        elif etype == "content_block_delta":
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta" and delta.get("text"):
                self._started_content = True
                self._emit(out, {"content": delta["text"]})
            elif dtype == "thinking_delta" and delta.get("thinking"):
                self._started_content = True
                self._emit(out, {"reasoning_content": delta["thinking"]})
            elif dtype == "input_json_delta" and delta.get("partial_json"):
                tool_index = self._tool_index.get(event.get("index"), max(len(self._tool_index) - 1, 0))
                fragment = {"index": tool_index, "function": {"arguments": delta["partial_json"]}}
                self._emit(out, {"tool_calls": [fragment]})
        elif etype == "message_delta":
            self._record_usage(event.get("usage"))
            stop_reason = (event.get("delta") or {}).get("stop_reason")
            finish = "tool_calls" if self._tool_index else anthropic_stop_to_openai(stop_reason)
            self._finish_sent = True
            self._emit(out, {}, finish)
        elif etype == "error":
            err = event.get("error") or {}
            self._finished = True
            out.append(
                {
                    "error": {
                        "message": err.get("message", ""),
                        "type": err.get("type", "api_error"),
                        "param": None,
                        "code": None,
                    }
                }
            )
        return out

    def finish(self) -> list[dict]:
        """Close the stream: a finish chunk if the upstream never sent one, then the usage chunk."""
        if self._finished:
            return []
        self._finished = True
        out: list[dict] = []
        if not self._finish_sent:
            self._emit(out, {}, "tool_calls" if self._tool_index else "stop")
        if self.include_usage:
            chunk = self._chunk({})
            chunk["choices"] = []
            chunk["usage"] = openai_usage(self._usage)
            out.append(chunk)
        return out

    @property
    def usage(self) -> dict:
        return dict(self._usage)

    @property
    def started_content(self) -> bool:
        return self._started_content

    @property
    def stop_reason_seen(self) -> bool:
        """A message_delta came: the answer is complete even if message_stop never does."""
        return self._finish_sent
