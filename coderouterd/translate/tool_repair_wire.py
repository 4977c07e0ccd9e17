"""Tool-call repair applied to an upstream's own wire, before translation to the client's.

Sitting on the upstream side means one adapter per upstream wire (OpenAI chunks, Anthropic events) serves
every client ingress: the translators downstream only ever see real tool calls. ``ToolCallRepairer`` does
the deciding; these classes only take text out of the wire and put calls back in.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ids import hex24
from .tool_repair import RepairedCall, ToolCallRepairer, ToolSpec


class _Counts:
    """What a repair adapter did in one answer, for the journal and the repair rate."""

    def __init__(self) -> None:
        self.repaired = 0
        self.formats: list[str] = []

    def _count(self, calls: list[RepairedCall]) -> None:
        self.repaired += len(calls)
        self.formats.extend(c.format for c in calls)


# --- OpenAI chat.completions ---------------------------------------------------------------------------


def _openai_tool_call(index: int, call: RepairedCall) -> dict:
    return {"index": index, "id": "call_" + hex24(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json()}}


class OpenAIStreamRepair(_Counts):
    """OpenAI stream chunks in, OpenAI stream chunks out; only choice 0's ``content`` is inspected."""

    def __init__(self, tools: Mapping[str, ToolSpec]) -> None:
        super().__init__()
        self._repairer = ToolCallRepairer(tools)
        self._next_index = 0  # after the upstream's own tool calls, if it made any
        self._template: dict = {}
        self._flushed = False

    def feed(self, chunk: dict) -> list[dict]:
        choices = chunk.get("choices")
        if not choices or self._flushed:
            return [chunk]
        c0 = choices[0]
        if (c0.get("index") or 0) != 0:
            return [chunk]
        self._template = chunk
        delta = c0.get("delta") or {}
        for tc in delta.get("tool_calls") or ():
            idx = tc.get("index")
            if isinstance(idx, int):
                self._next_index = max(self._next_index, idx + 1)
        content = delta.get("content")
        finish = c0.get("finish_reason")
        if not (isinstance(content, str) and content) and not finish:
            return [chunk]
        released = self._repairer.feed(content) if isinstance(content, str) and content else ""
        if released == content and not finish:
            return [chunk]
        new_delta = dict(delta)
        if released:
            new_delta["content"] = released
        else:
            new_delta.pop("content", None)
        out: list[dict] = []
        if new_delta or not finish:
            if new_delta:
                out.append(self._with(chunk, new_delta, None, keep_usage=not finish))
        if finish:
            flushed, calls = self._flush_chunks()
            out.extend(flushed)
            out.append(self._with(chunk, {}, "tool_calls" if calls else finish, keep_usage=True))
        return out

    def flush(self) -> list[dict]:
        """The end of the stream without a finish_reason ([DONE] or EOF): release what is held."""
        if self._flushed:
            return []
        chunks, _ = self._flush_chunks()
        return chunks

    @property
    def repaired_any(self) -> bool:
        return self.repaired > 0

    def _flush_chunks(self) -> tuple[list[dict], list[RepairedCall]]:
        self._flushed = True
        text, calls = self._repairer.finish()
        out: list[dict] = []
        if text:
            out.append(self._with(self._template, {"content": text}, None, keep_usage=False))
        if calls:
            self._count(calls)
            tcs = [_openai_tool_call(self._next_index + i, c) for i, c in enumerate(calls)]
            out.append(self._with(self._template, {"tool_calls": tcs}, None, keep_usage=False))
        return out, calls

    @staticmethod
    def _with(chunk: dict, delta: dict, finish: str | None, *, keep_usage: bool) -> dict:
        c0 = dict((chunk.get("choices") or [{}])[0])
        c0["delta"] = delta
        c0["finish_reason"] = finish
        c0.setdefault("index", 0)
        new = dict(chunk)
        new["choices"] = [c0]
        if not keep_usage:
            new.pop("usage", None)
        return new


def repair_openai_completion(resp: dict, tools: Mapping[str, ToolSpec]) -> list[RepairedCall]:
    """Non-streaming: rewrite a chat.completion in place. Returns the calls that were repaired."""
    choices = resp.get("choices")
    if not choices or not isinstance(choices[0], dict):
        return []
    choice = choices[0]
    message = choice.get("message") or {}
    content = message.get("content")
    if not isinstance(content, str) or not content:
        return []
    repairer = ToolCallRepairer(tools)
    head = repairer.feed(content)
    tail, calls = repairer.finish()
    if not calls:
        return []
    existing = list(message.get("tool_calls") or ())
    text = head + tail
    message["content"] = text or None
    message["tool_calls"] = existing + [_openai_tool_call(len(existing) + i, c) for i, c in enumerate(calls)]
    for tc in message["tool_calls"]:
        tc.pop("index", None)
    choice["message"] = message
    choice["finish_reason"] = "tool_calls"
    return calls


