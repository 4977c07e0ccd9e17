"""OpenAI chat.completions responses and streams -> Anthropic Messages responses and events (an Anthropic
client in front of an OpenAI-speaking upstream; the request goes the other way in anthropic_request_to_openai.py)."""

from __future__ import annotations

import logging

import orjson

from coderouterd.ids import hex24
from coderouterd.servers import overflow as context_overflow
from coderouterd.translate.reasoning import ThinkTagSplitter, split_think_tags
from coderouterd.translate.tool_arguments import parse_tool_arguments
from coderouterd.wire.anthropic import message_start

log = logging.getLogger(__name__)

# Local backends cannot sign reasoning; any non-empty string lets the client echo the block back.
SYNTHETIC_SIGNATURE = "coderouter-unsigned"

_FINISH_TO_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def new_message_id() -> str:
    return "msg_" + hex24()


def new_tool_use_id() -> str:
    return "toolu_" + hex24()


def openai_stop_to_anthropic(finish_reason: str | None, had_tool_calls: bool) -> str:
    """Map finish_reason; emitted tool calls always mean ``tool_use`` (whatever the server said)."""
    if had_tool_calls:
        return "tool_use"
    stop = _FINISH_TO_STOP.get(finish_reason or "stop", "end_turn")
    # "tool_calls" without any call would make the client wait for tool_use blocks that never come.
    return "end_turn" if stop == "tool_use" else stop


# --- non-streaming ----------------------------------------------------------------------------


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _reasoning_field(obj: dict) -> str:
    for key in ("reasoning_content", "reasoning"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _matched_stop(choice: dict, stop_sequences: list[str] | None) -> str | None:
    """The stop string the server reports having matched (vLLM ``stop_reason``, SGLang ``matched_stop``)."""
    if not stop_sequences:
        return None
    for key in ("stop_reason", "matched_stop", "stopping_word"):
        value = choice.get(key)
        if isinstance(value, str) and value in stop_sequences:
            return value
    return None


def anthropic_usage(usage: dict | None, fallback_input: int = 0, fallback_output: int = 0, *,
                    timings: dict | None = None) -> dict:
    """OpenAI usage in Anthropic's shape. `timings`: llama.cpp's, sent beside the usage; its `cache_n` counts the
    cached prompt tokens when the usage itself does not (older llama-server builds, some forks)."""
    usage = usage or {}
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if not isinstance(cached, int) and isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        cached = timings["cache_n"]
    cached = cached if isinstance(cached, int) and cached > 0 else 0
    completion = usage.get("completion_tokens")
    return {
        "input_tokens": max(0, prompt - cached) if isinstance(prompt, int) else fallback_input,
        "output_tokens": completion if isinstance(completion, int) else fallback_output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def response_to_anthropic(resp: dict, model: str, *, stop_sequences: list[str] | None = None) -> dict:
    """Translate a non-streaming chat.completion into an Anthropic message."""
    choices = resp.get("choices") or [{}]
    choice = choices[0] or {}
    message = choice.get("message") or {}
    text = _content_text(message.get("content"))
    tag_thinking, text = split_think_tags(text)
    thinking = "\n\n".join(t for t in (_reasoning_field(message).strip(), tag_thinking) if t)

    stop_sequence = _matched_stop(choice, stop_sequences)
    if stop_sequence is None and stop_sequences and choice.get("finish_reason") in (None, "stop"):
        # Some servers leave the stop string in the content; Anthropic never does.
        for seq in stop_sequences:
            if seq and text.endswith(seq):
                stop_sequence, text = seq, text[: -len(seq)]
                break

    content: list[dict] = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": SYNTHETIC_SIGNATURE})
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or new_tool_use_id(),
                "name": function.get("name") or "",
                "input": parse_tool_arguments(function.get("arguments")),
            }
        )
    had_tools = any(block["type"] == "tool_use" for block in content)
    stop_reason = openai_stop_to_anthropic(choice.get("finish_reason"), had_tools)
    if stop_sequence is not None and not had_tools:
        stop_reason = "stop_sequence"
    else:
        stop_sequence = None
    return {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": anthropic_usage(resp.get("usage"), timings=resp.get("timings")),
    }


def stream_error_to_anthropic(err: object) -> tuple[str, str]:
    """An in-stream OpenAI ``error`` object -> (Anthropic error type, message)."""
    if isinstance(err, dict):
        message = str(err.get("message") or orjson.dumps(err).decode())
        etype = str(err.get("type") or "")
        code = err.get("code")
    else:
        message, etype, code = str(err), "", None
    overflow = context_overflow.parse(400, {"error": err if isinstance(err, dict) else message})
    if overflow is not None:
        # The client parses this wording to trigger compaction (numbers only when the server gave them).
        return "invalid_request_error", context_overflow.client_message(*overflow, message)
    lowered = message.lower()
    if code == 503 or etype in ("unavailable_error", "overloaded_error") or "loading model" in lowered:
        return "overloaded_error", message
    if code == 429 or "rate limit" in lowered:
        return "rate_limit_error", message
    return "api_error", message


