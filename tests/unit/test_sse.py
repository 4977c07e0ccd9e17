import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coderouterd.wire.sse import DONE, EventTooLarge, SSEParser, encode_data, encode_event

ENCODE_CASES = [
    (
        "message_stop",
        {"type": "message_stop"},
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ),
    (
        "unicode kept as utf-8",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "é😀"}},
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"\xc3\xa9\xf0\x9f\x98\x80"}}\n\n',
    ),
    (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n',
    ),
]


@pytest.mark.parametrize("name,event,expected", ENCODE_CASES, ids=[c[0] for c in ENCODE_CASES])
def test_encode_event(name, event, expected):
    assert encode_event(event) == expected


def test_encode_data_and_done():
    assert encode_data({"a": [1, "x"]}) == b'data: {"a":[1,"x"]}\n\n'
    assert DONE == b"data: [DONE]\n\n"


PARSE_CASES = [
    (
        "anthropic pair",
        b'event: ping\ndata: {"type":"ping"}\n\n',
        [("ping", '{"type":"ping"}')],
    ),
    (
        "openai data and done",
        b'data: {"a":1}\n\ndata: [DONE]\n\n',
        [(None, '{"a":1}'), (None, "[DONE]")],
    ),
    ("crlf line ends", b"event: x\r\ndata: 1\r\n\r\n", [("x", "1")]),
    ("bare cr line ends", b"event: x\rdata: 1\r\rdata: 2\n\n", [("x", "1"), (None, "2")]),
    ("comment ping ignored", b": ping\n\n:keepalive\ndata: a\n\n", [(None, "a")]),
    ("multi-line data joined", b"data: a\ndata:b\ndata:  c\n\n", [(None, "a\nb\n c")]),
    ("empty data value", b"data:\n\n", [(None, "")]),
    ("event without data is not dispatched", b"event: x\n\ndata: y\n\n", [(None, "y")]),
    ("event name reset after dispatch", b"event: x\ndata: 1\n\ndata: 2\n\n", [("x", "1"), (None, "2")]),
    ("id and retry ignored", b"id: 7\nretry: 10\ndata: z\n\n", [(None, "z")]),
    ("leading bom stripped", b"\xef\xbb\xbfdata: q\n\n", [(None, "q")]),
    ("multibyte utf-8", "data: héllo 😀 中\n\n".encode(), [(None, "héllo 😀 中")]),
    ("unterminated last event flushed", b"data: a\n\ndata: tail", [(None, "a"), (None, "tail")]),
    ("unterminated with newline flushed", b"event: e\ndata: t\n", [("e", "t")]),
    ("trailing cr flushed", b"data: t\r", [(None, "t")]),
    ("line without colon ignored", b"garbage\ndata: ok\n\n", [(None, "ok")]),
]


def _parse_whole(raw: bytes):
    parser = SSEParser()
    return parser.feed(raw) + parser.flush()


def _parse_pieces(pieces):
    parser = SSEParser()
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.flush()