# --- Anthropic Messages --------------------------------------------------------------------------------


def _tool_use_block(call: RepairedCall) -> dict:
    return {"type": "tool_use", "id": "toolu_" + hex24(), "name": call.name, "input": call.arguments}


class AnthropicStreamRepair(_Counts):
    """Anthropic stream events in, events out. Text blocks go through a repairer; a text block that was only
    a call disappears (its start is held until it has real text), repaired calls become tool_use blocks right
    after it, and later block indices shift to stay contiguous."""

    def __init__(self, tools: Mapping[str, ToolSpec]) -> None:
        super().__init__()
        self._tools = tools
        self._repairer: ToolCallRepairer | None = None
        self._text_index: int | None = None  # upstream index of the open text block
        self._held_start: dict | None = None
        self._offset = 0  # output index = upstream index + offset

    def feed(self, event: dict) -> list[dict]:
        etype = event.get("type")
        if etype == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "text" and not block.get("text"):
                self._text_index = event.get("index")
                self._repairer = ToolCallRepairer(self._tools)
                self._held_start = event
                return []
            return [self._shifted(event)]
        if etype == "content_block_delta" and event.get("index") == self._text_index and self._repairer:
            delta = event.get("delta") or {}
            if delta.get("type") != "text_delta":
                return self._open_text() + [self._shifted(event)]
            text = delta.get("text") or ""
            released = self._repairer.feed(text)
            if not released:
                return []
            if released == text and self._held_start is None and not self._offset:
                return [event]  # unchanged: the caller can forward the upstream's bytes
            return self._open_text() + [self._shifted({**event, "delta": {"type": "text_delta", "text": released}})]
        if etype == "content_block_stop" and event.get("index") == self._text_index and self._repairer:
            return self._close_text(event)
        if etype == "content_block_delta" or etype == "content_block_stop":
            return [self._shifted(event)]
        if etype == "message_delta" and self.repaired:
            delta = dict(event.get("delta") or {})
            delta["stop_reason"] = "tool_use"
            delta["stop_sequence"] = None
            return [{**event, "delta": delta}]
        return [event]

    def _shifted(self, event: dict) -> dict:
        if not self._offset or not isinstance(event.get("index"), int):
            return event
        return {**event, "index": event["index"] + self._offset}

    def _open_text(self) -> list[dict]:
        if self._held_start is None:
            return []
        start, self._held_start = self._held_start, None
        return [self._shifted(start)]

    def _close_text(self, stop: dict) -> list[dict]:
        assert self._repairer is not None
        tail, calls = self._repairer.finish()
        self._repairer = None
        self._text_index = None
        out: list[dict] = []
        if tail:
            out += self._open_text()
            out.append(self._shifted({"type": "content_block_delta", "index": stop["index"],
                                      "delta": {"type": "text_delta", "text": tail}}))
        if self._held_start is None:
            out.append(self._shifted(stop))
            next_index = stop["index"] + self._offset + 1
        else:  # nothing but calls: the text block never reaches the client
            self._held_start = None
            self._offset -= 1
            next_index = stop["index"] + self._offset + 1
        for call in calls:
            block = _tool_use_block(call)
            args = block.pop("input")
            out.append({"type": "content_block_start", "index": next_index, "content_block": {**block, "input": {}}})
            out.append({"type": "content_block_delta", "index": next_index,
                        "delta": {"type": "input_json_delta", "partial_json": call.arguments_json() if args else "{}"}})
            out.append({"type": "content_block_stop", "index": next_index})
            next_index += 1
            self._offset += 1
        self._count(calls)
        return out


def repair_anthropic_message(msg: dict, tools: Mapping[str, ToolSpec]) -> list[RepairedCall]:
    """Non-streaming: rewrite a Messages response in place. Returns the calls that were repaired."""
    content = msg.get("content")
    if not isinstance(content, list):
        return []
    new: list[dict] = []
    repaired: list[RepairedCall] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            repairer = ToolCallRepairer(tools)
            head = repairer.feed(block["text"])
            tail, calls = repairer.finish()
            if calls:
                if head + tail:
                    new.append({**block, "text": head + tail})
                new.extend(_tool_use_block(c) for c in calls)
                repaired.extend(calls)
                continue
        new.append(block)
    if repaired:
        msg["content"] = new
        msg["stop_reason"] = "tool_use"
        msg["stop_sequence"] = None
    return repaired
