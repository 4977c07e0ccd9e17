import importlib
import json
import random

import orjson
import pytest

from coderouterd.translate.anthropic_answer_to_openai import AnthropicStreamToOpenAI
from coderouterd.translate.openai_answer_to_anthropic import SYNTHETIC_SIGNATURE, OpenAIStreamToAnthropic
from coderouterd.wire.sse import DONE, SSEParser, encode_data, encode_event

# --- helpers ----------------------------------------------------------------------------------


def chunk(delta=None, finish=None, usage=None, **extra):
    c = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish, **extra}]}
    if usage is not None:
        c["usage"] = usage
    return c


def usage_chunk(prompt, completion, cached=None):
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}


def tc(index, args=None, id=None, name=None):
    call = {"index": index}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    function = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    call["function"] = function
    return chunk({"tool_calls": [call]})


def fragments(text, rng, lo=1, hi=3):
    out, i = [], 0
    while i < len(text):
        n = rng.randint(lo, hi)
        out.append(text[i : i + n])
        i += n
    return out


def run(chunks, **kwargs):
    conv = OpenAIStreamToAnthropic("claude-opus-4-8", message_id="msg_test", **kwargs)
    events = conv.start()
    for c in chunks:
        events += conv.feed(c)
    return conv, events + conv.finish()


def assemble(events):
    """Check the Anthropic event grammar strictly and rebuild the message.

    Tool blocks keep the raw concatenated partial_json under "raw" so byte-exactness can be asserted.
    """
    assert events[0]["type"] == "message_start"
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]["output_tokens"] == 1
    blocks, open_index, result = [], None, {"stop": None, "usage": None, "error": None}
    stopped = False
    for e in events[1:]:
        assert not stopped, f"event after message_stop: {e}"
        t = e["type"]
        if t == "ping":
            continue
        if t == "content_block_start":
            assert open_index is None, "blocks must not interleave"
            assert e["index"] == len(blocks), "indices are 0-based and strictly increasing"
            block = dict(e["content_block"])
            if block["type"] == "tool_use":
                assert block["input"] == {} and block["id"] and isinstance(block["name"], str)
                block["raw"] = ""
            blocks.append(block)
            open_index = e["index"]
        elif t == "content_block_delta":
            assert e["index"] == open_index
            block, delta = blocks[open_index], e["delta"]
            kind = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "thinking",
                    "input_json_delta": "tool_use"}[delta["type"]]
            assert block["type"] == kind
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                assert not block["signature"], "no thinking after the signature"
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                block["raw"] += delta["partial_json"]
        elif t == "content_block_stop":
            assert e["index"] == open_index
            block = blocks[open_index]
            if block["type"] == "thinking":
                assert block["signature"] == SYNTHETIC_SIGNATURE
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["raw"])
            open_index = None
        elif t == "message_delta":
            assert open_index is None
            result["stop"] = e["delta"]
            result["usage"] = e["usage"]
        elif t == "message_stop":
            assert result["stop"] is not None
            stopped = True
        elif t == "error":
            result["error"] = e["error"]
            stopped = True
        else:
            raise AssertionError(f"unexpected event {e}")
    result["content"] = blocks
    return result


def text_of(result):
    return [(b["type"], b.get("text") or b.get("thinking") or b.get("name")) for b in result["content"]]


def sdk_client(factory, base_url, body):
    """An SDK client whose HTTP layer replays ``body`` as an SSE response, with no socket at all.

    Recent SDK releases moved from ``httpx`` to ``httpx2`` and reject the other one's objects.
    """
    for name in ("httpx2", "httpx"):
        try:
            http = importlib.import_module(name)
        except ImportError:
            continue

        def handler(request, http=http):
            return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

        try:
            return factory(api_key="k", base_url=base_url, http_client=http.Client(transport=http.MockTransport(handler)))
        except TypeError:
            continue
    pytest.skip("no HTTP library usable by the SDK")


