"""Anthropic Messages responses and streams -> OpenAI chat.completions responses and chunks (an OpenAI-shaped
client in front of an Anthropic-speaking upstream; the request goes the other way in
openai_request_to_anthropic.py)."""

from __future__ import annotations

import time

import orjson

from ..ids import hex24

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
    return "chatcmpl-" + hex24()


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
                index = event.get("index")
                latest = max(len(self._tool_index) - 1, 0)
                tool_index = self._tool_index.get(index, latest) if index is not None else latest
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
