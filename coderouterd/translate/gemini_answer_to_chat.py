"""Gemini `GenerateContentResponse`s in, OpenAI chat-completions answers out: whole, or one chunk list per streamed
response. The inverse of gemini_answer.py (chat -> Gemini, for Gemini clients); with it every client wire reaches
a Gemini upstream through the chat form the other translators already speak.

- `text` parts become content deltas, `thought: true` ones reasoning deltas;
- each `functionCall` part (whole, as Gemini sends it) becomes one tool-call delta with its arguments as JSON;
- `finishReason` maps back (a response that called a function finishes with `tool_calls`);
- `usageMetadata`, cumulative on every chunk, becomes chat usage: promptTokenCount includes the cached tokens
  (`cachedContentTokenCount`), and the billed output is the candidates' tokens plus the thoughts'.
"""

from __future__ import annotations

import time

import orjson

from ..ids import hex24
from .anthropic_answer_to_openai import new_completion_id
from .chat_request_to_gemini import CallSignatures

# Gemini finishReason -> chat finish_reason. The safety family ends as a content filter; MALFORMED_FUNCTION_CALL
# and the rest as a plain stop (there is no closer chat word).
_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
           "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
           "IMAGE_SAFETY": "content_filter"}


def chat_finish(reason: object, called: bool) -> str:
    if called and reason in (None, "STOP"):
        return "tool_calls"
    return _FINISH.get(reason if isinstance(reason, str) else "STOP", "stop")


def chat_usage(meta: object) -> dict | None:
    """usageMetadata as chat usage (None when there is none)."""
    if not isinstance(meta, dict) or not meta:
        return None
    prompt = int(meta.get("promptTokenCount") or 0) + int(meta.get("toolUsePromptTokenCount") or 0)
    thoughts = int(meta.get("thoughtsTokenCount") or 0)
    output = int(meta.get("candidatesTokenCount") or 0) + thoughts
    cached = int(meta.get("cachedContentTokenCount") or 0)
    usage: dict = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output,
                   "prompt_tokens_details": {"cached_tokens": cached}}
    if thoughts:
        usage["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return usage


def usage_as_anthropic(meta: object) -> dict:
    """usageMetadata in the journal's (Anthropic) shape: uncached input, output with thoughts, cache reads."""
    if not isinstance(meta, dict) or not meta:
        return {}
    prompt = int(meta.get("promptTokenCount") or 0) + int(meta.get("toolUsePromptTokenCount") or 0)
    cached = min(int(meta.get("cachedContentTokenCount") or 0), prompt)
    return {"input_tokens": prompt - cached,
            "output_tokens": int(meta.get("candidatesTokenCount") or 0) + int(meta.get("thoughtsTokenCount") or 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _candidate(resp: dict) -> dict:
    cands = resp.get("candidates")
    first = cands[0] if isinstance(cands, list) and cands else None
    return first if isinstance(first, dict) else {}


def blocked(resp: dict) -> str | None:
    """Why the prompt was refused outright (promptFeedback.blockReason with no candidate), else None."""
    feedback = resp.get("promptFeedback")
    if isinstance(feedback, dict) and feedback.get("blockReason") and not resp.get("candidates"):
        return str(feedback["blockReason"])
    return None


def _call_id(fc: dict) -> str:
    given = fc.get("id")
    return given if isinstance(given, str) and given else "call_" + hex24()


class GeminiStreamToChat:
    """State machine for one answer: feed() each GenerateContentResponse, finish() at the end. Both return chat
    chunks."""

    def __init__(self, model: str, signatures: CallSignatures | None = None) -> None:
        self.model = model
        self.signatures = signatures  # where the calls' thoughtSignatures are kept for the next turn
        self.id = new_completion_id()
        self.created = int(time.time())
        self.calls = 0
        self.finish_reason: str | None = None  # Gemini's, once a response carried one
        self.meta: dict | None = None  # the latest usageMetadata
        self.started_content = False
        self._role_sent = False

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def feed(self, resp: dict) -> list[dict]:
        out: list[dict] = []
        if isinstance(resp.get("usageMetadata"), dict):
            self.meta = resp["usageMetadata"]
        cand = _candidate(resp)
        content = cand.get("content")
        for part in (content.get("parts") if isinstance(content, dict) else None) or ():
            if not isinstance(part, dict):
                continue
            fc = part.get("functionCall")
            if isinstance(fc, dict):
                args = fc.get("args")
                call_id = _call_id(fc)
                signature = part.get("thoughtSignature")
                if self.signatures is not None and isinstance(signature, str) and signature:
                    self.signatures.remember(call_id, signature)
                out.append(self._chunk({"tool_calls": [{
                    "index": self.calls, "id": call_id, "type": "function",
                    "function": {"name": str(fc.get("name") or ""),
                                 "arguments": orjson.dumps(args if isinstance(args, dict) else {}).decode()}}]}))
                self.calls += 1
                self.started_content = True
            elif isinstance(part.get("text"), str) and part["text"]:
                key = "reasoning_content" if part.get("thought") is True else "content"
                out.append(self._chunk({key: part["text"]}))
                self.started_content = True
        reason = cand.get("finishReason")
        if isinstance(reason, str) and reason and reason != "FINISH_REASON_UNSPECIFIED":
            self.finish_reason = reason
        if blocked(resp):
            self.finish_reason = "SAFETY"
        return out

    def finish(self) -> list[dict]:
        """The closing chunks: the finish reason, then the usage on a chunk of its own (`choices: []`), as chat
        streams with `include_usage` end."""
        out = [self._chunk({}, chat_finish(self.finish_reason, self.calls > 0))]
        usage = chat_usage(self.meta)
        if usage is not None:
            out.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage})
        return out


def gemini_response_to_chat(resp: dict, model: str, signatures: CallSignatures | None = None) -> dict:
    """A whole GenerateContentResponse as a chat completion."""
    tr = GeminiStreamToChat(model, signatures)
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for chunk in tr.feed(resp):
        delta = chunk["choices"][0]["delta"]
        if "content" in delta:
            text.append(delta["content"])
        if "reasoning_content" in delta:
            reasoning.append(delta["reasoning_content"])
        for tc in delta.get("tool_calls") or ():
            calls.append({"id": tc["id"], "type": "function", "function": tc["function"]})
    message: dict = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    completion: dict = {"id": tr.id, "object": "chat.completion", "created": tr.created, "model": model,
                        "choices": [{"index": 0, "message": message,
                                     "finish_reason": chat_finish(tr.finish_reason, bool(calls))}]}
    usage = chat_usage(tr.meta)
    if usage is not None:
        completion["usage"] = usage
    return completion