NASTY_ARGS = [
    '{"command":"echo \\"hi\\" \\\\ done\\n\\tx","path":"/tmp/é😀中文","n":[1,2.5e3,null,true,false]}',
    '{"content":"line1\\nline2 \\u00e9\\u4e2d \\ud83d\\ude00 \\/ \\b\\f\\r","empty":"","nested":{"a":{"b":[{}]}}}',
    '{ "spaced" : "x" ,\n  "k" : [ ] }',
]

# --- OpenAI stream -> Anthropic events --------------------------------------------------------


@pytest.mark.parametrize("args", NASTY_ARGS)
@pytest.mark.parametrize("seed", range(8))
def test_tool_arguments_in_tiny_fragments_reassemble_byte_exactly(args, seed):
    rng = random.Random(seed)
    chunks = [tc(0, "", id="call_a", name="Write")]
    chunks += [tc(0, piece) for piece in fragments(args, rng)]
    chunks += [chunk(finish="tool_calls"), usage_chunk(50, 20)]
    _, events = run(chunks)
    # Through the wire too: encode, split the bytes badly, parse again.
    raw = b"".join(encode_event(e) for e in events)
    parser = SSEParser()
    wire = []
    for i in range(0, len(raw), 5):
        wire += parser.feed(raw[i : i + 5])
    events_back = [orjson.loads(data) for _, data in wire + parser.flush()]
    for evs in (events, events_back):
        result = assemble(evs)
        [block] = result["content"]
        assert block["raw"] == args
        assert block["input"] == json.loads(args)
        assert (block["id"], block["name"]) == ("call_a", "Write")
        assert result["stop"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_repeated_id_and_name_do_not_reopen_block():
    chunks = [
        tc(0, '{"a"', id="call_1", name="Bash"),
        tc(0, ':1', id="call_1", name="Bash"),
        tc(0, "}", name=""),
        chunk(finish="tool_calls"),
    ]
    result = assemble(run(chunks)[1])
    assert [(b["name"], b["raw"]) for b in result["content"]] == [("Bash", '{"a":1}')]


INTERLEAVED = [
    ("two calls alternating", [(0, "c0", "Read", '{"file_path":"/a/é.py","limit":10}'),
                               (1, "c1", "Grep", '{"pattern":"x\\\\d+\\"","path":"."}')], "alternate"),
    ("three calls random order", [(0, "c0", "A", '{"x":"' + "a" * 40 + '"}'),
                                  (1, "c1", "B", '{"y":[1,2,3],"z":{"w":"}"}}'),
                                  (2, "c2", "C", '{"q":"\\u00e9\\n"}')], "random"),
    ("sequential calls", [(0, "c0", "A", '{"a":1}'), (1, "c1", "B", '{"b":2}'), (2, "c2", "C", "{}")], "sequential"),
]


def _interleaved_chunks(calls, mode, rng):
    queues = {idx: [tc(idx, "", id=cid, name=name)] + [tc(idx, p) for p in fragments(args, rng)]
              for idx, cid, name, args in calls}
    out = []
    if mode == "sequential":
        for idx, *_ in calls:
            out += queues[idx]
    else:
        while any(queues.values()):
            live = [i for i in queues if queues[i]]
            pick = live[0] if mode == "alternate" and len(live) == 1 else (
                live[len(out) % len(live)] if mode == "alternate" else rng.choice(live))
            out.append(queues[pick].pop(0))
    return out


@pytest.mark.parametrize("name,calls,mode", INTERLEAVED, ids=[c[0] for c in INTERLEAVED])
@pytest.mark.parametrize("seed", range(6))
def test_parallel_tool_calls_produce_valid_non_interleaved_blocks(name, calls, mode, seed):
    rng = random.Random(seed)
    chunks = _interleaved_chunks(calls, mode, rng) + [chunk(finish="tool_calls"), usage_chunk(10, 30)]
    result = assemble(run(chunks)[1])
    got = sorted((b["id"], b["name"], b["raw"]) for b in result["content"])
    assert got == sorted((cid, n, args) for _, cid, n, args in calls)
    assert result["stop"]["stop_reason"] == "tool_use"


def test_sequential_calls_stream_without_waiting_for_finish():
    conv = OpenAIStreamToAnthropic("m")
    conv.start()
    conv.feed(tc(0, '{"a":', id="c0", name="A"))
    conv.feed(tc(0, "1}"))
    events = conv.feed(tc(1, '{"b"', id="c1", name="B"))
    # Call 0 is complete, so it closes at once and call 1 streams live.
    assert [e["type"] for e in events] == ["content_block_stop", "content_block_start", "content_block_delta"]
    assert events[1]["content_block"]["name"] == "B"


def test_interleaved_call_is_buffered_until_current_completes():
    conv = OpenAIStreamToAnthropic("m")
    conv.start()
    conv.feed(tc(0, '{"a":', id="c0", name="A"))
    assert conv.feed(tc(1, '{"b":2}', id="c1", name="B")) == []
    events = conv.feed(tc(0, "1}"))
    assert [e["type"] for e in events] == [
        "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
    ]
    assert events[3]["delta"]["partial_json"] == '{"b":2}'


def test_reused_index_with_new_id_is_a_new_call():
    # Some servers number every whole tool call as index 0.
    chunks = [tc(0, '{"a":1}', id="x1", name="A"), tc(0, '{"b":2}', id="x2", name="B"), chunk(finish="tool_calls")]
    result = assemble(run(chunks)[1])
    assert [(b["id"], b["raw"]) for b in result["content"]] == [("x1", '{"a":1}'), ("x2", '{"b":2}')]


def test_missing_index_and_id():
    call = {"function": {"name": "A", "arguments": '{"k":"v"}'}}
    result = assemble(run([chunk({"tool_calls": [call]}), chunk(finish="stop")])[1])
    [block] = result["content"]
    assert block["id"].startswith("toolu_") and block["input"] == {"k": "v"}
    assert result["stop"]["stop_reason"] == "tool_use"


def test_tool_call_without_arguments_gets_empty_object():
    result = assemble(run([tc(0, None, id="c", name="Now"), chunk(finish="tool_calls")])[1])
    assert result["content"][0]["raw"] == "{}"


def test_text_then_tool_call_then_trailing_whitespace():
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me look."}),
              tc(0, '{"p":1}', id="c", name="Read"), chunk({"content": "\n\n"}), chunk(finish="tool_calls")]
    result = assemble(run(chunks)[1])
    assert text_of(result) == [("text", "Let me look."), ("tool_use", "Read")]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_fields_become_thinking_block(field):
    chunks = [chunk({"role": "assistant"}), chunk({field: "Let me "}), chunk({field: "think."}),
              chunk({"content": "Answer"}), chunk(finish="stop"), usage_chunk(12, 9)]
    result = assemble(run(chunks)[1])
    assert text_of(result) == [("thinking", "Let me think."), ("text", "Answer")]
    assert result["content"][0]["signature"] == SYNTHETIC_SIGNATURE