# --- streaming --------------------------------------------------------------------------------


class _ToolCall:
    __slots__ = ("oai_index", "id", "name", "fragments", "block_index", "closed")

    def __init__(self, oai_index: int) -> None:
        self.oai_index = oai_index
        self.id = ""
        self.name = ""
        self.fragments: list[str] = []
        self.block_index: int | None = None
        self.closed = False

    def complete(self) -> bool:
        # Cheap test first: this runs on every fragment while another call waits.
        last = next((f for f in reversed(self.fragments) if f.strip()), "")
        if not last.rstrip().endswith("}"):
            return False
        try:
            orjson.loads("".join(self.fragments))
        except orjson.JSONDecodeError:
            return False
        return True


class OpenAIStreamToAnthropic:
    """State machine: parsed OpenAI stream chunks in, Anthropic stream events out.

    Blocks never interleave on the Anthropic side. Fragments of a tool call that arrive while
    another call's block is open are buffered; the open call is closed as soon as its arguments
    form complete JSON, and the buffered call opens with all its bytes in order.
    """

    def __init__(
        self,
        model: str,
        *,
        message_id: str | None = None,
        input_tokens: int = 0,
        stop_sequences: list[str] | None = None,
        think_tags_open: bool = False,
    ) -> None:
        self.model = model
        self.message_id = message_id or new_message_id()
        self._input_estimate = input_tokens
        self._stop_sequences = [s for s in stop_sequences or () if s]
        self._tail_len = max((len(s) for s in self._stop_sequences), default=0)
        self._text_tail = ""
        self._splitter = ThinkTagSplitter(start_in_think=think_tags_open)
        self._started = False
        self._finished = False
        self._next_index = 0
        self._open: str | None = None  # "thinking" | "text" | "tool"
        self._open_call: _ToolCall | None = None
        self._calls: list[_ToolCall] = []
        self._by_index: dict[int, _ToolCall] = {}
        self._finish_reason: str | None = None
        self._matched_stop: str | None = None
        self._upstream_usage: dict | None = None
        self._upstream_timings: dict | None = None
        self._chars = 0
        self._started_content = False

    # -- public --------------------------------------------------------------------------------

    def start(self) -> list[dict]:
        if self._started:
            return []
        self._started = True
        return [message_start(self.message_id, self.model, self._input_estimate), {"type": "ping"}]

    def feed(self, chunk: dict) -> list[dict]:
        if self._finished:
            return []
        events = self.start()
        if chunk.get("error"):
            etype, message = stream_error_to_anthropic(chunk["error"])
            return events + self.error(etype, message)
        if isinstance(chunk.get("usage"), dict):
            self._upstream_usage = chunk["usage"]
            self._upstream_timings = chunk.get("timings")
        for choice in chunk.get("choices") or ():
            if (choice.get("index") or 0) != 0:
                continue  # only the first candidate is relayed
            delta = choice.get("delta") or {}
            reasoning = _reasoning_field(delta)
            if reasoning:
                self._piece(events, "thinking", reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                for kind, piece in self._splitter.feed(content):
                    self._piece(events, kind, piece)
            for call in delta.get("tool_calls") or ():
                self._tool_fragment(events, call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
                self._matched_stop = self._matched_stop or _matched_stop(choice, self._stop_sequences)
        return events

    def finish(self) -> list[dict]:
        if self._finished:
            return []
        events = self.start()
        for kind, piece in self._splitter.flush():
            self._piece(events, kind, piece)
        self._close(events)
        for call in self._calls:
            if not call.closed:
                self._open_tool(events, call)
                self._close(events)
        self._finished = True
        had_tools = bool(self._calls)
        stop_reason = openai_stop_to_anthropic(self._finish_reason, had_tools)
        stop_sequence = None
        if not had_tools and self._finish_reason in (None, "stop"):
            stop_sequence = self._matched_stop or next(
                (s for s in self._stop_sequences if self._text_tail.endswith(s)), None
            )
            if stop_sequence is not None:
                stop_reason = "stop_sequence"
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": self.usage,
            }
        )
        events.append({"type": "message_stop"})
        return events

    def error(self, error_type: str, message: str) -> list[dict]:
        self._finished = True
        return [{"type": "error", "error": {"type": error_type, "message": message}}]

    @property
    def usage(self) -> dict:
        # Without upstream usage the output count is a chars/4 estimate, better than zero for budgets.
        return anthropic_usage(self._upstream_usage, self._input_estimate, max(1, self._chars // 4),
                               timings=self._upstream_timings)

    @property
    def finish_reason(self) -> str | None:
        """The upstream's finish_reason, once a chunk carried it (a stream that has it is complete)."""
        return self._finish_reason

    @property
    def started_content(self) -> bool:
        return self._started_content

    # -- blocks --------------------------------------------------------------------------------

    def _open_block(self, events: list[dict], kind: str, block: dict) -> int:
        index = self._next_index
        self._next_index += 1
        self._open = kind
        self._started_content = True
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        return index

    def _close(self, events: list[dict]) -> None:
        if self._open is None:
            return
        index = self._next_index - 1
        if self._open == "thinking":
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": SYNTHETIC_SIGNATURE},
                }
            )
        elif self._open == "tool" and self._open_call is not None:
            call = self._open_call
            if not any(call.fragments):
                # An empty concatenation is not valid JSON for the client.
                events.append(self._json_delta(index, "{}"))
            call.closed = True
            self._open_call = None
        events.append({"type": "content_block_stop", "index": index})
        self._open = None

    def _piece(self, events: list[dict], kind: str, piece: str) -> None:
        if self._open == "tool":
            if not piece.strip():
                return  # whitespace after a tool call carries nothing and would split the calls
            log.debug("%s arrived while tool call %s was open; closing it", kind, self._open_call)
        if self._open != kind:
            self._close(events)
            if kind == "thinking":
                self._open_block(events, kind, {"type": "thinking", "thinking": "", "signature": ""})
            else:
                self._open_block(events, kind, {"type": "text", "text": ""})
        index = self._next_index - 1
        self._chars += len(piece)
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": piece}
        else:
            delta = {"type": "text_delta", "text": piece}
            if self._tail_len:
                self._text_tail = (self._text_tail + piece)[-self._tail_len :]
        events.append({"type": "content_block_delta", "index": index, "delta": delta})

    # -- tool calls ----------------------------------------------------------------------------

    @staticmethod
    def _json_delta(index: int, partial: str) -> dict:
        return {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}}

    def _call_for(self, fragment: dict) -> _ToolCall:
        call_id = fragment.get("id") or ""
        index = fragment.get("index")
        if not isinstance(index, int):
            # Servers that omit the index: a new id starts a call, anything else continues the last.
            known = call_id and any(c.id == call_id for c in self._calls)
            if self._calls and (not call_id or known):
                index = next(c.oai_index for c in reversed(self._calls) if not call_id or c.id == call_id)
            else:
                index = max((c.oai_index for c in self._calls), default=-1) + 1
        call = self._by_index.get(index)
        if call is None or (call_id and call.id and call_id != call.id):
            # A different id at a known index is a new call (some servers reuse index 0).
            call = _ToolCall(index)
            self._calls.append(call)
            self._by_index[index] = call
        return call

    def _tool_fragment(self, events: list[dict], fragment: dict) -> None:
        for kind, piece in self._splitter.flush():
            self._piece(events, kind, piece)
        call = self._call_for(fragment)
        function = fragment.get("function") or {}
        if fragment.get("id") and not call.id:
            call.id = fragment["id"]
        if function.get("name") and not call.name:
            call.name = function["name"]
        args = function.get("arguments")
        if args is not None and not isinstance(args, str):
            args = orjson.dumps(args).decode()
        if call.closed:
            if args and args.strip():
                log.warning("dropping %d argument bytes of tool call %r after its block closed", len(args), call.name)
            return
        if args:
            call.fragments.append(args)
            self._chars += len(args)
            if call is self._open_call:
                assert call.block_index is not None  # set as its block opened (_open_tool)
                events.append(self._json_delta(call.block_index, args))
        if self._open != "tool" and call.name:
            self._close(events)
            self._open_tool(events, call)
        self._advance_tools(events)

    def _open_tool(self, events: list[dict], call: _ToolCall) -> None:
        block = {"type": "tool_use", "id": call.id or new_tool_use_id(), "name": call.name, "input": {}}
        call.block_index = self._open_block(events, "tool", block)
        self._open_call = call
        buffered = "".join(call.fragments)
        if buffered:
            events.append(self._json_delta(call.block_index, buffered))

    def _advance_tools(self, events: list[dict]) -> None:
        """Switch from a finished tool call to the next buffered one as soon as that is safe."""
        while self._open == "tool" and self._open_call is not None:
            waiting = next(
                (c for c in self._calls if c.block_index is None and not c.closed and c.name), None
            )
            if waiting is None or not self._open_call.complete():
                return
            self._close(events)
            self._open_tool(events, waiting)
