"""Issue 23 item 8: thinking blocks an Anthropic upstream did not sign never reach it (translate/unsigned_thinking)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from coderouterd.providers.strategies import AnthropicPassthrough
from coderouterd.translate.openai_to_anthropic import SYNTHETIC_SIGNATURE
from coderouterd.translate.unsigned_thinking import may_carry_unsigned, without_unsigned_thinking

LOCAL = {"type": "thinking", "thinking": "the local model thought", "signature": SYNTHETIC_SIGNATURE}
SIGNED = {"type": "thinking", "thinking": "Claude thought", "signature": "RXJpYy1zaWduZWQ="}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"}]}
CLAUDE_CODE = {"thinking": {"type": "adaptive"},
               "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}


def _body(*messages, **extra) -> dict:
    return {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "go"}, *messages], **extra}


def test_a_tool_loop_begun_locally_goes_up_without_thinking_and_with_the_reasoning_as_text():
    body = _body({"role": "assistant", "content": [LOCAL, CALL]}, RESULT, **CLAUDE_CODE)
    fixed = without_unsigned_thinking(body)
    assert fixed["messages"][1]["content"] == [{"type": "text", "text": "the local model thought"}, CALL]
    # The API wants that turn to open with a signed thinking block when thinking is on: thinking is off for this
    # request, and the edit that needs it goes too.
    assert "thinking" not in fixed and "context_management" not in fixed
    assert body["messages"][1]["content"] == [LOCAL, CALL] and body["thinking"]  # the client's body is untouched


def test_earlier_turns_lose_unsigned_thinking_keep_signed_and_thinking_stays_on():
    body = _body({"role": "assistant", "content": [LOCAL, {"type": "text", "text": "done"}]},
                 {"role": "user", "content": "next"},
                 {"role": "assistant", "content": [SIGNED, {"type": "thinking", "thinking": "x", "signature": ""},
                                                   CALL]}, RESULT, **CLAUDE_CODE)
    fixed = without_unsigned_thinking(body)
    assert fixed["messages"][1]["content"] == [{"type": "text", "text": "done"}]
    assert fixed["messages"][3]["content"] == [SIGNED, {"type": "text", "text": "x"}, CALL]
    assert fixed["thinking"] == CLAUDE_CODE["thinking"] and fixed["context_management"]


def test_a_turn_that_was_only_local_thinking_goes_and_signed_bodies_are_left_alone():
    body = _body({"role": "assistant", "content": [LOCAL]}, {"role": "user", "content": "more"})
    assert [m["role"] for m in without_unsigned_thinking(body)["messages"]] == ["user", "user"]
    signed = _body({"role": "assistant", "content": [SIGNED, CALL]}, RESULT, **CLAUDE_CODE)
    assert without_unsigned_thinking(signed) is None
    assert not may_carry_unsigned(orjson.dumps(signed))


_BLOCKS = st.sampled_from([LOCAL, SIGNED, CALL, {"type": "text", "text": "t"},
                           {"type": "thinking", "thinking": "y", "signature": ""},
                           {"type": "redacted_thinking", "data": "abc"}])


@given(turns=st.lists(st.lists(_BLOCKS, min_size=1, max_size=4), min_size=1, max_size=5),
       thinking=st.sampled_from([None, {"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}]))
def test_what_goes_up_never_holds_an_unsigned_block_and_keeps_the_thinking_rule(turns, thinking):
    messages = []
    for t in turns:
        messages += [{"role": "assistant", "content": t}, RESULT]
    body = _body(*messages, **({"thinking": thinking} if thinking else {}))
    raw = orjson.dumps(body)
    fixed = without_unsigned_thinking(body) if may_carry_unsigned(raw) else None
    sent = fixed or body
    blocks = [b for m in sent["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert LOCAL not in blocks and not any(b.get("signature") == "" for b in blocks)
    assert blocks.count(SIGNED) == sum(t.count(SIGNED) for t in turns)  # what the upstream signed stays
    last = next((m["content"] for m in reversed(sent["messages"]) if m["role"] == "assistant"), None)
    if sent.get("thinking") and fixed is not None and last and CALL in last:
        assert last[0]["type"] in ("thinking", "redacted_thinking")


def test_the_passthrough_strategy_sends_the_scrubbed_body_and_the_same_bytes_otherwise():
    body = _body({"role": "assistant", "content": [LOCAL, CALL]}, RESULT, **CLAUDE_CODE)
    raw = orjson.dumps(body)
    up = orjson.loads(AnthropicPassthrough(model="m", skip_prologue=False, client_body=body).request(raw, True))
    assert up["messages"][1]["content"][0] == {"type": "text", "text": "the local model thought"}
    clean = orjson.dumps(_body())
    assert AnthropicPassthrough(model="m", skip_prologue=False, client_body=_body()).request(clean, True) is clean