def test_both_reasoning_fields_in_one_delta_are_not_doubled():
    result = assemble(run([chunk({"reasoning_content": "x", "reasoning": "x"}), chunk(finish="stop")])[1])
    assert text_of(result) == [("thinking", "x")]


THINK_CONTENT = "<think>\nI need ls.\n</think>\n\nRunning ls now."


@pytest.mark.parametrize("i", range(len(THINK_CONTENT) + 1))
def test_think_tags_split_at_every_position(i):
    pieces = [p for p in (THINK_CONTENT[:i], THINK_CONTENT[i:]) if p]
    result = assemble(run([chunk({"content": p}) for p in pieces] + [chunk(finish="stop")])[1])
    assert text_of(result) == [("thinking", "I need ls."), ("text", "Running ls now.")]


def test_think_tags_one_char_per_chunk_then_tool():
    chunks = [chunk({"content": ch}) for ch in THINK_CONTENT] + [tc(0, "{}", id="c", name="Bash"), chunk(finish="tool_calls")]
    result = assemble(run(chunks)[1])
    assert text_of(result) == [("thinking", "I need ls."), ("text", "Running ls now."), ("tool_use", "Bash")]


def test_usage_chunk_after_finish_and_cached_tokens():
    conv, events = run([chunk({"content": "hi"}), chunk(finish="stop"), usage_chunk(1000, 25, cached=900)], input_tokens=7)
    result = assemble(events)
    expected = {"input_tokens": 100, "output_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 900}
    assert result["usage"] == expected and conv.usage == expected
    assert events[0]["message"]["usage"]["input_tokens"] == 7
    assert result["stop"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_usage_without_upstream_usage_is_estimated():
    conv, events = run([chunk({"content": "x" * 400}), chunk(finish="length")], input_tokens=33)
    result = assemble(events)
    assert result["usage"]["input_tokens"] == 33 and result["usage"]["output_tokens"] == 100
    assert result["stop"]["stop_reason"] == "max_tokens"


def test_finish_is_idempotent_and_feed_after_finish_ignored():
    conv, _ = run([chunk({"content": "a"})])
    assert conv.finish() == []
    assert conv.feed(chunk({"content": "b"})) == []


def test_empty_stream_still_valid():
    conv, events = run([])
    result = assemble(events)
    assert result["content"] == [] and result["stop"]["stop_reason"] == "end_turn"
    assert not conv.started_content


def test_started_content_flag():
    conv = OpenAIStreamToAnthropic("m")
    conv.start()
    conv.feed(chunk({"role": "assistant", "content": ""}))
    assert not conv.started_content
    conv.feed(chunk({"content": "x"}))
    assert conv.started_content


def test_feed_without_start_emits_message_start_first():
    conv = OpenAIStreamToAnthropic("m")
    events = conv.feed(chunk({"content": "x"}))
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert conv.start() == []


ERROR_CASES = [
    ("loading", {"code": 503, "message": "Loading model", "type": "unavailable_error"}, "overloaded_error", "Loading model"),
    ("generic", {"message": "boom", "type": "server_error"}, "api_error", "boom"),
    ("overflow", {"type": "exceed_context_size_error", "message": "too big", "n_prompt_tokens": 9000, "n_ctx": 8192},
     "invalid_request_error", "prompt is too long: 9000 tokens > 8192 maximum"),
    ("string", "bad things", "api_error", "bad things"),
]


@pytest.mark.parametrize("name,err,etype,message", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_chunk_mid_stream(name, err, etype, message):
    conv = OpenAIStreamToAnthropic("m")
    events = conv.start() + conv.feed(chunk({"content": "partial"}))
    events += conv.feed({"error": err})
    assert events[-1] == {"type": "error", "error": {"type": etype, "message": message}}
    assert conv.finish() == []
    assert assemble(events)["error"]["type"] == etype


def test_error_method_closes_nothing():
    conv = OpenAIStreamToAnthropic("m")
    conv.start()
    conv.feed(chunk({"content": "x"}))
    assert conv.error("overloaded_error", "Overloaded") == [
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    ]
    assert conv.finish() == []


@pytest.mark.parametrize("chunks,expected", [
    ([chunk({"content": "abc"}), chunk(finish="stop", stop_reason="END")], ("stop_sequence", "END")),
    ([chunk({"content": "abcEN"}), chunk({"content": "D"}), chunk(finish="stop")], ("stop_sequence", "END")),
    ([chunk({"content": "abc"}), chunk(finish="stop")], ("end_turn", None)),
])
def test_stop_sequence_in_stream(chunks, expected):
    result = assemble(run(chunks, stop_sequences=["END"])[1])
    assert (result["stop"]["stop_reason"], result["stop"]["stop_sequence"]) == expected


def test_anthropic_sdk_accepts_translated_stream():
    anthropic = pytest.importorskip("anthropic")
    args = NASTY_ARGS[0]
    rng = random.Random(1)
    chunks = [chunk({"reasoning_content": "plan"}), chunk({"content": "Doing it."}), tc(0, "", id="call_z", name="Bash")]
    chunks += [tc(0, p) for p in fragments(args, rng)] + [chunk(finish="tool_calls"), usage_chunk(40, 12, cached=30)]
    _, events = run(chunks)
    body = b"".join(encode_event(e) for e in events)
    client = sdk_client(anthropic.Anthropic, "http://127.0.0.1:9", body)
    with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].input == json.loads(args)
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens) == (10, 12, 30)


# --- Anthropic stream -> OpenAI chunks --------------------------------------------------------


def anthropic_events(tool_args, rng):
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                              "content": [], "stop_reason": None, "stop_sequence": None,
                                              "usage": {"input_tokens": 20, "output_tokens": 1,
                                                        "cache_creation_input_tokens": 5, "cache_read_input_tokens": 70}}},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 1},
    ]
    for n, args in enumerate(tool_args):
        index = 2 + n
        events.append({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": f"toolu_{n}", "name": f"T{n}", "input": {}}})
        events += [{"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}}
                   for p in [""] + fragments(args, rng)]
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "delta": {"stop_reason": "tool_use" if tool_args else "end_turn",
                                                      "stop_sequence": None}, "usage": {"output_tokens": 42}})
    events.append({"type": "message_stop"})
    return events


def accumulate_openai(chunks):
    """Rebuild an assistant message from chat.completion.chunk dicts, as OpenAI clients do."""
    msg = {"role": None, "content": "", "reasoning": "", "tool_calls": {}, "finish": None, "usage": None}
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        if c.get("usage"):
            assert c["choices"] == []
            msg["usage"] = c["usage"]
        for choice in c["choices"]:
            delta = choice["delta"]
            msg["role"] = msg["role"] or delta.get("role")
            msg["content"] += delta.get("content") or ""
            msg["reasoning"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or ():
                slot = msg["tool_calls"].setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
                if call.get("id"):
                    assert slot["id"] is None, "id sent twice"
                    slot["id"], slot["name"] = call["id"], call["function"]["name"]
                slot["arguments"] += call["function"].get("arguments", "")
            if choice["finish_reason"]:
                assert msg["finish"] is None
                msg["finish"] = choice["finish_reason"]
    return msg


@pytest.mark.parametrize("seed", range(5))
def test_anthropic_stream_to_openai_chunks(seed):
    rng = random.Random(seed)
    conv = AnthropicStreamToOpenAI("gpt-x", include_usage=True, completion_id="chatcmpl-1", created=5)
    out = []
    for e in anthropic_events(NASTY_ARGS[:2], rng):
        out += conv.feed(e)
    out += conv.finish()
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["id"] == "chatcmpl-1" and c["model"] == "gpt-x" and c["created"] == 5 for c in out)
    msg = accumulate_openai(out)
    assert msg["role"] == "assistant" and msg["content"] == "Hello" and msg["reasoning"] == "hmm"
    assert msg["tool_calls"] == {
        0: {"id": "toolu_0", "name": "T0", "arguments": NASTY_ARGS[0]},
        1: {"id": "toolu_1", "name": "T1", "arguments": NASTY_ARGS[1]},
    }
    assert msg["finish"] == "tool_calls"
    assert msg["usage"] == {"prompt_tokens": 95, "completion_tokens": 42, "total_tokens": 137,
                            "prompt_tokens_details": {"cached_tokens": 70}}
    assert conv.usage == {"input_tokens": 20, "output_tokens": 42, "cache_creation_input_tokens": 5,
                          "cache_read_input_tokens": 70}
    assert conv.started_content
    assert conv.finish() == []


def test_anthropic_stream_without_usage_chunk():
    conv = AnthropicStreamToOpenAI("g", include_usage=False)
    out = []
    for e in anthropic_events([], random.Random(0)):
        out += conv.feed(e)
    out += conv.finish()
    assert all(c["choices"] for c in out)
    assert accumulate_openai(out)["finish"] == "stop"


def test_anthropic_stream_truncated_still_gets_finish_reason():
    conv = AnthropicStreamToOpenAI("g", include_usage=True)
    out = conv.feed({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}})
    assert not conv.started_content or out[0]["choices"][0]["delta"]["role"] == "assistant"
    out += conv.finish()
    msg = accumulate_openai(out)
    assert (msg["content"], msg["finish"]) == ("x", "stop")


