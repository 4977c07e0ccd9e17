"""What a stream cut before its end is billed for (issue 41): the upstream's own count where it covers everything
it produced, else an estimate of the rest, marked."""

from __future__ import annotations

from coderouterd.translate.answer_stats import Produced, cut_usage


def _openai(text: str, usage: dict | None = None) -> dict:
    obj: dict = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if usage:
        obj["usage"] = usage
    return obj


def test_an_openai_stream_without_usage_is_estimated_from_what_it_produced():
    p = Produced()
    for _ in range(10):
        p.openai(_openai("abcdefgh"))  # 80 characters
    p.openai({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}xx"}}]}}]})
    usage, estimated = cut_usage(p, {}, input_estimate=120)
    assert estimated and usage == {"input_tokens": 120, "output_tokens": 21}


def test_running_usage_that_covers_the_last_content_is_the_upstreams_own():
    p = Produced()
    p.openai(_openai("abcd", {"prompt_tokens": 50, "completion_tokens": 1}))
    p.openai(_openai("efgh", {"prompt_tokens": 50, "completion_tokens": 2}))
    reported = {"input_tokens": 50, "output_tokens": 2}
    assert cut_usage(p, reported, input_estimate=999) == (reported, False)
    p.openai(_openai("more text after the last report"))  # content the report does not cover yet
    usage, estimated = cut_usage(p, reported, input_estimate=999)
    assert estimated and usage["input_tokens"] == 50 and usage["output_tokens"] >= 2


def test_anthropic_reports_the_prompt_at_the_start_and_the_output_only_at_the_end():
    p = Produced()
    p.anthropic("message_start", {"message": {"usage": {"input_tokens": 321, "output_tokens": 1}}})
    for _ in range(5):
        p.anthropic("content_block_delta", {"delta": {"type": "text_delta", "text": "12345678"}})
    p.anthropic("content_block_delta", {"delta": {"type": "thinking_delta", "thinking": "abcd"}})
    usage, estimated = cut_usage(p, {"input_tokens": 321, "output_tokens": 1}, input_estimate=5)
    assert estimated and usage == {"input_tokens": 321, "output_tokens": 11}
    p.anthropic("message_delta", {"usage": {"output_tokens": 12}})
    assert cut_usage(p, {"input_tokens": 321, "output_tokens": 12}, input_estimate=5) == (
        {"input_tokens": 321, "output_tokens": 12}, False)


def test_responses_deltas_count():
    p = Produced()
    p.responses("response.output_text.delta", {"delta": "abcdefgh"})
    p.responses("response.function_call_arguments.delta", {"delta": "{}"})
    p.responses("response.created", {"response": {}})
    assert p.chars == 10 and not p.reported
