"""What a streamed answer into /v1/responses keeps for its closing events is bounded (issue 34, item 3): a few
bytes over its text, and no more text than a whole non-streamed answer may have; past that the stream ends with
the upstream's failure, which the responder turns into response.failed."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from coderouterd.providers.errors import TOO_LARGE, UpstreamError
from coderouterd.providers.limits import MAX_ANSWER_BYTES
from coderouterd.providers.responses_strategies import ResponsesToChat
from coderouterd.translate.responses_request import translate_request

DELTA = "tok1234 "  # a token-sized piece, as a fast local model streams them


def _strategy() -> ResponsesToChat:
    rq = translate_request({"model": "m", "input": "x", "stream": True})
    return ResponsesToChat(model="local", skip_prologue=False, client_body=rq.chat, native=rq)


def _batch(n: int, content: str = DELTA) -> list[tuple[str | None, str]]:
    data = orjson.dumps({"object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}).decode()
    return [(None, data)] * n


END = [(None, orjson.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).decode()),
       (None, "[DONE]")]


def _completed(raw: bytes) -> dict:
    for block in raw.split(b"\n\n"):
        if block.startswith(b"event: response.completed\n"):
            return orjson.loads(block.split(b"data: ", 1)[1])
    raise AssertionError("no response.completed")


def test_text_kept_for_the_closing_events_costs_about_its_own_size():
    """One string per delta cost ~60 bytes a delta on top of the text (+104 MB for 19 MB of text in 10 s)."""
    st = _strategy()
    batches, per_batch = 200, 250  # 50,000 deltas, 400 KB of text, in batches as reads deliver them
    text_bytes = batches * per_batch * len(DELTA)
    st.events(_batch(1))  # the prologue and the item's opening, outside the measure
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(batches):
            st.events(_batch(per_batch))
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 1.5 * text_bytes, f"{grown:,} bytes kept for {text_bytes:,} bytes of text"
    done = _completed(st.events(END))
    text = done["response"]["output"][0]["content"][0]["text"]
    assert text == DELTA * (1 + batches * per_batch)


def test_past_the_bound_the_stream_ends_as_the_upstreams_failure_naming_it():
    st = _strategy()
    assert st.max_kept == MAX_ANSWER_BYTES  # the bound of a whole answer that is not streamed
    st.max_kept = 10_000
    st.events(_batch(100))  # 800 characters: delivered
    with pytest.raises(UpstreamError) as e:
        for _ in range(20):
            st.events(_batch(100))
    assert e.value.reason == TOO_LARGE
    assert e.value.after_content  # the client has part of it: no failover, response.failed
    assert "longer than 9 KB" in e.value.message and "the stream ends here" in e.value.message


def test_a_first_batch_past_the_bound_may_still_fail_over():
    st = _strategy()
    st.max_kept = 100
    with pytest.raises(UpstreamError) as e:
        st.events(_batch(100))
    assert e.value.reason == TOO_LARGE and not e.value.after_content  # the client saw none of it


def test_a_batch_that_ends_the_answer_is_sent_even_past_the_bound():
    st = _strategy()
    st.max_kept = 1_000
    st.events(_batch(100))
    raw = st.events(_batch(100) + END)  # the closing events are already built: sending them costs nothing more
    assert st.done and _completed(raw)["response"]["status"] == "completed"


def test_the_closing_events_of_a_big_answer_leave_one_at_a_time():
    """They repeat the text four times: built as one write they took ~9x the text at once."""
    st = _strategy()
    big = "x" * 65536
    first = st.events(_batch(20, big))  # 1.25 MB of text
    rest = st.events(END)
    assert b"response.output_text.done" not in rest and not st.done  # held, not yet written
    pieces = []
    while st.held:
        pieces.append(st.next_held())
    assert st.done and len(pieces) == 4
    types = [p.split(b"\n", 1)[0] for p in pieces]
    assert types == [b"event: response.output_text.done", b"event: response.content_part.done",
                     b"event: response.output_item.done", b"event: response.completed"]
    seqs = [orjson.loads(block.split(b"data: ", 1)[1])["sequence_number"]
            for block in (first + rest + b"".join(pieces)).split(b"\n\n") if block]
    assert seqs == list(range(len(seqs)))
    assert _completed(pieces[-1])["response"]["output"][0]["content"][0]["text"] == big * 20
