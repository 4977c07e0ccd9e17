"""What a cut stream is billed for counts every character the upstream produced (issue 41): reasoning and tool
arguments that come beside an empty `content`, and a Gemini client's stream as much as any other client's."""

from __future__ import annotations

import orjson

from coderouterd.providers.gemini_strategies import GeminiToChat
from coderouterd.translate.answer_stats import Produced, cut_usage
from coderouterd.translate.gemini_request import translate_request


def _delta(**d) -> dict:
    return {"choices": [{"index": 0, "delta": d}]}


def test_reasoning_and_tool_arguments_beside_an_empty_content_are_counted():
    p = Produced()
    p.openai(_delta(role="assistant", content="", reasoning="abcdefgh"))  # as OpenRouter streams reasoning
    p.openai(_delta(content="", tool_calls=[{"index": 0, "function": {"arguments": "{\"a\":1}"}}]))
    assert p.chars == 8 + 7


def test_a_gemini_clients_stream_from_a_chat_upstream_is_counted():
    body = {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}
    rq = translate_request(body, "gemini-x", stream=True, sse=True)
    st = GeminiToChat(model="m", skip_prologue=False, client_body=rq.chat, native=rq, provider_name="paid",
                      answer_model="gemini-x")
    st.events([(None, orjson.dumps(_delta(role="assistant", content="tok0 tok1 ")).decode()),
               (None, orjson.dumps(_delta(content="tok2 tok3 ")).decode())])
    assert st.produced.chars == 20
    usage, estimated = cut_usage(st.produced, st.usage or {}, input_estimate=10)
    assert estimated and usage["output_tokens"] == 5
