"""What a cut stream is billed for counts every character the upstream produced (issue 41): reasoning and tool
arguments that come beside an empty `content`, and a Gemini client's stream as much as any other client's."""

from __future__ import annotations

from coderouterd.translate.answer_stats import Produced


def _delta(**d) -> dict:
    return {"choices": [{"index": 0, "delta": d}]}


def test_reasoning_and_tool_arguments_beside_an_empty_content_are_counted():
    p = Produced()
    p.openai(_delta(role="assistant", content="", reasoning="abcdefgh"))  # as OpenRouter streams reasoning
    p.openai(_delta(content="", tool_calls=[{"index": 0, "function": {"arguments": "{\"a\":1}"}}]))
    assert p.chars == 8 + 7
