"""Issue 23 item 8: thinking blocks an Anthropic upstream did not sign never reach it (translate/unsigned_thinking)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from coderouterd.providers.strategies import AnthropicPassthrough
from coderouterd.translate.openai_answer_to_anthropic import SYNTHETIC_SIGNATURE
from coderouterd.translate.unsigned_thinking import (
    WALK_FIRST_MAX_MESSAGES,
    SignatureBook,
    may_carry_unsigned,
    unsigned_thinking_fix,
    without_unsigned_thinking,
)

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


# Blocks the byte scan and the walk judge differently: a thinking block without a signature key (the walk calls
# it unsigned, the scan sees no key), and an empty "signature" in a tool's input (the scan sees it, the walk
# does not look there).
_EDGE_BLOCKS = st.sampled_from([LOCAL, SIGNED, CALL, {"type": "thinking", "thinking": "no key"},
                                {"type": "tool_use", "id": "toolu_2", "name": "Sign", "input": {"signature": ""}},
                                {"type": "thinking", "thinking": "n", "signature": None}])


@given(turns=st.lists(st.lists(_EDGE_BLOCKS, min_size=1, max_size=3), min_size=1, max_size=4),
       padding=st.sampled_from([0, WALK_FIRST_MAX_MESSAGES]), foreign=st.booleans())
def test_the_fix_is_the_scan_then_the_walk_whichever_runs_first(turns, padding, foreign):
    """unsigned_thinking_fix walks a body of few messages before scanning its bytes: the answer is the one the
    scan-then-walk definition gives, on bodies under and over the walk-first bound."""
    messages = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}] * (padding // 2)
    for t in turns:
        messages += [{"role": "assistant", "content": t}, RESULT]
    body = _body(*messages, **CLAUDE_CODE)
    raw = orjson.dumps(body)
    book = _book() if foreign else SignatureBook()
    up = book.for_upstream(A)
    expected = (without_unsigned_thinking(body, up) if may_carry_unsigned(raw) or up.may_hold_foreign()
                else None)
    assert unsigned_thinking_fix(body, raw, up) == expected
    assert unsigned_thinking_fix(body, raw) == (without_unsigned_thinking(body) if may_carry_unsigned(raw) else None)


def test_the_passthrough_strategy_sends_the_scrubbed_body_and_the_same_bytes_otherwise():
    body = _body({"role": "assistant", "content": [LOCAL, CALL]}, RESULT, **CLAUDE_CODE)
    raw = orjson.dumps(body)
    up = orjson.loads(AnthropicPassthrough(model="m", skip_prologue=False, client_body=body).request(raw, True))
    assert up["messages"][1]["content"][0] == {"type": "text", "text": "the local model thought"}
    clean = orjson.dumps(_body())
    assert AnthropicPassthrough(model="m", skip_prologue=False, client_body=_body()).request(clean, True) is clean


# -- between Anthropic upstreams: a block one signed is foreign to another ---------------------------------------

A, B = "https://api.anthropic.com", "https://gateway.example"
BY_A = {"type": "thinking", "thinking": "A thought", "signature": "c2lnbmVkIGJ5IEE="}
BY_B = {"type": "thinking", "thinking": "B thought", "signature": "c2lnbmVkIGJ5IEI="}
REDACTED_B = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVkIGJ5IEI="}


def _book() -> SignatureBook:
    book = SignatureBook()
    book.for_upstream(A).record_block(BY_A)
    up_b = book.for_upstream(B)
    up_b.record_block(BY_B)
    up_b.record_block(REDACTED_B)
    return book


def test_blocks_another_upstream_signed_do_not_go_to_this_one_and_its_own_and_unknown_ones_do():
    book = _book()
    unknown = {"type": "thinking", "thinking": "?", "signature": "bmV2ZXIgc2Vlbg=="}
    body = _body({"role": "assistant", "content": [BY_B, REDACTED_B, {"type": "text", "text": "one"}]},
                 {"role": "user", "content": "next"},
                 {"role": "assistant", "content": [BY_A, unknown, {"type": "text", "text": "two"}]},
                 {"role": "user", "content": "more"}, **CLAUDE_CODE)
    to_a = without_unsigned_thinking(body, book.for_upstream(A))
    assert to_a["messages"][1]["content"] == [{"type": "text", "text": "one"}]
    assert to_a["messages"][3]["content"] == [BY_A, unknown, {"type": "text", "text": "two"}]
    to_b = without_unsigned_thinking(body, book.for_upstream(B))
    assert to_b["messages"][1]["content"] == body["messages"][1]["content"]
    assert to_b["messages"][3]["content"] == [unknown, {"type": "text", "text": "two"}]
    assert to_a["thinking"] == to_b["thinking"] == CLAUDE_CODE["thinking"]  # no tool turn in progress


def test_a_tool_turn_another_upstream_thought_goes_as_text_and_thinking_off():
    book = _book()
    body = _body({"role": "assistant", "content": [BY_B, CALL]}, RESULT, **CLAUDE_CODE)
    fixed = without_unsigned_thinking(body, book.for_upstream(A))
    assert fixed["messages"][1]["content"] == [{"type": "text", "text": "B thought"}, CALL]
    assert "thinking" not in fixed and "context_management" not in fixed


def test_with_one_signer_nothing_is_foreign_and_the_book_is_bounded():
    book = SignatureBook(limit=3)
    up = book.for_upstream(A)
    assert not up.may_hold_foreign() and not book.for_upstream(B).may_hold_foreign()
    for i in range(10):
        up.record(f"sig{i}")
    up.record("")  # nothing to remember
    up.record(SYNTHETIC_SIGNATURE)
    assert len(book) == 3
    assert book.for_upstream(B).may_hold_foreign() and not up.may_hold_foreign()
    assert book.for_upstream(B).foreign("sig9") and not book.for_upstream(B).foreign("sig0")  # forgotten


def test_the_passthrough_strategy_records_what_its_upstream_signs_streamed_and_whole():
    book = SignatureBook()
    streamed = AnthropicPassthrough(model="m", skip_prologue=False, client_body=_body(),
                                    signatures=book.for_upstream(A))
    events = [("message_start", orjson.dumps({"type": "message_start", "message": {"usage": {}}}).decode()),
              ("content_block_start", orjson.dumps({"type": "content_block_start", "index": 0, "content_block":
                                                    {"type": "thinking", "thinking": "", "signature": ""}}).decode()),
              ("content_block_delta", orjson.dumps({"type": "content_block_delta", "index": 0, "delta":
                                                    {"type": "thinking_delta", "thinking": "A thought"}}).decode()),
              ("content_block_delta", orjson.dumps({"type": "content_block_delta", "index": 0, "delta":
                                                    {"type": "signature_delta",
                                                     "signature": BY_A["signature"]}}).decode()),
              ("content_block_start", orjson.dumps({"type": "content_block_start", "index": 1,
                                                    "content_block": {"type": "redacted_thinking",
                                                                      "data": "cmVkYWN0ZWQgQQ=="}}).decode())]
    streamed.events(events)
    whole = AnthropicPassthrough(model="m", skip_prologue=False, client_body=_body(),
                                 signatures=book.for_upstream(B))
    whole.response(orjson.dumps({"type": "message", "content": [BY_B, {"type": "text", "text": "hi"}],
                                 "usage": {}}))
    assert book.for_upstream(B).foreign(BY_A["signature"]) and book.for_upstream(B).foreign("cmVkYWN0ZWQgQQ==")
    assert book.for_upstream(A).foreign(BY_B["signature"]) and not book.for_upstream(A).foreign(BY_A["signature"])
    # And what goes to B from a conversation A answered loses A's block.
    body = _body({"role": "assistant", "content": [BY_A, {"type": "text", "text": "x"}]},
                 {"role": "user", "content": "y"})
    up = orjson.loads(AnthropicPassthrough(model="m", skip_prologue=False, client_body=body,
                                           signatures=book.for_upstream(B)).request(orjson.dumps(body), True))
    assert up["messages"][1]["content"] == [{"type": "text", "text": "x"}]