def test_anthropic_error_event_becomes_error_chunk():
    conv = AnthropicStreamToOpenAI("g", include_usage=True)
    conv.feed({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})
    out = conv.feed({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert out == [{"error": {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": None}}]
    assert conv.finish() == []
    assert not conv.started_content


def test_round_trip_openai_to_anthropic_to_openai():
    rng = random.Random(3)
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning": "why"}), chunk({"content": "Sure"})]
    chunks += [tc(0, "", id="call_0", name="A")] + [tc(0, p) for p in fragments(NASTY_ARGS[1], rng)]
    chunks += [tc(1, "", id="call_1", name="B")] + [tc(1, p) for p in fragments(NASTY_ARGS[2], rng)]
    chunks += [chunk(finish="tool_calls"), usage_chunk(100, 50, cached=60)]
    _, events = run(chunks)
    back = AnthropicStreamToOpenAI("g", include_usage=True)
    out = []
    for e in events:
        out += back.feed(e)
    out += back.finish()
    msg = accumulate_openai(out)
    assert (msg["reasoning"], msg["content"], msg["finish"]) == ("why", "Sure", "tool_calls")
    assert msg["tool_calls"] == {0: {"id": "call_0", "name": "A", "arguments": NASTY_ARGS[1]},
                                 1: {"id": "call_1", "name": "B", "arguments": NASTY_ARGS[2]}}
    assert msg["usage"]["prompt_tokens"] == 100 and msg["usage"]["prompt_tokens_details"]["cached_tokens"] == 60


def test_openai_sdk_accepts_translated_stream():
    openai = pytest.importorskip("openai")
    conv = AnthropicStreamToOpenAI("g", include_usage=True)
    chunks = []
    for e in anthropic_events([NASTY_ARGS[0]], random.Random(2)):
        chunks += conv.feed(e)
    chunks += conv.finish()
    body = b"".join(encode_data(c) for c in chunks) + DONE
    client = sdk_client(openai.OpenAI, "http://127.0.0.1:9/v1", body)
    got = list(client.chat.completions.create(model="g", messages=[{"role": "user", "content": "x"}], stream=True))
    args = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                   for c in got if c.choices and c.choices[0].delta.tool_calls)
    assert json.loads(args) == json.loads(NASTY_ARGS[0]) and args == NASTY_ARGS[0]
    assert got[-1].usage.prompt_tokens == 95


def test_openai_sdk_raises_on_error_chunk():
    openai = pytest.importorskip("openai")
    conv = AnthropicStreamToOpenAI("g", include_usage=True)
    chunks = conv.feed({"type": "message_start", "message": {"usage": {}}})
    chunks += conv.feed({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    body = b"".join(encode_data(c) for c in chunks)
    client = sdk_client(openai.OpenAI, "http://127.0.0.1:9/v1", body)
    with pytest.raises(openai.APIError, match="Overloaded"):
        list(client.chat.completions.create(model="g", messages=[{"role": "user", "content": "x"}], stream=True))


def test_cached_tokens_reported_only_in_llama_cpp_timings_are_counted():
    # Some llama-server builds and forks say what they took from cache only in `timings` (cache_n, prompt_n).
    final = {"choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 5},
             "timings": {"cache_n": 850, "prompt_n": 50}}
    result = assemble(run([chunk({"content": "hi"}), chunk(finish="stop"), final])[1])
    assert result["usage"]["cache_read_input_tokens"] == 850 and result["usage"]["input_tokens"] == 50
    from coderouterd.translate.openai_answer_to_anthropic import anthropic_usage

    both = {"prompt_tokens": 900, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 800}}
    assert anthropic_usage(both, timings={"cache_n": 850})["cache_read_input_tokens"] == 800  # usage wins
    assert anthropic_usage({"prompt_tokens": 9}, timings={"cache_n": "x"})["cache_read_input_tokens"] == 0
