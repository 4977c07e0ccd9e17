"""Same-wire passthrough strategies: what is forwarded, hidden, counted and raised."""

from __future__ import annotations

import orjson
import pytest

from coderouterd.protocol.sse import DONE
from coderouterd.providers.errors import DISCONNECT, STREAM_ERROR, UpstreamError
from coderouterd.providers.strategies import AnthropicPassthrough, OpenAIPassthrough


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
