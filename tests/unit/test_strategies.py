"""Same-wire passthrough strategies: what is forwarded, hidden, counted and raised."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coderouterd.providers.errors import DISCONNECT, STREAM_ERROR, UpstreamError
from coderouterd.providers.strategies import AnthropicPassthrough, OpenAIPassthrough
from coderouterd.wire.sse import DONE


def chunk(delta=None, finish=None, usage=None, choices=True) -> tuple[None, str]:
    obj: dict = {"object": "chat.completion.chunk"}
    obj["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage:
        obj["usage"] = usage
    return None, orjson.dumps(obj).decode()


def oa(**body) -> OpenAIPassthrough:
    return OpenAIPassthrough(model="local", skip_prologue=False, client_body={"model": "x", **body})


def test_request_maps_model_usage_and_max_completion_tokens():
    req = orjson.loads(oa(max_completion_tokens=64).request(b"", True))
    assert req["model"] == "local" and req["max_tokens"] == 64
    assert req["stream_options"] == {"include_usage": True}
    assert "stream_options" not in orjson.loads(oa().request(b"", False))


@pytest.mark.parametrize("client_wants_usage", [False, True])
def test_injected_usage_chunk_is_hidden_unless_asked_for(client_wants_usage):
    st = oa(stream_options={"include_usage": True}) if client_wants_usage else oa()
    out = st.events([chunk({"content": "hi"}), chunk(finish="stop"),
                     chunk(usage={"prompt_tokens": 7, "completion_tokens": 2}, choices=False), (None, "[DONE]")])
    assert out.count(b"data: ") == (4 if client_wants_usage else 3)
    assert out.endswith(DONE) and st.done and st.started_content
    assert st.usage == {"input_tokens": 7, "output_tokens": 2, "cache_read_input_tokens": 0,
                        "cache_creation_input_tokens": 0}


@pytest.mark.parametrize("err", [{"message": "boom"}, "boom"])
def test_error_chunk_raises_with_its_message(err):
    st = oa()
    with pytest.raises(UpstreamError) as ei:
        st.events([(None, orjson.dumps({"error": err}).decode())])
    assert ei.value.reason == STREAM_ERROR and ei.value.message == "boom" and not ei.value.after_content


def test_end_without_done_is_clean_only_after_a_finish_reason():
    st = oa()
    st.events([chunk({"content": "hi"})])
    with pytest.raises(UpstreamError) as ei:
        st.eof()
    assert ei.value.reason == DISCONNECT and ei.value.after_content
    st.events([chunk(finish="stop")])
    assert st.eof() == DONE and st.done


def test_anthropic_passthrough_keeps_raw_body_and_drops_a_second_message_start():
    body = {"model": "claude-x", "max_tokens": 5, "messages": []}
    raw = orjson.dumps(body)
    assert AnthropicPassthrough(model="claude-x", skip_prologue=False, client_body=body).request(raw, True) is raw
    st = AnthropicPassthrough(model="claude-x", skip_prologue=True, client_body=body)
    start = orjson.dumps({"type": "message_start", "message": {"usage": {"input_tokens": 9}}}).decode()
    out = st.events([("message_start", start), ("ping", '{"type":"ping"}')])
    assert b"message_start" not in out and b"ping" in out and st.usage["input_tokens"] == 9
    with pytest.raises(UpstreamError) as ei:
        st.events([("error", '{"type":"error","error":{"type":"overloaded_error","message":"busy"}}')])
    assert ei.value.error_type == "overloaded_error" and ei.value.message == "busy"


def _anthropic_events(*, delta: bool) -> list[tuple[str, str]]:
    evs = [("message_start", '{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}'),
           ("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
           ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}')]
    if delta:
        evs += [("content_block_stop", '{"type":"content_block_stop","index":0}'),
                ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}')]
    return evs


def test_anthropic_end_inside_a_block_is_a_failure_after_content():
    """message_start's usage (output_tokens: 1) is no sign of a finished answer: an end before message_delta is a
    disconnect, and eof() never returns leaving the stream open (issue 23: that was a read loop that froze the daemon)."""
    st = AnthropicPassthrough(model="m", skip_prologue=False, client_body={"model": "m"})
    st.events(_anthropic_events(delta=False))
    with pytest.raises(UpstreamError) as ei:
        st.eof()
    assert ei.value.reason == DISCONNECT and ei.value.after_content and not st.done


def test_anthropic_end_after_message_delta_is_complete_and_closed_with_message_stop():
    st = AnthropicPassthrough(model="m", skip_prologue=False, client_body={"model": "m"})
    st.events(_anthropic_events(delta=True))
    assert st.eof() == b'event: message_stop\ndata: {"type":"message_stop"}\n\n' and st.done


# -- same-wire passthrough checks that what it relays is an answer (issue 23, item 4) ---------------------------

_not_answers = st.one_of(
    st.binary(max_size=40),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8)),
                 lambda inner: st.one_of(st.lists(inner, max_size=3),
                                         st.dictionaries(st.sampled_from(["id", "usage", "type", "content", "x"]),
                                                         inner, max_size=3)),
                 max_leaves=6).map(orjson.dumps),
)


def _an() -> AnthropicPassthrough:
    return AnthropicPassthrough(model="m", skip_prologue=False, client_body={"model": "m"})


@settings(max_examples=300, deadline=None)
@given(body=_not_answers)
def test_a_non_stream_body_that_is_not_an_answer_raises(body):
    for st_ in (oa(), _an()):
        try:
            resp = orjson.loads(body)
        except orjson.JSONDecodeError:
            resp = None
        valid = isinstance(resp, dict) and (
            isinstance(resp.get("choices"), list) if isinstance(st_, OpenAIPassthrough)
            else resp.get("type") == "message" and isinstance(resp.get("content"), list))
        if valid:
            continue
        with pytest.raises(UpstreamError) as ei:
            st_.response(body)
        assert ei.value.failover and ei.value.counts_against_provider and not ei.value.after_content


def test_a_200_with_an_error_object_is_the_upstreams_error():
    with pytest.raises(UpstreamError) as ei:
        oa().response(b'{"error": {"message": "model crashed", "type": "server_error"}}')
    assert ei.value.reason == STREAM_ERROR and ei.value.message == "model crashed"
    with pytest.raises(UpstreamError) as ei:
        _an().response(b'{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}')
    assert ei.value.error_type == "overloaded_error" and ei.value.message == "busy"


def test_real_answers_pass_through_untouched():
    body = orjson.dumps({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {
        "role": "assistant", "content": "hi"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3,
                                                                                   "completion_tokens": 1}})
    assert oa().response(body) is body
    body = orjson.dumps({"id": "m", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
                         "usage": {"input_tokens": 3, "output_tokens": 1}})
    assert _an().response(body) is body


@pytest.mark.parametrize("first", ["[DONE]", "null", "[1]", "{}", '{"object":"chat.completion.chunk"}', "hello"])
def test_a_chat_stream_must_open_with_a_chunk(first):
    with pytest.raises(UpstreamError) as ei:
        oa().events([(None, first)])
    assert ei.value.reason == "bad_response" and not ei.value.after_content


@pytest.mark.parametrize("first", [(None, "{}"), ("content_block_start", "{}"), ("message_start", "null"),
                                   ("message_start", '{"message": "x"}'), ("foo", "{}")])
def test_a_messages_stream_must_open_with_message_start(first):
    with pytest.raises(UpstreamError) as ei:
        _an().events([("ping", "{}"), first])
    assert ei.value.reason == "bad_response" and not ei.value.after_content


def test_strategies_force_a_named_tool_as_required_when_the_server_reads_only_strings():
    import orjson

    from coderouterd.providers.strategies import AnthropicToOpenAIUpstream, OpenAIPassthrough

    tools = [{"name": n, "description": n, "input_schema": {"type": "object", "properties": {}}} for n in "ab"]
    anth = {"model": "m", "max_tokens": 5, "tools": tools, "tool_choice": {"type": "tool", "name": "a"},
            "messages": [{"role": "user", "content": "x"}]}
    oa = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": {
        "type": "function", "function": {"name": "b"}}, "tools": [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "ab"]}
    for cls, body, name in ((AnthropicToOpenAIUpstream, anth, "a"), (OpenAIPassthrough, oa, "b")):
        sent = orjson.loads(cls(model="m", skip_prologue=False, client_body=body, named_tool_choice=False)
                            .request(b"", False))
        assert sent["tool_choice"] == "required" and [t["function"]["name"] for t in sent["tools"]] == [name]
        kept = orjson.loads(cls(model="m", skip_prologue=False, client_body=body).request(b"", False))
        assert isinstance(kept["tool_choice"], dict) and len(kept["tools"]) == 2
