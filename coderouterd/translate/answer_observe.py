"""What an upstream's answer looked like, read off its own wire (OpenAI chunks or messages, Anthropic events
or messages) into `quality.drift.AnswerStats` for drift detection."""

from __future__ import annotations

import orjson

from .answer_stats import AnswerStats


def observe_openai(answer: AnswerStats, obj: dict) -> None:
    """What a chat.completion (chunk or whole) says about the answer, for drift detection."""
    for ch in obj.get("choices") or ():
        if (ch.get("index") or 0) != 0:
            continue
        d = ch.get("delta") or ch.get("message") or {}
        content = d.get("content")
        if isinstance(content, str) and content:
            answer.text(content)
        for tc in d.get("tool_calls") or ():
            answer.tool_called = True
            args = (tc.get("function") or {}).get("arguments")
            if isinstance(args, str):
                answer.arguments(args)
        if ch.get("finish_reason"):
            answer.finish(ch["finish_reason"])


def observe_anthropic(answer: AnswerStats, obj: dict) -> None:
    """The same for an Anthropic event or whole message."""
    etype = obj.get("type")
    if etype == "content_block_delta":
        d = obj.get("delta") or {}
        if d.get("type") == "text_delta":
            answer.text(d.get("text") or "")
        elif d.get("type") == "input_json_delta":
            answer.arguments(d.get("partial_json") or "")
    elif etype == "content_block_start":
        if (obj.get("content_block") or {}).get("type") == "tool_use":
            answer.tool_called = True
    elif etype == "message_delta":
        answer.finish((obj.get("delta") or {}).get("stop_reason"))
    elif etype == "message":
        for block in obj.get("content") or ():
            if block.get("type") == "text":
                answer.text(block.get("text") or "")
            elif block.get("type") == "tool_use":
                answer.tool_called = True
                answer.arguments(orjson.dumps(block.get("input") or {}).decode())
        answer.finish(obj.get("stop_reason"))
