"""OpenAI chat-completions stream chunks in, Responses API stream events out.

The whole event grammar lives here: response.created / in_progress, one output item per reasoning run, text run
and tool call (added → parts/deltas → done), and response.completed / incomplete / failed at the end. Every
event carries the next `sequence_number`. An Anthropic upstream is served by chaining its chat translation in
front of this one, so there is a single Responses grammar to get right.
"""

from __future__ import annotations

import orjson

from ..ids import new_id
from .reasoning import ThinkTagSplitter
from .responses_objects import function_call_item, output_text_part, response_object, responses_usage
from .responses_request import ResponsesRequest

PROLOGUE_EVENTS = 2  # response.created + response.in_progress


_HEADS: dict[str, bytes] = {}


def encode(event: dict) -> bytes:
    """SSE framing as OpenAI sends it: the event name on its own line, then the JSON with its `type`."""
    etype = event["type"]
    head = _HEADS.get(etype)
    if head is None:
        head = _HEADS[etype] = b"event: " + etype.encode() + b"\ndata: "
    return head + orjson.dumps(event) + b"\n\n"


def encode_all(events: list[dict]) -> bytes:
    return b"".join([encode(e) for e in events])


def prologue(rq: ResponsesRequest, model: str) -> list[dict]:
    """The two opening events (sequence numbers 0 and 1), sent by whoever commits the stream first."""
    obj = response_object(rq, model, "in_progress", final=False)
    return [{"type": "response.created", "sequence_number": 0, "response": obj},
            {"type": "response.in_progress", "sequence_number": 1, "response": obj}]


def failed_event(rq: ResponsesRequest, model: str, seq: int, code: str, message: str,
                 output: list[dict] | None = None) -> dict:
    err = {"code": code, "message": message}
    return {"type": "response.failed", "sequence_number": seq,
            "response": response_object(rq, model, "failed", output, None, error=err)}


# Pieces of one item's text are joined into one run once this many have come: a list of one string per delta
# cost ~60 bytes a delta on top of the text (issue 34: +104 MB of RSS for 19 MB of text in 10 s of 8-character
# deltas), and joining the whole text at every delta would copy it over and over. Each character is copied once
# into a run and once more at the end.
_RUN = 256


class _Item:
    __slots__ = ("kind", "item_id", "index", "parts", "runs", "call_id", "name", "open")

    def __init__(self, kind: str, index: int, *, item_id: str) -> None:
        self.kind = kind  # "reasoning" | "message" | "function_call"
        self.item_id = item_id
        self.index = index
        self.parts: list[str] = []  # reasoning summary, message text or call arguments, as streamed lately
        self.runs: list[str] = []  # what came before those, joined _RUN pieces at a time
        self.call_id = ""
        self.name = ""
        self.open = True

    def compact(self) -> None:
        if len(self.parts) >= _RUN:
            self.runs.append("".join(self.parts))
            self.parts.clear()

    @property
    def text(self) -> str:
        # Joined on demand, and kept joined: the closing events read it several times.
        if self.runs or len(self.parts) > 1:
            self.runs.extend(self.parts)
            self.parts[:] = ["".join(self.runs)]
            self.runs.clear()
        return self.parts[0] if self.parts else ""


