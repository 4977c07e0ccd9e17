"""Same-wire answers that are not the protocol fail over (issue 34, item 4).

Wrong shapes are generated from the very descriptions the daemon checks against (wire/answer_shapes.py): each
generated value has exactly one defect somewhere (a required field missing or null, a value of another type, an
empty array where one item is needed, an unknown constant), and none may pass a passthrough strategy as
success. Valid values generated from the same descriptions must pass the checks, so a description cannot drift
into refusing what it describes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coderouterd.providers.errors import BAD_RESPONSE, UpstreamError
from coderouterd.providers.responses_strategies import ResponsesPassthrough
from coderouterd.providers.strategies import AnthropicPassthrough, OpenAIPassthrough
from coderouterd.translate.responses_request import translate_request
from coderouterd.wire import answer_shapes as shapes
from coderouterd.wire.shapes import Const, Many, Tagged, fields

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- values generated from a description ----------------------------------------------------------------------

_SCALARS = {str: st.text(max_size=4), int: st.integers(0, 10**6), bool: st.booleans(),
            float: st.floats(allow_nan=False, allow_infinity=False, width=32)}
_ANY = st.one_of(st.text(max_size=3), st.integers(-5, 5), st.booleans(), st.floats(allow_nan=False, allow_infinity=False, width=32),
                 st.just({}), st.just([]), st.just({"x": 1}), st.just([1]))


def valid(spec: Any) -> st.SearchStrategy:
    if isinstance(spec, type) and spec in _SCALARS:
        return _SCALARS[spec]
    if spec is dict:
        return st.sampled_from([{}, {"extra": 1}])
    if spec is list:
        return st.sampled_from([[], [1]])
    if isinstance(spec, Const):
        return st.just(spec.value)
    if isinstance(spec, Many):
        return st.lists(valid(spec.item), min_size=spec.min, max_size=spec.min + 2)
    if isinstance(spec, Tagged):
        return st.sampled_from(sorted(spec.cases)).flatmap(
            lambda k: valid(spec.cases[k]).map(lambda d: {**d, spec.tag: k}))
    assert isinstance(spec, dict), spec
    required = {name: valid(s) for name, req, s in fields(spec) if req}
    optional = {name: st.one_of(st.none(), valid(s)) for name, req, s in fields(spec) if not req}
    return st.fixed_dictionaries(required, optional=optional)


def _other_type(spec: Any) -> st.SearchStrategy:
    """A JSON value (never null) that a type description refuses."""
    if spec is float:
        return _ANY.filter(lambda v: type(v) not in (int, float))
    return _ANY.filter(lambda v: type(v) is not spec)


def wrong(spec: Any, *, null_ok: bool = False) -> st.SearchStrategy:
    """A value with one defect. `null_ok`: null may be that defect (an array item, not an optional field)."""
    nulls = [st.none()] if null_ok else []
    if isinstance(spec, type):
        return st.one_of(*nulls, _other_type(spec))
    if isinstance(spec, Const):
        return st.one_of(*nulls, st.text(max_size=8).filter(lambda v: v != spec.value), st.integers(-5, 5))
    if isinstance(spec, Many):
        options = [*nulls, _other_type(list),
                   st.tuples(st.lists(valid(spec.item), min_size=spec.min, max_size=spec.min + 1),
                             wrong(spec.item, null_ok=True), st.integers(0, 3)).map(
                       lambda t: t[0][:t[2]] + [t[1]] + t[0][t[2]:])]
        if spec.min:
            options.append(st.lists(valid(spec.item), max_size=spec.min - 1))
        return st.one_of(*options)
    if isinstance(spec, Tagged):
        return st.one_of(*nulls, _other_type(dict),
                         valid(spec).map(lambda d: {k: v for k, v in d.items() if k != spec.tag}),
                         st.sampled_from(sorted(spec.cases)).flatmap(
                             lambda k: _wrong_object(spec.cases[k]).map(lambda d: {**d, spec.tag: k})))
    return st.one_of(*nulls, _other_type(dict), _wrong_object(spec))


def _wrong_object(spec: dict) -> st.SearchStrategy:
    """The object with one of its fields made wrong (a required one missing or null, or another shape)."""
    def spoil(base: dict, name: str, required: bool, s: Any) -> st.SearchStrategy:
        defects = [wrong(s)]
        if required:
            defects += [st.just(None), st.just(_MISSING)]
        return st.one_of(*defects).map(lambda v: {k: x for k, x in {**base, name: v}.items() if x is not _MISSING})

    return valid(spec).flatmap(lambda base: st.sampled_from(fields(spec)).flatmap(
        lambda f: spoil(base, *f)))


_MISSING = object()

# -- the descriptions, and a check of each against its own generator ----------------------------------------

WHOLE = [(shapes.CHAT_COMPLETION, shapes.check_chat_completion), (shapes.CHAT_CHUNK, shapes.check_chat_chunk),
         (shapes.MESSAGE, shapes.check_message), (shapes.RESPONSE, shapes.check_response)]


@pytest.mark.parametrize("spec,check", WHOLE, ids=["chat completion", "chat chunk", "message", "response"])
@SETTINGS
@given(data=st.data())
def test_descriptions_accept_what_they_describe_and_refuse_one_defect(spec, check, data):
    assert check(data.draw(valid(spec))) is None
    bad = data.draw(wrong(spec))
    assert check(bad) is not None, bad


# -- no wrong shape passes a passthrough as success ---------------------------------------------------------

def _refused(call) -> UpstreamError:
    with pytest.raises(UpstreamError) as e:
        call()
    assert e.value.failover, e.value  # the upstream's failure: the next provider is tried
    return e.value


def _oa() -> OpenAIPassthrough:
    return OpenAIPassthrough(model="local", skip_prologue=False, client_body={"model": "x"})


def _an() -> AnthropicPassthrough:
    return AnthropicPassthrough(model="up", skip_prologue=False, client_body={"model": "up", "max_tokens": 5})


def _rp() -> ResponsesPassthrough:
    rq = translate_request({"model": "m", "input": "x"})
    return ResponsesPassthrough(model="m", skip_prologue=False, client_body=rq.chat, native=rq)


@SETTINGS
@given(bad=wrong(shapes.CHAT_COMPLETION))
def test_openai_answers_of_the_wrong_shape_fail_over(bad):
    _refused(lambda: _oa().response(orjson.dumps(bad)))


@SETTINGS
@given(bad=wrong(shapes.CHAT_CHUNK), first=st.booleans())
def test_openai_chunks_of_the_wrong_shape_fail_over(bad, first):
    st_ = _oa()
    opening = [] if first else [(None, '{"choices":[{"index":0,"delta":{"role":"assistant"}}]}')]
    _refused(lambda: st_.events(opening + [(None, orjson.dumps(bad).decode())]))


@SETTINGS
@given(bad=wrong(shapes.MESSAGE))
def test_anthropic_answers_of_the_wrong_shape_fail_over(bad):
    _refused(lambda: _an().response(orjson.dumps(bad)))


_MESSAGE_START = ("message_start", '{"type":"message_start","message":{"id":"m","type":"message","role":"assistant",'
                                   '"content":[],"usage":{"input_tokens":1,"output_tokens":1}}}')


@SETTINGS
@given(data=st.data())
def test_anthropic_events_of_the_wrong_shape_fail_over(data):
    name = data.draw(st.sampled_from(sorted(shapes.MESSAGES_EVENTS)))
    bad = data.draw(wrong(shapes.MESSAGES_EVENTS[name]))
    if isinstance(bad, dict):
        bad = {**bad, "type": name}
    opening = [] if name == "message_start" else [_MESSAGE_START]
    _refused(lambda: _an().events(opening + [(name, orjson.dumps(bad).decode())]))


@SETTINGS
@given(bad=wrong(shapes.RESPONSE))
def test_responses_answers_of_the_wrong_shape_fail_over(bad):
    _refused(lambda: _rp().response(orjson.dumps(bad)))


@SETTINGS
@given(data=st.data())
def test_responses_events_of_the_wrong_shape_fail_over(data):
    name = data.draw(st.sampled_from(sorted(shapes.RESPONSES_EVENTS)))
    bad = data.draw(wrong(shapes.RESPONSES_EVENTS[name]))
    if isinstance(bad, dict):
        bad = {**bad, "type": name}
    _refused(lambda: _rp().events([(name, orjson.dumps(bad).decode())]))


# The wrong 200s that passed as success before (issue 34), as the clients would have received them.
ISSUE_EXAMPLES = [
    ("openai", {"choices": []}),
    ("openai", {"choices": [{"message": None}]}),
    ("openai", {"choices": [{"message": {"role": "assistant", "content": 5}}]}),
    ("openai", {"choices": [{"message": {"tool_calls": [{"id": 5, "type": "function",
                                                         "function": {"name": "f", "arguments": "{}"}}]}}]}),
    ("openai", {"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": None,
                                                                               "arguments": "{}"}}]}}]}),
    ("openai", {"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "f",
                                                                               "arguments": {"a": 1}}}]}}]}),
    ("openai", {"choices": [{"message": {"content": "hi"}}], "usage": "lots"}),
    ("anthropic", {"type": "message", "role": "assistant", "content": [5, {"type": "tool_use", "input": "x"}]}),
    ("anthropic", {"type": "message", "role": "assistant",
                   "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}),
]


@pytest.mark.parametrize("wire,body", ISSUE_EXAMPLES)
def test_the_wrong_200s_of_the_issue_fail_over(wire, body):
    e = _refused(lambda: (_oa() if wire == "openai" else _an()).response(orjson.dumps(body)))
    assert e.reason == BAD_RESPONSE and "upstream answered 200 with a" in e.message
