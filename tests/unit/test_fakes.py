"""The fake upstreams speak the real wire formats (checked with the official SDKs) and misbehave on demand."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fakes import (
    REASONING_TEXT,
    TOOL_ARGUMENTS,
    TOOL_ARGUMENTS_2,
    FakeServer,
    free_port,
    parse_behaviour,
)

ROOT = Path(__file__).resolve().parents[2]
# One pooled client for the whole module: building an httpx client (SSL context) costs tens of ms here.
HTTP = httpx.Client(timeout=5)
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
ANTHROPIC_TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}},
                   {"name": "Read", "input_schema": {"type": "object"}}]


def sse_data(text: str) -> list:
    out = []
    for frame in text.split("\n\n"):
        for line in frame.splitlines():
            if line.startswith("data: "):
                payload = line[6:]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        out.append((lines["event"], data))
    return out


def wait_for(predicate, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def oai(srv: FakeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0, http_client=HTTP)


def test_parse_behaviour_params_and_unknown_names():
    b = parse_behaviour("tools;split=5;parallel=2")
    assert (b.name, b.integer("split", 3), b.integer("parallel", 1), b.number("delay", 0.5)) == ("tools", 5, 2, 0.5)
    with pytest.raises(ValueError):
        parse_behaviour("no_such_behaviour")
    with pytest.raises(ValueError):
        parse_behaviour("tools;split")
    with pytest.raises(ValueError):
        parse_behaviour("slow_stream;dealy=1")
    with pytest.raises(ValueError):
        parse_behaviour("slow_stream;delay=soon")
    assert parse_behaviour("reasoning;field=reasoning;think_tags=1").flag("think_tags")


def test_openai_sdk_plain_answer_stream_usage_and_models():
    with FakeServer("openai", name="alpha", models=["m1", "m2"]) as srv:
        client = oai(srv)
        done = client.chat.completions.create(**CHAT)
        assert done.choices[0].message.content == "Hello from alpha"
        assert done.choices[0].finish_reason == "stop"
        chunks = list(client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello from alpha"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
        raw_body = json.dumps(CHAT).encode()
        usage = HTTP.post(srv.url + "/v1/chat/completions", content=raw_body).json()["usage"]
        assert usage["prompt_tokens"] == len(raw_body) // 4 and usage["total_tokens"] == usage["prompt_tokens"] + 3
        no_usage = list(client.chat.completions.create(**CHAT, stream=True))
        assert all(c.choices for c in no_usage)
        assert [m.id for m in client.models.list()] == ["m1", "m2"]
        raw = HTTP.get(srv.url + "/v1/models").json()
        assert raw["object"] == "list" and raw["data"][0]["owned_by"] == "fake"
        assert srv.count("/v1/chat/completions") == 4 and srv.requests[0]["json"]["model"] == "m1"
        assert srv.requests[0]["headers"]["authorization"] == "Bearer sk-test"


@pytest.mark.parametrize(("spec", "split"), [("tools", 3), ("tools;split=1", 1), ("tools;split=7", 7)])
def test_openai_sdk_stream_reassembles_exact_tool_arguments(spec, split):
    with FakeServer("openai", behaviour=spec) as srv:
        stream = oai(srv).chat.completions.create(**CHAT, tools=OPENAI_TOOLS, stream=True)
        args, fragments, finish = "", [], None
        for chunk in stream:
            delta = chunk.choices[0].delta
            for tc in delta.tool_calls or ():
                assert tc.index == 0
                fragments.append(tc.function.arguments or "")
            finish = chunk.choices[0].finish_reason or finish
        args = "".join(fragments)
        assert args == TOOL_ARGUMENTS and json.loads(args)["description"] == "List ✓"
        assert max(len(f) for f in fragments) == split and finish == "tool_calls"


def test_openai_parallel_tool_calls_interleave_and_reassemble():
    with FakeServer("openai", behaviour="tools;parallel=2") as srv:
        stream = oai(srv).chat.completions.create(**CHAT, tools=OPENAI_TOOLS, stream=True)
        by_index: dict[int, str] = {0: "", 1: ""}
        names, order = {}, []
        for chunk in stream:
            for tc in chunk.choices[0].delta.tool_calls or ():
                by_index[tc.index] += tc.function.arguments or ""
                order.append(tc.index)
                if tc.id:
                    names[tc.index] = tc.function.name
        assert by_index == {0: TOOL_ARGUMENTS, 1: TOOL_ARGUMENTS_2} and names == {0: "Bash", 1: "Read"}
        assert order[:4] == [0, 1, 0, 1]
        whole = oai(srv).chat.completions.create(**CHAT, tools=OPENAI_TOOLS)
        calls = whole.choices[0].message.tool_calls
        assert [c.function.arguments for c in calls] == [TOOL_ARGUMENTS, TOOL_ARGUMENTS_2]


def test_openai_reasoning_variants_on_the_wire():
    def stream(srv, spec):
        r = HTTP.post(srv.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                       headers={"x-fake-behaviour": spec})
        chunks = [c for c in sse_data(r.text) if c != "[DONE]"]
        assert sse_data(r.text)[-1] == "[DONE]"
        return chunks

    def joined(chunks, key):
        return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks)

    with FakeServer("openai", name="alpha") as srv:
        chunks = stream(srv, "reasoning")
        assert joined(chunks, "reasoning_content") == REASONING_TEXT and joined(chunks, "content") == "Hello from alpha"
        assert joined(stream(srv, "reasoning;field=reasoning"), "reasoning") == REASONING_TEXT
        tagged = stream(srv, "reasoning;think_tags=1")
        assert joined(tagged, "content") == f"<think>{REASONING_TEXT}</think>\n\nHello from alpha"
        everything = stream(srv, "all_reasoning")
        assert joined(everything, "content") == "" and everything[-1]["choices"][0]["finish_reason"] == "length"
        assert len(stream(srv, "chunks;n=7")) == 1 + 7 + 1
        text = joined(stream(srv, "text_only_for_tools"), "content")
        assert text.startswith("Hello from alpha")


def test_openai_error_shapes():
    with FakeServer("openai", n_ctx=4096) as srv:
        def post(spec):
            return HTTP.post(srv.url + "/v1/chat/completions", json=CHAT, headers={"x-fake-behaviour": spec})

        r = post("overflow;n_prompt=5000")
        assert r.status_code == 400 and r.json() == {"error": {
            "code": 400, "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}
        r = post("503_loading")
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        r = post("429;retry_after=7")
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        for spec, status in [("500", 500), ("401", 401), ("404_model", 404), ("400", 400), ("529", 529)]:
            r = post(spec)
            assert r.status_code == status and "message" in r.json()["error"]
        assert post("no_such_thing").status_code == 400
        with pytest.raises(openai.NotFoundError):
            oai(srv).chat.completions.create(**CHAT, extra_headers={"x-fake-behaviour": "404_model"})


def test_openai_error_mid_stream_raises_in_sdk_and_disconnect_cuts_body():
    with FakeServer("openai") as srv:
        stream = oai(srv).chat.completions.create(**CHAT, stream=True,
                                                  extra_headers={"x-fake-behaviour": "error_mid_stream"})
        with pytest.raises(openai.APIError):
            list(stream)
        with HTTP.stream(
                "POST", srv.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                headers={"x-fake-behaviour": "disconnect_mid_stream;after=1"}) as r:
            with pytest.raises(httpx.RemoteProtocolError):
                r.read()
        # The fake dropped the connection itself: that is not a client disconnect.
        assert srv.disconnects == 0


def test_script_applies_in_order_and_only_to_generation_requests():
    with FakeServer("openai", behaviour="ok") as srv:
        srv.script(["500", "429"])
        r = HTTP.post(srv.url + "/_fake/script", json={"behaviours": ["503_loading"]})
        assert r.json() == {"queued": 3}

        def chat(headers=None):
            return HTTP.post(srv.url + "/v1/chat/completions", json=CHAT, headers=headers).status_code

        assert HTTP.get(srv.url + "/v1/models").status_code == 200
        assert chat({"x-fake-behaviour": "ok"}) == 200  # header wins and does not consume the script
        assert [chat(), chat(), chat(), chat()] == [500, 429, 503, 200]
        srv.set_behaviour("401")
        assert chat() == 401 and HTTP.get(srv.url + "/v1/models").status_code == 401
        srv.set_behaviour("500")
        assert HTTP.get(srv.url + "/v1/models").status_code == 200
        assert HTTP.post(srv.url + "/_fake/script", json={"behaviours": ["bogus"]}).status_code == 400
        srv.reset()
        assert chat() == 200 and srv.count("/v1/chat/completions") == 1


def test_disconnects_and_active_are_counted():
    with FakeServer("openai", behaviour="hang") as srv:
        with pytest.raises(httpx.ReadTimeout):
            HTTP.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=0.1)
        wait_for(lambda: srv.disconnects == 1 and srv.active == 0)
        with HTTP.stream("POST", srv.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                         headers={"x-fake-behaviour": "slow_stream;delay=0.1"}) as r:
            chunks = r.iter_raw()  # keep a reference: a dropped iterator closes the response early
            assert next(chunks).startswith(b"data: ") and srv.active == 1
        wait_for(lambda: srv.disconnects == 2 and srv.active == 0)
        t0 = time.monotonic()
        r = HTTP.post(srv.url + "/v1/chat/completions", json=CHAT,
                       headers={"x-fake-behaviour": "slow_first_byte;delay=0.1"})
        assert r.status_code == 200 and time.monotonic() - t0 >= 0.1
        assert HTTP.post(srv.url + "/_fake/hang").status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            HTTP.get(srv.url + "/v1/models", timeout=0.1)
        assert HTTP.get(srv.url + "/_fake/stats").json()["hung"] is True


def test_every_kind_cuts_streams_and_reports_mid_stream_errors():
    chat = {**CHAT, "max_tokens": 10, "stream": True}
    for kind, path in [("anthropic", "/v1/messages"), ("ollama", "/api/chat"), ("lmstudio", "/v1/chat/completions")]:
        with FakeServer(kind, behaviour="disconnect_mid_stream;after=1") as srv:
            with HTTP.stream("POST", srv.url + path, json=chat) as r:
                assert r.status_code == 200
                with pytest.raises(httpx.RemoteProtocolError):
                    r.read()
            r = HTTP.post(srv.url + path, json=chat, headers={"x-fake-behaviour": "error_mid_stream"})
            assert r.status_code == 200 and "error" in r.text.splitlines()[-1 if kind == "ollama" else -2]
            assert srv.disconnects == 0 and srv.count(path) == 2


def test_server_restarts_on_the_same_port_and_rejects_crash_options():
    srv = FakeServer("openai").start()
    port = srv.port
    srv.stop()
    with pytest.raises(httpx.ConnectError):
        HTTP.get(f"http://127.0.0.1:{port}/v1/models")
    srv.start()
    try:
        assert srv.port == port and HTTP.get(srv.url + "/v1/models").status_code == 200
    finally:
        srv.stop()
    with pytest.raises(ValueError):
        FakeServer("openai", crash_after=1)
    with pytest.raises(ValueError):
        FakeServer("nope")


def test_tokenize_health_and_props():
    with FakeServer("openai", tokenize=True, n_ctx=2048) as srv:
        tokens = HTTP.post(srv.url + "/tokenize", json={"content": "hello world!"}).json()["tokens"]
        assert len(tokens) == 3 and all(isinstance(t, int) for t in tokens)
        assert HTTP.get(srv.url + "/health").json() == {"status": "ok"}
        assert HTTP.get(srv.url + "/health", headers={"x-fake-behaviour": "503_loading"}).status_code == 503
        assert HTTP.get(srv.url + "/props").json()["default_generation_settings"]["n_ctx"] == 2048
    with FakeServer("openai") as srv:
        assert HTTP.post(srv.url + "/tokenize", json={"content": "x"}).status_code == 404


def test_anthropic_stream_event_order_thinking_and_tools():
    with FakeServer("anthropic", name="claude-fake") as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="key-1", max_retries=0)
        body = {"model": "m1", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
                "tools": ANTHROPIC_TOOLS}
        r = HTTP.post(srv.url + "/v1/messages?beta=true", json={**body, "stream": True},
                       headers={"x-fake-behaviour": "reasoning"})
        events = sse_events(r.text)
        names = [e for e, _ in events]
        assert names[:3] == ["message_start", "ping", "content_block_start"]
        assert names[-2:] == ["message_delta", "message_stop"]
        deltas = [d["delta"]["type"] for e, d in events if e == "content_block_delta"]
        assert deltas.index("signature_delta") == deltas.count("thinking_delta")
        assert events[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}

        raw = list(client.messages.create(**body, stream=True, extra_headers={"x-fake-behaviour": "tools;parallel=2"}))
        partial = {0: "", 1: ""}
        for ev in raw:
            if ev.type == "content_block_delta":
                partial[ev.index] += ev.delta.partial_json
        assert partial == {0: TOOL_ARGUMENTS, 1: TOOL_ARGUMENTS_2}
        assert raw[-2].delta.stop_reason == "tool_use"

        with client.messages.stream(**body, extra_headers={"x-fake-behaviour": "tools;split=2"}) as stream:
            final = stream.get_final_message()
        assert final.content[0].input == json.loads(TOOL_ARGUMENTS) and final.content[0].name == "Bash"
        assert final.stop_reason == "tool_use"
        assert srv.count("/v1/messages") == 3 and srv.requests[0]["query"] == "beta=true"
        assert srv.requests[-1]["headers"]["anthropic-version"] and not srv.saw_api_key
        HTTP.post(srv.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": "key-2"})
        assert srv.saw_api_key and srv.requests[-1]["headers"]["x-api-key"] == "key-2"


def test_anthropic_non_stream_count_tokens_models_and_errors():
    with FakeServer("anthropic", name="claude-fake", models=["a1", "a2"], max_context=1000) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        msg = client.messages.create(model="a1", max_tokens=10, messages=msgs)
        assert msg.content[0].text == "Hello from claude-fake" and msg.stop_reason == "end_turn"
        thought = client.messages.create(model="a1", max_tokens=10, messages=msgs,
                                         extra_headers={"x-fake-behaviour": "reasoning"})
        assert thought.content[0].type == "thinking" and thought.content[0].signature
        assert client.messages.count_tokens(model="a1", messages=msgs).input_tokens > 0
        assert [m.id for m in client.models.list()] == ["a1", "a2"]

        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(model="a1", max_tokens=10, messages=msgs,
                                   extra_headers={"x-fake-behaviour": "overflow;tokens=1200"})
        assert err.value.body["error"]["message"] == "prompt is too long: 1200 tokens > 1000 maximum"
        r = HTTP.post(srv.url + "/v1/messages", json={"model": "a1", "messages": msgs},
                       headers={"x-fake-behaviour": "529"})
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error" and r.headers["request-id"]
        r = HTTP.post(srv.url + "/v1/messages", json={"model": "a1", "messages": msgs},
                       headers={"x-fake-behaviour": "429;retry_after=3"})
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
        stream = client.messages.create(model="a1", max_tokens=10, messages=msgs, stream=True,
                                        extra_headers={"x-fake-behaviour": "error_mid_stream"})
        with pytest.raises(anthropic.APIStatusError):
            list(stream)


def test_ollama_native_and_openai_routes():
    with FakeServer("ollama", name="olla", models=["qwen3:8b"], load_delay=0.1, context_length=40960) as srv:
        assert HTTP.get(srv.url + "/").text == "Ollama is running"
        assert HTTP.head(srv.url + "/").status_code == 200
        assert "version" in HTTP.get(srv.url + "/api/version").json()
        assert HTTP.get(srv.url + "/api/tags").json()["models"][0]["name"] == "qwen3:8b"
        show = HTTP.post(srv.url + "/api/show", json={"model": "qwen3:8b"}).json()
        assert show["model_info"]["qwen3moe.context_length"] == 40960 and "tools" in show["capabilities"]
        assert HTTP.post(srv.url + "/api/show", json={"model": "nope"}).status_code == 404
        assert HTTP.get(srv.url + "/api/ps").json()["models"] == []

        t0 = time.monotonic()
        load = HTTP.post(srv.url + "/api/generate", json={"model": "qwen3:8b"}).json()
        assert load["done_reason"] == "load" and time.monotonic() - t0 >= 0.1
        assert [m["name"] for m in HTTP.get(srv.url + "/api/ps").json()["models"]] == ["qwen3:8b"]

        chat = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "tools": OPENAI_TOOLS}
        r = HTTP.post(srv.url + "/api/chat", json=chat)
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert "".join(x["message"]["content"] for x in lines) == "Hello from olla"
        assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop" and lines[-1]["eval_count"] == 3
        lines = [json.loads(x) for x in HTTP.post(srv.url + "/api/chat", json=chat,
                                                   headers={"x-fake-behaviour": "tools;parallel=2"}).text.splitlines()]
        calls = lines[0]["message"]["tool_calls"]
        assert [c["function"]["arguments"] for c in calls] == [json.loads(TOOL_ARGUMENTS), json.loads(TOOL_ARGUMENTS_2)]
        whole = HTTP.post(srv.url + "/api/chat", json={**chat, "stream": False},
                           headers={"x-fake-behaviour": "reasoning"}).json()
        assert whole["message"]["thinking"] == REASONING_TEXT and whole["prompt_eval_count"] > 0
        err = HTTP.post(srv.url + "/api/chat", json=chat, headers={"x-fake-behaviour": "404_model"})
        assert err.status_code == 404 and err.json() == {"error": "model 'qwen3:8b' not found"}

        unload = HTTP.post(srv.url + "/api/generate", json={"model": "qwen3:8b", "keep_alive": 0}).json()
        assert unload["done_reason"] == "unload" and HTTP.get(srv.url + "/api/ps").json()["models"] == []

        client = oai(srv)
        chunks = list(client.chat.completions.create(model="qwen3:8b", messages=chat["messages"], stream=True,
                                                     tools=OPENAI_TOOLS,
                                                     extra_headers={"x-fake-behaviour": "tools"}))
        tool_chunks = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        assert len(tool_chunks) == 1 and tool_chunks[0].choices[0].delta.tool_calls[0].function.arguments == TOOL_ARGUMENTS
        r = HTTP.post(srv.url + "/v1/chat/completions", json={**chat, "stream": True},
                       headers={"x-fake-behaviour": "reasoning"})
        assert "".join(c["choices"][0]["delta"].get("reasoning", "") for c in sse_data(r.text)[:-1]) == REASONING_TEXT
        assert [m.id for m in client.models.list()] == ["qwen3:8b"]


def test_lmstudio_models_load_unload_and_jit():
    with FakeServer("lmstudio", models=["qwen/q3", "gemma"], load_delay=0.05, context_length=8192) as srv:
        def states():
            return {m["id"]: m["state"] for m in HTTP.get(srv.url + "/api/v0/models").json()["data"]}

        def instances():
            return {m["key"]: [i["id"] for i in m["loaded_instances"]]
                    for m in HTTP.get(srv.url + "/api/v1/models").json()["models"]}

        assert states() == {"qwen/q3": "not-loaded", "gemma": "not-loaded"}
        r = HTTP.post(srv.url + "/api/v1/models/load", json={"model": "qwen/q3", "context_length": 4096,
                                                               "echo_load_config": True}).json()
        assert r["instance_id"] == "qwen/q3" and r["load_time_seconds"] == 0.05
        assert r["load_config"]["context_length"] == 4096
        second = HTTP.post(srv.url + "/api/v1/models/load", json={"model": "qwen/q3"}).json()["instance_id"]
        assert instances() == {"qwen/q3": ["qwen/q3", second], "gemma": []} and second != "qwen/q3"
        assert states()["qwen/q3"] == "loaded"
        assert HTTP.post(srv.url + "/api/v1/models/unload", json={"instance_id": second}).json() == {
            "instance_id": second}
        assert HTTP.post(srv.url + "/api/v1/models/unload", json={"instance_id": "zzz"}).status_code == 404
        assert HTTP.post(srv.url + "/api/v1/models/load", json={"model": "zzz"}).status_code == 404
        assert oai(srv).chat.completions.create(model="gemma", messages=CHAT["messages"]).choices[0].message.content
        assert states() == {"qwen/q3": "loaded", "gemma": "loaded"}


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.fakes", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _ready(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    return f"http://127.0.0.1:{line.split()[1]}"


def test_standalone_process_starts_answers_crashes_and_handles_signals():
    crashy = _spawn("--kind", "openai", "--port", str(free_port()), "--crash-after", "2", "--models", "x,y")
    hangy = _spawn("--kind", "anthropic", "--port", "0")
    stubborn = _spawn("--kind", "ollama", "--ignore-sigterm", "--start-delay", "0.2")
    polite = _spawn("--kind", "lmstudio")
    quitter = _spawn("--exit-at-start", "3")
    procs = [crashy, hangy, stubborn, polite, quitter]
    try:
        assert quitter.wait(10) == 3
        url = _ready(crashy)
        assert [m["id"] for m in HTTP.get(url + "/v1/models").json()["data"]] == ["x", "y"]
        assert HTTP.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert HTTP.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert crashy.wait(5) == 1

        url = _ready(hangy)
        assert HTTP.post(url + "/_fake/hang").status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            HTTP.get(url + "/v1/models", timeout=0.1)
        HTTP.post(url + "/_fake/crash")
        assert hangy.wait(5) == 1

        url = _ready(stubborn)
        stubborn.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        assert stubborn.poll() is None and HTTP.get(url + "/api/version").status_code == 200

        url = _ready(polite)
        assert HTTP.get(url + "/api/v0/models").status_code == 200
        polite.send_signal(signal.SIGTERM)
        assert polite.wait(5) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()


def test_anthropic_fake_checks_thinking_signatures_like_the_real_api():
    """A block it signed comes back fine; any other signature, or thinking on with a tool turn that does not open
    with thinking, is a 400 invalid_request_error."""
    with FakeServer("anthropic", name="claude-fake") as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
        first = client.messages.create(model="a1", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"x-fake-behaviour": "reasoning"})
        block = first.content[0].model_dump(include={"type", "thinking", "signature"})
        turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [block]},
                {"role": "user", "content": "again"}]
        assert client.messages.create(model="a1", max_tokens=10, messages=turn).content[0].type == "text"
        for forged in ("coderouter-unsigned", "", block["signature"][:-2] + "AA"):
            turn[1] = {"role": "assistant", "content": [{**block, "signature": forged}]}
            with pytest.raises(anthropic.BadRequestError) as err:
                client.messages.create(model="a1", max_tokens=10, messages=turn)
            assert err.value.body["error"] == {"type": "invalid_request_error", "message":
                                               "messages.1.content.0: Invalid `signature` in `thinking` block"}
        loop = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}]
        with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
            client.messages.create(model="a1", max_tokens=2000, messages=loop,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
        assert client.messages.create(model="a1", max_tokens=10, messages=loop).content


def test_streamed_echoes_quote_each_requests_own_tool_result():
    """An echo is built from the request: two streamed calls with different tool results must not share frames
    (a cache keyed by behaviour alone once answered "Tool said: FIRST" to both)."""
    def chat(result: str) -> dict:
        return {"model": "m1", "stream": True, "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result}]}

    def messages(result: str) -> dict:
        return {"model": "m1", "max_tokens": 50, "stream": True, "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]}]}

    headers = {"x-fake-behaviour": "echo_tool_result"}
    with FakeServer("openai") as srv:
        for result in ("FIRST", "SECOND"):
            r = HTTP.post(srv.url + "/v1/chat/completions", json=chat(result), headers=headers)
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in sse_data(r.text)
                           if c != "[DONE]" and c.get("choices"))
            assert text == f"Tool said: {result}"
    with FakeServer("anthropic") as srv:
        for result in ("FIRST", "SECOND"):
            r = HTTP.post(srv.url + "/v1/messages", json=messages(result), headers=headers)
            text = "".join(d["delta"].get("text", "") for e, d in sse_events(r.text) if e == "content_block_delta")
            assert text == f"Tool said: {result}"
