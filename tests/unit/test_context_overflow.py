"""Context overflow as each server kind words it: recognised, and its numbers read right or said unknown."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coderouterd.servers.overflow import client_message, parse

# (name, status, body, expected)
CASES = [
    ("llama.cpp typed error, older message", 400,
     {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 40213, "n_ctx": 32768}},
     (40213, 32768)),
    ("llama.cpp current message alone", 400,
     {"error": {"message": "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing "
                           "it"}}, (9000, 8192)),
    ("llama.cpp input larger than max context", 400,
     {"error": {"message": "input (5000 tokens) is larger than the max context size (4096 tokens). skipping"}},
     (5000, 4096)),
    ("openai messages resulted in", 400,
     {"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
                           "9000 tokens. Please reduce the length of the messages.", "type": "invalid_request_error",
                "param": "messages", "code": "context_length_exceeded"}},
     (9000, 8192)),
    ("openai code, no numbers", 400,
     {"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try "
                           "again.", "type": "invalid_request_error", "code": "context_length_exceeded"}}, (0, 0)),
    ("vllm classic", 400,
     {"object": "error", "message": "This model's maximum context length is 32768 tokens. However, you requested "
                                    "40000 tokens (39000 in the messages, 1000 in the completion). Please reduce the "
                                    "length of the messages or completion.", "type": "BadRequestError"},
     (39000, 32768)),  # the prompt is the messages' count: the 40000 requested include the completion
    ("anthropic output room", 400,
     {"type": "error", "error": {"type": "invalid_request_error",
                                 "message": "input length and `max_tokens` exceed context limit: 188240 + 21333 > "
                                            "200000, decrease input length or `max_tokens` and try again"}},
     (188240, 200000)),
    ("vllm request has input tokens", 400,
     {"error": {"message": "This model's maximum context length is 8192 tokens. However, your request has 9001 input "
                           "tokens. Please reduce the length of the input messages."}},
     (9001, 8192)),
    ("vllm current: passed input tokens", 400,
     {"error": {"message": "You passed 5000 input tokens and requested 1000 output tokens. However, the model's "
                           "context length is only 4096 tokens, resulting in a maximum input length of 3096 tokens. "
                           "Please reduce the length of the input prompt.", "type": "BadRequestError",
                "param": "input_tokens", "code": 400}},
     (5000, 3096)),
    ("vllm current: passed input characters", 400,
     {"error": {"message": "You passed 90000 input characters and requested 0 output tokens. However, the model's "
                           "context length is only 4096 tokens, resulting in a maximum input length of 4096 tokens "
                           "(at most 81920 characters). Please reduce the length of the input prompt."}},
     (0, 4096)),
    ("bare context length exceeded", 400, {"error": {"message": "context length exceeded"}}, (0, 0)),
    ("lm studio", 400,
     {"error": "Trying to keep the first 50000 tokens when context the overflows. However, the model is loaded with "
               "context length of only 4096 tokens, which is not enough."},
     (50000, 4096)),
    ("ollama string error", 500, {"error": "prompt too long; exceeded max context length by 100 tokens"}, (0, 0)),
    ("anthropic wording", 400,
     {"type": "error", "error": {"type": "invalid_request_error",
                                 "message": "prompt is too long: 210000 tokens > 200000 maximum"}},
     (210000, 200000)),
    ("thousands separators", 400, {"error": {"message": "Input length (37,184) exceeds the maximum context length "
                                                        "is 32,768"}}, (0, 32768)),
    ("context window phrase", 400, {"error": {"message": "input exceeds the context window"}}, (0, 0)),
    ("plain text body", 500, "error: n_ctx = 4096 is too small, prompt has 5000 tokens", (5000, 4096)),
    ("json text body", 400, '{"error":{"type":"exceed_context_size_error","n_prompt_tokens":9,"n_ctx":8}}', (9, 8)),
    ("unrelated 400", 400, {"error": {"message": "Invalid value for temperature", "type": "invalid_request_error"}},
     None),
    ("model not found mentioning context", 404,
     {"error": {"message": "model 'ctx' not found, context length unknown"}}, None),
    ("loading model", 503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, None),
    ("garbage text", 502, "Bad Gateway", None),
]


@pytest.mark.parametrize("name,status,body,expected", CASES, ids=[c[0] for c in CASES])
def test_overflow_recognition(name, status, body, expected):
    assert parse(status, body) == expected


# Each wording with its numbers left open: (template, which numbers it states). The limit vLLM states for the
# prompt is its maximum input length (the context minus the requested output).
TEMPLATES = [
    ("request ({p} tokens) exceeds the available context size ({m} tokens), try increasing it", "pm"),
    ("This model's maximum context length is {m} tokens. However, your messages resulted in {p} tokens. Please "
     "reduce the length of the messages.", "pm"),
    ("This model's maximum context length is {m} tokens. However, you requested {q} tokens ({p} in the messages, "
     "{r} in the completion). Please reduce the length of the messages or completion.", "pm"),
    ("input length and `max_tokens` exceed context limit: {p} + {r} > {m}, decrease input length or `max_tokens` "
     "and try again", "pm"),
    ("This model's maximum context length is {m} tokens. However, your request has {p} input tokens. Please reduce "
     "the length of the input messages.", "pm"),
    ("You passed {p} input tokens and requested {r} output tokens. However, the model's context length is only {q} "
     "tokens, resulting in a maximum input length of {m} tokens. Please reduce the length of the input prompt.",
     "pm"),
    ("Trying to keep the first {p} tokens when context the overflows. However, the model is loaded with context "
     "length of only {m} tokens, which is not enough.", "pm"),
    ("prompt is too long: {p} tokens > {m} maximum", "pm"),
    ("This model's maximum context length is {m} tokens.", "m"),
    ("context length exceeded", ""),
    ("prompt too long; exceeded max context length by {r} tokens", ""),
]

numbers = st.integers(min_value=1, max_value=10_000_000)


@pytest.mark.parametrize("template,states", TEMPLATES, ids=[t[0][:40] for t in TEMPLATES])
@given(p=numbers, m=numbers, q=numbers, r=numbers)
def test_every_wording_gives_the_numbers_it_states_and_no_others(template, states, p, m, q, r):
    got = parse(400, {"error": {"message": template.format(p=p, m=m, q=q, r=r)}})
    assert got == (p if "p" in states else 0, m if "m" in states else 0)


def test_client_message_states_numbers_only_when_known():
    assert client_message(9000, 8192) == "prompt is too long: 9000 tokens > 8192 maximum"
    bare = client_message(0, 0, "context length exceeded")
    assert bare.startswith("prompt is too long") and "did not say" in bare and "context length exceeded" in bare
    assert not any(ch.isdigit() for ch in bare)
    only_limit = client_message(0, 4096)
    assert only_limit.startswith("prompt is too long") and "4096" in only_limit and "unknown" in only_limit
    assert ">" not in only_limit  # never the "N tokens > M maximum" form Claude Code would size a compaction by
    fits = client_message(2778, 4096)
    assert not fits.startswith("prompt is too long") and ">" not in fits and "requested output" in fits


# Claude Code's own regexes (read from its code, see servers/overflow.py): it lowers max_tokens and retries on the
# first, compacts on the second. Each case must match exactly the one that helps.
CLAUDE_OUTPUT_ROOM = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
CLAUDE_COMPACT = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)


def test_the_anthropic_wording_of_each_case_is_the_one_claude_code_acts_on():
    over = client_message(9000, 8192, max_tokens=32000)
    assert CLAUDE_COMPACT.search(over).groups() == ("9000", "8192") and not CLAUDE_OUTPUT_ROOM.search(over)
    room = client_message(2778, 4096, max_tokens=32000)
    assert CLAUDE_OUTPUT_ROOM.search(room).groups() == ("2778", "32000", "4096")
    assert "prompt is too long" not in room.lower()  # it must not compact a prompt that fits


def test_openai_and_gemini_wordings_of_each_case():
    assert client_message(9000, 8192, wire="openai") == (
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please "
        "reduce the length of the messages.")
    room = client_message(2778, 4096, max_tokens=2000, wire="responses")
    assert "you requested 4778 tokens (2778 in the messages, 2000 in the completion)" in room
    assert parse(400, {"error": {"message": room}}) == (2778, 4096)  # our own words read back as the server's
    assert client_message(9000, 8192, wire="gemini") == (
        "The input token count (9000) exceeds the maximum number of tokens allowed (8192).")
    assert "maxOutputTokens (2000)" in client_message(2778, 4096, max_tokens=2000, wire="gemini")


def test_an_anthropic_upstream_s_two_overflows_are_overflows_with_their_numbers():
    import orjson

    from coderouterd.providers.adapters.anthropic import anthropic_http_error
    from coderouterd.providers.errors import OVERFLOW

    def err(message: str):
        return anthropic_http_error(400, orjson.dumps({"type": "error", "error": {
            "type": "invalid_request_error", "message": message}}), {})

    room = err("input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length "
               "or `max_tokens` and try again")
    assert (room.reason, room.overflow) == (OVERFLOW, (188240, 200000))
    # Said again to an OpenAI client in its words, with the request's own max_tokens.
    again = client_message(*room.overflow, max_tokens=21333, wire="openai")
    assert "you requested 209573 tokens (188240 in the messages, 21333 in the completion)" in again
    over = err("prompt is too long: 210000 tokens > 200000 maximum")
    assert (over.reason, over.overflow) == (OVERFLOW, (210000, 200000))
