import pytest

from coderouterd.translate.reasoning import ThinkTagSplitter, split_think_tags

# (name, content, expected merged pieces)
STREAM_CASES = [
    ("plain text", "Hello world", [("text", "Hello world")]),
    ("think then answer", "<think>\nplan it\n</think>\n\nAnswer.", [("thinking", "plan it"), ("text", "Answer.")]),
    ("only thinking", "<think>just thoughts</think>", [("thinking", "just thoughts")]),
    ("text before think", "Hi <think>x</think> there", [("text", "Hi "), ("thinking", "x"), ("text", " there")]),
    ("lookalike tag is text", "a <thinker> b", [("text", "a <thinker> b")]),
    ("lt signs inside thinking", "<think>a<b </c </thin</think>ok", [("thinking", "a<b </c </thin"), ("text", "ok")]),
    ("two think sections", "<think>one</think>mid<think>two</think>end",
     [("thinking", "one"), ("text", "mid"), ("thinking", "two"), ("text", "end")]),
    ("unclosed think", "<think>still going", [("thinking", "still going")]),
    ("partial open tag at end is text", "result <thi", [("text", "result <thi")]),
    ("lone lt at end is text", "a <", [("text", "a <")]),
    ("multibyte", "<think>思考 😀</think>答え", [("thinking", "思考 😀"), ("text", "答え")]),
    ("inner whitespace kept", "<think>a\n\nb</think>x  y", [("thinking", "a\n\nb"), ("text", "x  y")]),
]


def _merge(pieces):
    out = []
    for kind, piece in pieces:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + piece)
        else:
            out.append((kind, piece))
    return out


def _run(chunks, **kwargs):
    splitter = ThinkTagSplitter(**kwargs)
    pieces = []
    for chunk in chunks:
        pieces += splitter.feed(chunk)
    return _merge(pieces + splitter.flush())


@pytest.mark.parametrize("name,text,expected", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_whole(name, text, expected):
    assert _run([text]) == expected


@pytest.mark.parametrize("name,text,expected", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_every_split_point(name, text, expected):
    for i in range(len(text) + 1):
        assert _run([text[:i], text[i:]]) == expected, i


@pytest.mark.parametrize("name,text,expected", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_every_pair_of_split_points(name, text, expected):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert _run([text[:i], text[i:j], text[j:]]) == expected, (i, j)


@pytest.mark.parametrize("name,text,expected", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_one_char_at_a_time(name, text, expected):
    assert _run(list(text)) == expected


def test_feed_output_is_merged_per_call():
    splitter = ThinkTagSplitter()
    assert splitter.feed("<think>a</think>b c") == [("thinking", "a"), ("text", "b c")]


def test_partial_tag_held_until_resolved():
    splitter = ThinkTagSplitter()
    assert splitter.feed("x<th") == [("text", "x")]
    assert splitter.feed("ink>y") == [("thinking", "y")]
    assert splitter.feed("</thin") == []
    assert splitter.feed("k>z") == [("text", "z")]
    assert splitter.flush() == []


def test_flush_keeps_splitter_usable():
    splitter = ThinkTagSplitter()
    assert splitter.feed("a<") == [("text", "a")]
    assert splitter.flush() == [("text", "<")]
    assert splitter.feed("<think>t</think>") == [("thinking", "t")]


def test_start_in_think_for_templates_that_open_the_tag():
    assert _run(["reasoning here</th", "ink>\n\nanswer"], start_in_think=True) == [
        ("thinking", "reasoning here"),
        ("text", "answer"),
    ]


SPLIT_CASES = [
    ("empty", "", ("", "")),
    ("no tags", "plain", ("", "plain")),
    ("standard", "<think>\nwhy\n</think>\n\nbecause", ("why", "because")),
    ("orphan close tag means template opened it", "I should list\n</think>\n\nls -la", ("I should list", "ls -la")),
    ("two sections joined", "<think>a</think>x<think>b</think>y", ("a\n\nb", "xy")),
    ("partial tag stays text", "see <thin", ("", "see <thin")),
    ("unclosed", "<think>never closed", ("never closed", "")),
]


@pytest.mark.parametrize("name,text,expected", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_think_tags(name, text, expected):
    assert split_think_tags(text) == expected
