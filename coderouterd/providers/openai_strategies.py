"""Strategies for clients of OpenAI's chat completions (the OpenAI SDK, most agents): one per upstream wire. A chat
upstream's events are relayed as they came (checked, usage noted, the model renamed); an Anthropic upstream is
served through `AnthropicUpstreamAsChat`."""

from __future__ import annotations

from typing import Unpack

import orjson

from ..translate.answer_observe import observe_openai
from ..translate.anthropic_request_to_openai import force_named_tool_as_required
from ..translate.openai_answer_to_anthropic import anthropic_usage
from ..translate.tool_repair_wire import OpenAIStreamRepair
from ..wire.answer_shapes import check_chat_chunk
from ..wire.sse import DONE, encode_data
from .answer_model import renamed, renamed_text
from .anthropic_as_chat import AnthropicUpstreamAsChat
from .errors import DISCONNECT, UpstreamError
from .strategy import Strategy, StrategyOptions
from .upstream_answer import not_an_answer, openai_completion, stream_error, wrong_shape


class OpenAIPassthrough(Strategy):
    """OpenAI client -> OpenAI upstream: forward each event's data verbatim. Usage is always requested upstream
    (exact accounting) and its extra chunk is hidden from clients that did not ask for it."""

    def __init__(self, **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        so = self.client_body.get("stream_options") or {}
        self.client_wants_usage = bool(so.get("include_usage"))
        self.finished = False  # a choice carried its finish_reason
        self._opened = False  # the first event was a chat chunk

    def request(self, raw: bytes, stream: bool) -> bytes:
        body = dict(self.client_body)
        body["model"] = self.model
        if "max_completion_tokens" in body and "max_tokens" not in body:
            # Local servers (llama.cpp, LM Studio, Ollama) read max_tokens; OpenAI's newer name is ignored there.
            body["max_tokens"] = body["max_completion_tokens"]
        if stream:
            so = dict(body.get("stream_options") or {})
            so["include_usage"] = True
            body["stream_options"] = so
        if not self.named_tool_choice:
            body = force_named_tool_as_required(body)
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        resp = openai_completion(body)
        u = resp.get("usage")
        self.timings = resp.get("timings")
        self.raw_usage = u if isinstance(u, dict) else None
        self.usage = anthropic_usage(u, timings=self.timings) if isinstance(u, dict) and u else {}
        if self.repair_tools or self.answer is not None:
            self._repair_openai_body(resp)
            if self._repaired_whole:
                resp["model"] = self.answer_model
                return orjson.dumps(resp)
        return renamed(body, resp.get("model"), self.answer_model)

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[bytes] = []
        for _name, data in events:
            if data == "[DONE]" and self._opened:
                self.done = True
                if isinstance(self.repair, OpenAIStreamRepair):  # an OpenAI upstream
                    out.extend(encode_data(c) for c in self.repair.flush())
                out.append(DONE)
                continue
            obj = orjson.loads(data) if self._opened else self._opening(data)
            problem = check_chat_chunk(obj)
            if problem:
                raise wrong_shape(problem, after_content=self.started_content)
            if "error" in obj and not obj.get("choices"):
                err = obj["error"]
                message = err.get("message", err) if isinstance(err, dict) else err
                raise stream_error(message, after_content=self.started_content)
            self.produced.openai(obj)
            if self.answer is not None:
                observe_openai(self.answer, obj)
            chunks = self.repair.feed(obj) if self.repair is not None else None
            if chunks is not None and (len(chunks) != 1 or chunks[0] is not obj):
                for c in chunks:  # rewritten by the repair: re-encoded
                    if self._note_chunk(c):
                        if "model" in c:
                            c["model"] = self.answer_model
                        out.append(encode_data(c))
                continue
            if self._note_chunk(obj):
                out.append(b"data: " + renamed_text(data, obj.get("model"), self.answer_model).encode() + b"\n\n")
        return b"".join(out)

    def _opening(self, data: str) -> dict:
        """The first event, parsed. A chat stream opens with a chunk (a JSON object with `choices`) or an error
        object; anything else ([DONE] included) is not a stream of this protocol."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and (isinstance(obj.get("choices"), list) or "error" in obj):
            self._opened = True
            return obj
        raise not_an_answer("a stream that does not open with a chat completion chunk", data)

    def _note_chunk(self, obj: dict) -> bool:
        """Record usage, finish and content; False for a usage-only chunk the client did not ask for."""
        u = obj.get("usage")
        if "timings" in obj:
            self.timings = obj["timings"]
        if u:
            self.raw_usage = u
            self.usage = anthropic_usage(u, timings=obj.get("timings"))
        choices = obj.get("choices")
        if not choices:
            return self.client_wants_usage
        c0 = choices[0]
        if c0.get("finish_reason"):
            self.finished = True
        if not self.started_content:
            d = c0.get("delta") or {}
            if d.get("content") or d.get("tool_calls") or d.get("reasoning_content") or d.get("reasoning"):
                self.started_content = True
        return True

    def eof(self) -> bytes:
        if self.finished:  # some servers end the body without [DONE]; the answer was complete
            self.done = True
            if isinstance(self.repair, OpenAIStreamRepair):  # an OpenAI upstream
                return b"".join(encode_data(c) for c in self.repair.flush()) + DONE
            return DONE
        raise UpstreamError(DISCONNECT, message="upstream closed the stream before [DONE]",
                            after_content=self.started_content)


class OpenAIToAnthropicUpstream(AnthropicUpstreamAsChat):
    """OpenAI client -> Anthropic upstream."""

    def __init__(self, **kw: Unpack[StrategyOptions]) -> None:
        so = kw["client_body"].get("stream_options") or {}
        super().__init__(include_usage=bool(so.get("include_usage")), **kw)

    def response(self, body: bytes) -> bytes:
        return orjson.dumps(self._completion(body))

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        chunks, stopped = self._chat_chunks(events)
        out = [encode_data(c) for c in chunks]
        if stopped:
            out.append(DONE)
            self.done = True
        self.started_content = self.a2o.started_content
        return b"".join(out)

    def eof(self) -> bytes:
        if self._complete_without_stop():
            self.done = True
            return b"".join(encode_data(c) for c in self.a2o.finish()) + DONE
        raise self._no_stop()