@pytest.mark.parametrize("name,raw,expected", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_whole(name, raw, expected):
    assert _parse_whole(raw) == expected


@pytest.mark.parametrize("name,raw,expected", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_one_byte_at_a_time_equals_whole(name, raw, expected):
    assert _parse_pieces([raw[i : i + 1] for i in range(len(raw))]) == expected


@pytest.mark.parametrize("name,raw,expected", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_every_two_way_split(name, raw, expected):
    for i in range(len(raw) + 1):
        assert _parse_pieces([raw[:i], raw[i:]]) == expected, i


def test_crlf_split_between_cr_and_lf_is_one_line_end():
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    # Had the "\r" been taken as a line end on its own, the "\n" would dispatch the event here.
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r\n") == [(None, "a")]


def test_events_dispatched_as_soon_as_complete():
    parser = SSEParser()
    assert parser.feed(b"data: 1\n\ndata: 2") == [(None, "1")]
    assert parser.feed(b"\n\n") == [(None, "2")]
    assert parser.flush() == []


def test_encoded_events_round_trip_through_parser():
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "content": []}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a\nb\r\n😀"}},
        {"type": "message_stop"},
    ]
    raw = b"".join(encode_event(e) for e in events) + encode_data({"x": "y"}) + DONE
    parsed = _parse_pieces([raw[i : i + 3] for i in range(0, len(raw), 3)])
    assert [name for name, _ in parsed] == ["message_start", "content_block_delta", "message_stop", None, None]
    assert [orjson.loads(data) for _, data in parsed[:4]] == events + [{"x": "y"}]
    assert parsed[4] == (None, "[DONE]")


def test_large_line_in_many_small_chunks():
    payload = "x" * 200_000
    raw = f"data: {payload}\n\n".encode()
    parser = SSEParser()
    out = []
    for i in range(0, len(raw), 7):
        out += parser.feed(raw[i : i + 7])
    assert out == [(None, payload)]


def _parse_all(parser: SSEParser, chunks: list[bytes]) -> list:
    out = []
    for c in chunks:
        out += parser.feed(c)
    return out + parser.flush()


@settings(max_examples=300, derandomize=True, deadline=None)
@given(lines=st.lists(st.sampled_from(["data: {\"a\": 1}", "data:x", "data", "event: ping", "event:msg", ": comment",
                                       "", "id: 7", "dataX: no", "data: ünïcödé ✓", "retry: 10"]), max_size=30),
       bom=st.booleans(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_fast_path_equals_the_line_by_line_parse(lines, bom, cuts):
    raw = ("\ufeff" if bom else "").encode() + "".join(f"{ln}\n" for ln in lines).encode()
    points = sorted({c for c in cuts if c < len(raw)})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    ref = SSEParser()  # the reference: each line through the general line handler
    reference: list = []
    for line in raw.split(b"\n")[:-1]:
        ref._line(line, reference)
    reference += ref.flush()
    assert _parse_all(SSEParser(), chunks) == reference


# -- bounds (issue 23: a stream without newlines, or data lines without a blank line, grew without end) -----------

def _feed_all(p: SSEParser, raw: bytes, cuts: list[int]) -> list:
    out, prev = [], 0
    for c in sorted({min(c, len(raw)) for c in cuts}) + [len(raw)]:
        out += p.feed(raw[prev:c])
        prev = c
    return out


@settings(max_examples=300, deadline=None)
@given(size=st.one_of(st.integers(1, 400), st.sampled_from([28, 29, 250, 251])), line_end=st.sampled_from([b"", b"\r"]), line_ends=st.sampled_from([b"\n", b"\r\n", b"\r"]),
       kind=st.sampled_from(["line", "event"]), cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_a_line_or_event_past_its_bound_raises_whatever_the_chunking(size, line_end, line_ends, kind, cuts):
    """Bounds of 256 bytes: anything past them raises before the parser holds more than a chunk beyond them; and
    anything within them parses as before."""
    p = SSEParser(max_line=256, max_event=256)
    if kind == "line":  # one line that never ends (an optional lone CR at the end is not an end either)
        raw = b"data: " + b"x" * size + line_end
        too_big = len(raw) - len(line_end) > 256
    else:  # many short data lines and no blank line
        raw = (b"data: xxxxxxxxx" + line_ends) * size
        # The data, without its field names; a last lone "\r" may be half of "\r\n", so that line waits.
        too_big = (size - (line_ends == b"\r")) * 9 > 256
    if too_big:
        with pytest.raises(EventTooLarge):
            _feed_all(p, raw, cuts)
    else:
        _feed_all(p, raw, cuts)


def test_events_under_the_bound_never_raise_however_many():
    p = SSEParser(max_line=64, max_event=64)
    raw = b"event: e\ndata: " + b"y" * 40 + b"\n\n"
    out = []
    for _ in range(1000):
        out += p.feed(raw)
    assert len(out) == 1000


def _held_by(tb) -> int:
    """Bytes of buffers and event data the frames of a traceback still name (what keeping the exception keeps)."""
    held = 0
    while tb is not None:
        for name, v in tb.tb_frame.f_locals.items():
            if name == "chunk":
                continue  # the caller's own read: one chunk, not what accumulated
            if isinstance(v, bytearray):
                held += len(v)
            elif isinstance(v, list) and v and isinstance(v[0], str):
                held += sum(len(x) for x in v)
        tb = tb.tb_next
    return held


@pytest.mark.parametrize("chunks", [
    [b"data: " + b"x" * 300] * 20,  # one line that never ends, over many reads
    [b"data: " + b"y" * 50 + b"\n"] * 40,  # data lines and no blank line: an event that never ends
    [b"data: " + b"z" * 50 + b"\r\n"] * 40,  # the same with CRLF (the buffered path)
])
def test_a_refused_stream_leaves_nothing_accumulated_in_the_exception(chunks):
    """Issue 23 soak: whoever keeps the error a while (a traceback outlives the request) must not keep up to a line's
    or an event's bound with it: the soak's RSS grew by tens of MB a minute from such tracebacks."""
    p = SSEParser(max_line=1000, max_event=1000)
    with pytest.raises(EventTooLarge) as info:
        for c in chunks:
            p.feed(c)
    assert _held_by(info.value.__traceback__) == 0
    assert p.feed(b"data: ok\n\n") == [(None, "ok")]  # and the parser is usable (empty) again