class ChatStreamToResponses:
    """State machine for one attempt: feed() each parsed chat chunk, finish() at the end of the stream.

    With `skip_prologue` the two opening events were already sent (the stream was committed before this
    upstream answered) and numbering continues after them."""

    def __init__(self, rq: ResponsesRequest, model: str, *, skip_prologue: bool = False) -> None:
        self.rq = rq
        self.model = model
        self.skip_prologue = skip_prologue
        self.seq = 0
        self._started = False
        self._finished = False
        self._items: list[_Item] = []
        self._current: _Item | None = None  # the open reasoning or message item
        self._tools: dict[int, _Item] = {}  # chat tool_calls index -> item
        self._splitter = ThinkTagSplitter()
        self.finish_reason: str | None = None
        self.chat_usage: dict | None = None
        self.started_content = False
        # Characters of text and arguments kept for the closing events (their bound is the caller's: see kept()).
        self.kept = 0

    @property
    def started(self) -> bool:
        return self._started

    # -- output ---------------------------------------------------------------------------------------------

    def _emit(self, out: list[dict], event: dict) -> None:
        event["sequence_number"] = self.seq
        self.seq += 1
        out.append(event)

    def _start(self, out: list[dict]) -> None:
        if self._started:
            return
        self._started = True
        if self.skip_prologue:
            self.seq = max(self.seq, PROLOGUE_EVENTS)
        else:
            for ev in prologue(self.rq, self.model):
                self._emit(out, ev)

    def _open(self, out: list[dict], kind: str) -> _Item:
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item = _Item(kind, len(self._items), item_id=new_id(prefix))
        self._items.append(item)
        if kind == "reasoning":
            self._emit(out, {"type": "response.output_item.added", "output_index": item.index,
                             "item": {"id": item.item_id, "type": "reasoning", "summary": []}})
            self._emit(out, {"type": "response.reasoning_summary_part.added", "item_id": item.item_id,
                             "output_index": item.index, "summary_index": 0,
                             "part": {"type": "summary_text", "text": ""}})
        elif kind == "message":
            self._emit(out, {"type": "response.output_item.added", "output_index": item.index,
                             "item": {"id": item.item_id, "type": "message", "status": "in_progress",
                                      "role": "assistant", "content": []}})
            self._emit(out, {"type": "response.content_part.added", "item_id": item.item_id,
                             "output_index": item.index, "content_index": 0, "part": output_text_part("")})
        return item

    def _close(self, out: list[dict], item: _Item) -> None:
        if not item.open:
            return
        item.open = False
        i, iid = item.index, item.item_id
        if item.kind == "reasoning":
            part = {"type": "summary_text", "text": item.text}
            self._emit(out, {"type": "response.reasoning_summary_text.done", "item_id": iid, "output_index": i,
                             "summary_index": 0, "text": item.text})
            self._emit(out, {"type": "response.reasoning_summary_part.done", "item_id": iid, "output_index": i,
                             "summary_index": 0, "part": part})
        elif item.kind == "message":
            self._emit(out, {"type": "response.output_text.done", "item_id": iid, "output_index": i,
                             "content_index": 0, "text": item.text, "logprobs": []})
            self._emit(out, {"type": "response.content_part.done", "item_id": iid, "output_index": i,
                             "content_index": 0, "part": output_text_part(item.text)})
        else:
            self._emit(out, {"type": "response.function_call_arguments.done", "item_id": iid, "output_index": i,
                             "name": self.rq.client_tool_name(item.name)[1], "arguments": item.text})
        self._emit(out, {"type": "response.output_item.done", "output_index": i, "item": self._final(item)})

    def _final(self, item: _Item) -> dict:
        if item.kind == "reasoning":
            return {"id": item.item_id, "type": "reasoning", "status": "completed",
                    "summary": [{"type": "summary_text", "text": item.text}]}
        if item.kind == "message":
            return {"id": item.item_id, "type": "message", "status": "completed", "role": "assistant",
                    "content": [output_text_part(item.text)]}
        return function_call_item(self.rq, item.name, item.call_id, item.text, item_id=item.item_id)

    def _close_current(self, out: list[dict]) -> None:
        if self._current is not None:
            self._close(out, self._current)
            self._current = None

    # -- input ----------------------------------------------------------------------------------------------

    def _piece(self, out: list[dict], kind: str, piece: str) -> None:
        if not piece:
            return
        self.started_content = True
        cur = self._current
        if cur is None or cur.kind != kind:
            self._close_current(out)
            cur = self._current = self._open(out, kind)
        cur.parts.append(piece)
        self.kept += len(piece)
        if kind == "reasoning":
            self._emit(out, {"type": "response.reasoning_summary_text.delta", "item_id": cur.item_id,
                             "output_index": cur.index, "summary_index": 0, "delta": piece})
        else:
            self._emit(out, {"type": "response.output_text.delta", "item_id": cur.item_id,
                             "output_index": cur.index, "content_index": 0, "delta": piece, "logprobs": []})

    def _tool_fragment(self, out: list[dict], frag: dict) -> None:
        idx = frag.get("index")
        if not isinstance(idx, int):
            idx = len(self._tools) - 1 if (frag.get("id") is None and self._tools) else len(self._tools)
        fn = frag.get("function") or {}
        item = self._tools.get(idx)
        if item is None:
            self._close_current(out)
            item = _Item("function_call", len(self._items), item_id=new_id("fc"))
            item.call_id = frag.get("id") or new_id("call")
            item.name = fn.get("name") or ""
            self._items.append(item)
            self._tools[idx] = item
            self.started_content = True
            added = function_call_item(self.rq, item.name, item.call_id, "", item_id=item.item_id,
                                       status="in_progress")
            self._emit(out, {"type": "response.output_item.added", "output_index": item.index, "item": added})
        elif fn.get("name") and not item.name:
            item.name = fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            item.parts.append(args)
            self.kept += len(args)
            self._emit(out, {"type": "response.function_call_arguments.delta", "item_id": item.item_id,
                             "output_index": item.index, "delta": args})

    def feed(self, chunk: dict, out: list[dict] | None = None) -> list[dict]:
        """The events for one chat chunk, appended to `out` when given (one list for a whole batch)."""
        if out is None:
            out = []
        if self._finished:
            return out
        if not self._started:
            self._start(out)
        usage = chunk.get("usage")
        if usage:
            self.chat_usage = usage
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta:
                self._delta(delta, out)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _delta(self, delta: dict, out: list[dict]) -> None:
        content = delta.get("content")
        if "reasoning_content" in delta or "reasoning" in delta:
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                self._piece(out, "reasoning", reasoning)
        if content and isinstance(content, str):
            cur = self._current
            if "<" not in content and self._splitter.passes_through:
                if cur is not None and cur.kind == "message":
                    # The hot path (a token of visible text): one event, no helper calls.
                    cur.parts.append(content)
                    self.kept += len(content)
                    out.append({"type": "response.output_text.delta", "item_id": cur.item_id,
                                "output_index": cur.index, "content_index": 0, "delta": content, "logprobs": [],
                                "sequence_number": self.seq})
                    self.seq += 1
                else:
                    self._piece(out, "message", content)
            else:
                for kind, piece in self._splitter.feed(content):
                    self._piece(out, "reasoning" if kind == "thinking" else "message", piece)
        calls = delta.get("tool_calls")
        if calls:
            for frag in calls:
                if isinstance(frag, dict):
                    self._tool_fragment(out, frag)

    def finish(self, out: list[dict] | None = None) -> list[dict]:
        """Close every open item and end the response: completed, or incomplete when the output hit the limit."""
        if out is None:
            out = []
        if self._finished:
            return out
        self._start(out)
        for kind, piece in self._splitter.flush():
            self._piece(out, "reasoning" if kind == "thinking" else "message", piece)
        self._finished = True
        self._close_current(out)
        for item in self._items:
            self._close(out, item)
        has_reasoning = any(i.kind == "reasoning" for i in self._items)
        usage = responses_usage(self.chat_usage, reasoning_tokens=self._reasoning_estimate() if has_reasoning else 0)
        output = [self._final(i) for i in self._items]
        if self.finish_reason == "length":
            resp = response_object(self.rq, self.model, "incomplete", output, usage,
                                   incomplete={"reason": "max_output_tokens"})
            self._emit(out, {"type": "response.incomplete", "response": resp})
        else:
            resp = response_object(self.rq, self.model, "completed", output, usage)
            self._emit(out, {"type": "response.completed", "response": resp})
        return out

    def compact(self) -> None:
        """Join the pieces the open items gathered (called once per batch of chunks: nothing per delta)."""
        cur = self._current
        if cur is not None:
            cur.compact()
        for item in self._tools.values():
            if item.open:
                item.compact()

    def fail(self, code: str, message: str) -> list[dict]:
        """End the response as failed (the upstream broke after the stream began)."""
        if self._finished:
            return []
        self._finished = True
        ev = failed_event(self.rq, self.model, self.seq, code, message, self.output)
        self.seq += 1
        return [ev]

    def _reasoning_estimate(self) -> int:
        # Upstreams rarely count reasoning tokens separately; about four characters a token is close enough.
        chars = sum(len(i.text) for i in self._items if i.kind == "reasoning")
        return (chars + 3) // 4

    @property
    def output(self) -> list[dict]:
        return [self._final(i) for i in self._items]
