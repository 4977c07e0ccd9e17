"""Chat-completions answers in, Gemini `GenerateContentResponse`s out: whole, or one per chunk of a stream.

An Anthropic upstream is served by chaining its chat translation in front of this one (as for the Responses
ingress), so there is a single Gemini grammar to get right:

- text and thought deltas become `text` parts (`thought: true` only when the client asked for thoughts with
  `thinkingConfig.includeThoughts`);
- tool-call argument fragments are kept until the call is whole: a Gemini client reads each `functionCall` as
  one part with its `args` object, so calls go out together with the finishing chunk;
- the forced JSON tool (gemini_request.JSON_TOOL) comes back as the answer's text;
- every chunk carries `usageMetadata`, cumulative, and the last one the upstream's exact counts.
"""

from __future__ import annotations

import orjson

from .gemini_request import JSON_TOOL, GeminiRequest
from .reasoning import ThinkTagSplitter, split_think_tags
from .tool_arguments import parse_tool_arguments

# chat finish_reason -> Gemini finishReason (a function call ends with STOP in Gemini's API).
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "function_call": "STOP",
           "content_filter": "SAFETY"}


def finish_reason(reason: str | None) -> str:
    return _FINISH.get(reason or "stop", "OTHER")


def gemini_usage(chat_usage: dict | None, *, prompt: int = 0, output: int = 0, thoughts: int = 0) -> dict:
    """Chat usage as usageMetadata; `prompt`/`output`/`thoughts` stand in for what the upstream has not said yet.
    promptTokenCount includes the cached tokens, as in Gemini's own answers (and in chat's prompt_tokens)."""
    u = chat_usage or {}
    prompt = int(u.get("prompt_tokens") or prompt)
    completion = int(u.get("completion_tokens") or 0)
    reasoning = int((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or thoughts)
    if completion:
        reasoning = min(reasoning, completion)
        output = completion - reasoning
    else:
        output = max(output, 0)
    meta: dict = {"promptTokenCount": prompt, "candidatesTokenCount": output,
                  "totalTokenCount": prompt + output + reasoning}
    if reasoning:
        meta["thoughtsTokenCount"] = reasoning
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if cached:
        meta["cachedContentTokenCount"] = cached
    return meta


def json_tool_schema(schema: dict) -> dict:
    """The forced JSON tool's input schema: a tool's input must be an object, so a schema for anything else is
    wrapped in one field, `value` (unwrapped again by `json_tool_text`)."""
    if schema.get("type") == "object" or ("type" not in schema and "properties" in schema):
        return schema
    return {"type": "object", "properties": {"value": schema}, "required": ["value"]}


def json_tool_text(rq: GeminiRequest, arguments: str) -> str:
    """The answer's text from the forced JSON tool's arguments."""
    schema = rq.json_schema or {}
    if json_tool_schema(schema) is schema:
        return arguments
    value = parse_tool_arguments(arguments).get("value")
    return orjson.dumps(value).decode()


def _call_part(rq: GeminiRequest, name: str, call_id: str, arguments: str) -> dict:
    call: dict = {"name": rq.client_tool_name(name), "args": parse_tool_arguments(arguments)}
    if call_id:
        call["id"] = call_id
    return {"functionCall": call}


def _response(rq: GeminiRequest, model: str, parts: list[dict], usage: dict, finish: str | None = None) -> dict:
    candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": model, "responseId": rq.response_id}


def chat_completion_to_gemini(rq: GeminiRequest, completion: dict, model: str) -> dict:
    """A whole chat completion as one GenerateContentResponse: thoughts, text, then function calls."""
    choice = (completion.get("choices") or [{}])[0] or {}
    message = choice.get("message") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(
        p.get("text", "") for p in content or () if isinstance(p, dict))
    if "<think>" in text or "</think>" in text:
        more, text = split_think_tags(text)
        reasoning = (reasoning + "\n\n" + more).strip() if reasoning else more
    parts: list[dict] = []
    if reasoning and rq.include_thoughts:
        parts.append({"text": reasoning, "thought": True})
    calls = message.get("tool_calls") or []
    for call in calls:
        fn = call.get("function") or {}
        if fn.get("name") == JSON_TOOL and rq.json_schema is not None:
            text += json_tool_text(rq, str(fn.get("arguments") or ""))
            continue
        parts.append(_call_part(rq, str(fn.get("name") or ""), str(call.get("id") or ""),
                                str(fn.get("arguments") or "")))
    if text:
        parts.insert(1 if parts and parts[0].get("thought") else 0, {"text": text})
    if not parts:
        parts.append({"text": ""})
    usage = gemini_usage(completion.get("usage"), thoughts=(len(reasoning) + 3) // 4 if reasoning else 0)
    return _response(rq, model, parts, usage, finish_reason(choice.get("finish_reason")))


class _Call:
    __slots__ = ("call_id", "name", "parts")

    def __init__(self, call_id: str, name: str) -> None:
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []


class ChatStreamToGemini:
    """State machine for one attempt: feed() each parsed chat chunk, finish() at the end of the stream. Each
    returns the GenerateContentResponse objects to send (a Gemini stream has no opening or closing event of its
    own: every chunk is a whole response)."""

    def __init__(self, rq: GeminiRequest, model: str) -> None:
        self.rq = rq
        self.model = model
        self._splitter = ThinkTagSplitter()
        self._calls: dict[int, _Call] = {}
        self.finish_reason: str | None = None
        self.chat_usage: dict | None = None
        self.started_content = False
        self._finished = False
        self._pieces = 0  # deltas so far: the running output count until the upstream says its own
        self._thought_chars = 0
        # The prompt's size before the upstream's final usage, when its stream said it at the start (Anthropic's
        # message_start): every chunk then carries it, as Gemini's own do.
        self.prompt_hint = 0

    def _usage(self) -> dict:
        return gemini_usage(self.chat_usage, prompt=self.prompt_hint, output=self._pieces,
                            thoughts=(self._thought_chars + 3) // 4 if self._thought_chars else 0)

    def _text(self, out: list[dict], kind: str, piece: str) -> None:
        if not piece:
            return
        self._pieces += 1
        if kind == "thinking":
            self._thought_chars += len(piece)
            if not self.rq.include_thoughts:
                return
            part = {"text": piece, "thought": True}
        else:
            part = {"text": piece}
        self.started_content = True
        out.append(_response(self.rq, self.model, [part], self._usage()))

    def feed(self, chunk: dict, out: list[dict] | None = None) -> list[dict]:
        if out is None:
            out = []
        if self._finished:
            return out
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
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            self._text(out, "thinking", reasoning)
        content = delta.get("content")
        if content and isinstance(content, str):
            if "<" not in content and self._splitter.passes_through:
                self._text(out, "text", content)
            else:
                for kind, piece in self._splitter.feed(content):
                    self._text(out, kind, piece)
        for frag in delta.get("tool_calls") or ():
            if isinstance(frag, dict):
                self._fragment(frag)

    def _fragment(self, frag: dict) -> None:
        idx = frag.get("index")
        if not isinstance(idx, int):
            idx = len(self._calls) - 1 if (frag.get("id") is None and self._calls) else len(self._calls)
        fn = frag.get("function") or {}
        call = self._calls.get(idx)
        if call is None:
            call = self._calls[idx] = _Call(str(frag.get("id") or ""), str(fn.get("name") or ""))
            # The client sees nothing of a call before it is whole, but the upstream has committed to it: an
            # error now must not be retried elsewhere as if nothing had been said.
            self.started_content = True
        elif fn.get("name") and not call.name:
            call.name = fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            call.parts.append(args)
            self._pieces += 1

    def finish(self, out: list[dict] | None = None) -> list[dict]:
        """The closing chunk: whole function calls (or the forced JSON tool's text), finishReason, exact usage."""
        if out is None:
            out = []
        if self._finished:
            return out
        self._finished = True
        for kind, piece in self._splitter.flush():
            self._text(out, kind, piece)
        parts: list[dict] = []
        for call in self._calls.values():
            arguments = "".join(call.parts)
            if call.name == JSON_TOOL and self.rq.json_schema is not None:
                parts.append({"text": json_tool_text(self.rq, arguments)})
                continue
            parts.append(_call_part(self.rq, call.name, call.call_id, arguments))
        if not parts:
            parts.append({"text": ""})
        self.started_content = True
        out.append(_response(self.rq, self.model, parts, self._usage(), finish_reason(self.finish_reason)))
        return out


def encode_sse(response: dict) -> bytes:
    """One response as an SSE event: a `data:` line and a blank line, no event name (Gemini's `alt=sse`)."""
    return b"data: " + orjson.dumps(response) + b"\r\n\r\n"


def encode_all(responses: list[dict]) -> bytes:
    return b"".join([encode_sse(r) for r in responses])
