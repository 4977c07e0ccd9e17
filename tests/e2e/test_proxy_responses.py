"""Codex's side of the wire: the official openai SDK on /v1/responses (create and the stream helper), against a
chat-completions upstream, an Anthropic upstream and one that serves the Responses API itself."""

from __future__ import annotations

import sqlite3
import time

import httpx
import openai
import orjson
import pytest

from tests.fakes.behaviour import REASONING_TEXT, TOOL_ARGUMENTS, TOOL_ARGUMENTS_2
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, PINGING, anthropic_at, daemon_config, openai_at, upstream, warn
from tests.support.daemon import running
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for


def config(local, cloud, limited, native) -> str:
    return daemon_config(
        server={"stream_hold_s": 0.3}, state={"flush_interval_s": 0.1}, breaker=NO_BREAKER,
        providers={"local": openai_at(local.url), "cloud": anthropic_at(cloud.url, model="claude-sonnet-5"),
                   "limited": openai_at(limited.url), "native": openai_at(native.url, serves_responses=True)},
        profiles={"default": warn("local"), "cloud": warn("cloud"), "fallback": warn("limited", "local"),
                  "limited": warn("limited"), "native": warn("native")})

PROFILES = ["default", "cloud"]
USER = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}}},
         {"type": "function", "name": "write_stdin", "parameters": {"type": "object", "properties": {}}},
         {"type": "web_search"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_responses")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, \
            FakeServer("anthropic", name="cloud") as cloud, \
            FakeServer("openai", name="limited", behaviour="429;retry_after=7") as limited, \
            FakeServer("openai", name="native", models=["gpt-x"]) as native:
        with running(config(local, cloud, limited, native), tmp) as d:
            yield {"daemon": d, "local": local, "cloud": cloud, "limited": limited, "native": native}


@pytest.fixture(autouse=True)
def _reset(env):
    for k in ("local", "cloud", "native"):
        env[k].reset()
        env[k].set_behaviour("ok")


def _client(env, profile: str = "default") -> openai.OpenAI:
    return openai.OpenAI(base_url=env["daemon"].url + "/v1", api_key="x", max_retries=0, timeout=20,
                         default_headers={"x-coderouter-profile": profile})


def _behave(env, behaviour: str) -> None:
    for k in ("local", "cloud", "native"):
        env[k].set_behaviour(behaviour)


def _greeting(profile: str) -> str:
    return "Hello from " + ("local" if profile == "default" else "cloud")


def _stream(env, profile: str, behaviour: str | None = None, **kw):
    if behaviour:
        _behave(env, behaviour)
    with _client(env, profile).responses.stream(model="qwen3", input=kw.pop("input", USER),
                                                           **kw) as s:
        events = list(s)
        final = s.get_final_response()
    return events, final


def _assert_numbered(events) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("profile", PROFILES)
def test_create_non_stream(env, profile):
    r = _client(env, profile).responses.create(model="qwen3", input=USER)
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == _greeting(profile)
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens == 0


@pytest.mark.parametrize("profile", PROFILES)
def test_stream_helper_reassembles_text(env, profile):
    events, final = _stream(env, profile)
    _assert_numbered(events)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for t in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.output_item.done"):
        assert t in types, t
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == _greeting(profile)
    assert final.output_text == _greeting(profile)
    assert final.usage.output_tokens > 0


def test_string_input_and_instructions_translated(env):
    r = _client(env).responses.create(model="qwen3", input="hello", instructions="sys", max_output_tokens=50,
                                      temperature=0.3, top_p=0.9, reasoning={"effort": "high"},
                                      prompt_cache_key="sess-1")
    assert r.output_text == "Hello from local"
    up = env["local"].requests[-1]["json"]
    assert up["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert up["max_tokens"] == 50 and up["temperature"] == 0.3 and up["top_p"] == 0.9
    assert up["reasoning_effort"] == "high" and up["prompt_cache_key"] == "sess-1"


@pytest.mark.parametrize("profile", PROFILES)
def test_parallel_tool_calls_reassembled_byte_exact(env, profile):
    events, final = _stream(env, profile, "tools;split=1;parallel=2", tools=TOOLS)
    _assert_numbered(events)
    calls = [o for o in final.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["exec_command", "write_stdin"]
    assert [c.arguments for c in calls] == [TOOL_ARGUMENTS, TOOL_ARGUMENTS_2]
    assert all(c.call_id for c in calls) and len({c.call_id for c in calls}) == 2
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 10  # streamed incrementally, not in one piece
    for c in calls:
        mine = [e.delta for e in deltas if e.item_id == c.id]
        assert "".join(mine) == c.arguments
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == [TOOL_ARGUMENTS, TOOL_ARGUMENTS_2]
    up = env["local" if profile == "default" else "cloud"].requests[-1]["json"]
    names = [t["function"]["name"] for t in up["tools"]] if profile == "default" else [t["name"] for t in up["tools"]]
    assert names == ["exec_command", "write_stdin"]  # the hosted web_search is not sent to a chat upstream


def test_namespace_tool_round_trips(env):
    tools = [{"type": "namespace", "name": "multi_agent_v1", "description": "agents",
              "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]}]
    _behave(env, "tools")
    r = httpx.post(env["daemon"].url + "/v1/responses",
                   json={"model": "qwen3", "input": USER, "tools": tools}, timeout=20).json()
    call = r["output"][0]
    assert call["type"] == "function_call"
    assert (call["namespace"], call["name"]) == ("multi_agent_v1", "spawn_agent")
    flat = env["local"].requests[-1]["json"]["tools"][0]["function"]["name"]
    # The next turn sends the call back in namespace form: it reaches the upstream under the same flat name.
    follow = USER + [{"type": "function_call", "call_id": call["call_id"], "name": "spawn_agent",
                      "namespace": "multi_agent_v1", "arguments": call["arguments"]},
                     {"type": "function_call_output", "call_id": call["call_id"], "output": "spawned"}]
    httpx.post(env["daemon"].url + "/v1/responses", json={"model": "qwen3", "input": follow, "tools": tools},
               timeout=20).raise_for_status()
    msgs = env["local"].requests[-1]["json"]["messages"]
    assert msgs[-2]["tool_calls"][0]["function"]["name"] == flat
    assert msgs[-1] == {"role": "tool", "tool_call_id": call["call_id"], "content": "spawned"}


@pytest.mark.parametrize("behaviour", ["reasoning", "reasoning;think_tags=1"])
def test_reasoning_becomes_a_reasoning_item(env, behaviour):
    events, final = _stream(env, "default", behaviour)
    _assert_numbered(events)
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert summary == REASONING_TEXT
    kinds = [o.type for o in final.output]
    assert kinds == ["reasoning", "message"]
    assert final.output[0].summary[0].text == REASONING_TEXT
    assert final.output_text == "Hello from local"
    assert final.usage.output_tokens_details.reasoning_tokens > 0


def test_validation_errors_name_the_field(env):
    url = env["daemon"].url + "/v1/responses"
    r = httpx.post(url, json={"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input[0].role" and err["type"] == "invalid_request_error"
    r = httpx.post(url, json={"model": "m", "input": "x", "previous_response_id": "resp_1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    r = httpx.post(url, json={"input": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        _client(env).responses.create(model="m", input="x", max_output_tokens=0)
    assert "max_output_tokens" in str(e.value)
    assert httpx.get(env["daemon"].url + "/healthz").status_code == 200


def test_rate_limited_everywhere_is_429_with_retry_after(env):
    r = httpx.post(env["daemon"].url + "/v1/responses", headers={"x-coderouter-profile": "limited"},
                   json={"model": "m", "input": "x"}, timeout=20)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    # OpenAI's words (docs/protocols.md, "Errors coderouterd sends"), not Anthropic's rate_limit_error.
    assert r.json()["error"]["type"] == "rate_limit_exceeded" and r.json()["error"]["code"] == "rate_limit_exceeded"


def test_fallback_serves_from_the_next_provider(env):
    r = _client(env, "fallback").responses.with_raw_response.create(model="qwen3", input=USER)
    assert r.headers["x-coderouter-provider"] == "local"
    assert r.parse().output_text == "Hello from local"


def test_context_overflow_is_context_length_exceeded(env):
    _behave(env, "overflow")
    r = httpx.post(env["daemon"].url + "/v1/responses",
                   json={"model": "m", "input": "x", "stream": True}, timeout=20)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_failure_after_stream_start_is_response_failed(env):
    _behave(env, "error_mid_stream;chunk_delay=0.05")
    with httpx.stream("POST", env["daemon"].url + "/v1/responses",
                      json={"model": "m", "input": "x", "stream": True}, timeout=20) as r:
        assert r.status_code == 200
        body = r.read().decode()
    events = [orjson.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "response.completed" not in body


def test_a_stream_past_the_answer_bound_ends_with_response_failed_saying_why(env):
    """The closing events repeat the whole text, so it is kept: up to the bound of a whole answer (16 MB), not
    for as long as the upstream sends (issue 34). 300 deltas of 64 KB pass it."""
    _behave(env, "chunks;n=300;size=65536")
    try:
        with httpx.stream("POST", env["daemon"].url + "/v1/responses",
                          json={"model": "m", "input": "x", "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            body = r.read().decode()
    finally:
        _behave(env, "ok")
    events = [orjson.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert "answer longer than 16 MB" in last["response"]["error"]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "response.completed" not in body
    delivered = sum(len(e["delta"]) for e in events if e["type"] == "response.output_text.delta")
    assert 8 * 2**20 < delivered <= 16 * 2**20


def test_a_big_answer_below_the_bound_completes_with_its_closing_events_one_by_one(env):
    _behave(env, "chunks;n=40;size=65536")  # 2.6 MB: its closing events leave one write each
    try:
        with httpx.stream("POST", env["daemon"].url + "/v1/responses",
                          json={"model": "m", "input": "x", "stream": True}, timeout=60) as r:
            body = r.read().decode()
    finally:
        _behave(env, "ok")
    events = [orjson.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert len(text) == 40 * 65536
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text


def test_models_list_is_openai_shaped(env):
    m = _client(env).models.list()
    ids = [x.id for x in m.data]
    assert "profile:default" in ids and all(x.object == "model" for x in m.data)


def test_passthrough_to_an_upstream_serving_responses(env):
    body = {"model": "gpt-x", "input": USER, "stream": True, "tools": TOOLS}
    events, final = _stream(env, "native", tools=TOOLS)
    _assert_numbered(events)
    assert final.output_text == "Hello from native"
    up = env["native"].requests[-1]
    assert up["path"] == "/v1/responses"
    assert up["json"]["input"] == body["input"] and up["json"]["tools"] == TOOLS  # as the client sent it
    r = _client(env, "native").responses.create(model="gpt-x", input=USER)
    assert r.output_text == "Hello from native" and r.usage.output_tokens > 0


def test_session_key_journaled_and_hosted_tools_noted_in_trace(env):
    r = httpx.post(env["daemon"].url + "/v1/responses",
                   json={"model": "m", "input": "x", "tools": TOOLS, "prompt_cache_key": "codex-sess-42"}, timeout=20)
    rid = r.headers["x-request-id"]
    db = env["daemon"].state_dir / "state.db"
    deadline = time.monotonic() + 30  # a ceiling: the journal's writer flushes every 250 ms
    row = None
    while time.monotonic() < deadline and row is None:
        time.sleep(0.1)
        if db.exists():
            con = sqlite3.connect(db)
            try:
                row = con.execute("SELECT ingress, session_key FROM journal WHERE request_id=?", (rid,)).fetchone()
            finally:
                con.close()
    assert row == ("responses", "codex-sess-42")
    sock = next(env["daemon"].state_dir.rglob("*.sock"), None)
    if sock is not None:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://coderouterd") as c:
            trace = c.get(f"/v1/requests/{rid}").json()
        assert any("web_search" in n for n in trace["notes"])
        assert trace["ingress"] == "responses"


def test_passthrough_encrypted_reasoning_goes_back_only_to_its_issuer(env):
    _behave(env, "reasoning")
    events, final = _stream(env, "native", include=["reasoning.encrypted_content"])
    _assert_numbered(events)
    reasoning = [o for o in final.output if o.type == "reasoning"][0]
    assert reasoning.encrypted_content == "coderouter:native:enc-native"
    _behave(env, "ok")
    follow = USER + [reasoning.model_dump(exclude_none=True),
                     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]}]
    _client(env, "native").responses.create(model="gpt-x", input=follow)
    sent = env["native"].requests[-1]["json"]["input"][2]
    assert sent["encrypted_content"] == "enc-native"  # unwrapped for the provider that issued it
    # A chat upstream never sees it: only the summary survives, as reasoning_content.
    _client(env, "default").responses.create(model="qwen3", input=follow)
    msgs = env["local"].requests[-1]["json"]["messages"]
    assert b"enc-native" not in orjson.dumps(msgs)
    assert msgs[-2]["reasoning_content"] == REASONING_TEXT


def routing_config(slow, fast) -> str:
    return daemon_config(
        server={"stream_hold_s": 0.3},
        providers={"slow": openai_at(slow.url), "fast": anthropic_at(fast.url, model="claude-sonnet-5")},
        profiles={"default": warn("slow", "fast", mode="race"),
                  "guarded": warn("fast", tool_loop={"action": "break", "threshold": 3, "window": 5})},
        routes=[{"model": "*-guarded", "profile": "guarded"}])


def test_race_routes_tool_loop_guard_and_metrics(tmp_path):
    with FakeServer("openai", name="slow", behaviour="slow_first_byte;delay=2") as slow, \
            FakeServer("anthropic", name="fast") as fast:
        with running(routing_config(slow, fast), tmp_path) as d:
            client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=20)
            # Race: the Anthropic provider answers first, the slow one is dropped; the stream is well formed.
            with client.responses.stream(model="m", input=USER) as s:
                events = list(s)
                final = s.get_final_response()
            _assert_numbered(events)
            assert final.output_text == "Hello from fast"
            # [[routes]] by model, then the tool-loop guard on the translated history: the same call three
            # times in a row is refused with a 400 in OpenAI's shape.
            call = {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": '{"cmd":"ls"}'}
            history = [USER[1]]
            for i in range(3):
                history += [{**call, "call_id": f"c{i}"},
                            {"type": "function_call_output", "call_id": f"c{i}", "output": "same"}]
            with pytest.raises(openai.BadRequestError) as e:
                client.responses.create(model="m-guarded", input=history, tools=TOOLS[:1])
            assert "exec_command" in str(e.value)
            assert client.responses.create(model="m-guarded", input=USER).output_text == "Hello from fast"
            # The metrics are fed by the state writer thread, not inline.
            assert wait_for(lambda: total(scrape(d), "coderouter_requests_total", ingress="responses") >= 1), \
                "no Responses request in /metrics"


@pytest.mark.parametrize("good_kind", ["openai", "anthropic"])
def test_commit_before_content_then_failover_keeps_one_prologue_and_the_numbering(tmp_path, good_kind):
    """The stream is committed (created + in_progress sent, then pings) while the first provider hangs; it
    fails before any content and the next one serves: the client sees one opening pair, one numbering."""
    with FakeServer("openai", name="stuck", behaviour="hang") as stuck, FakeServer(good_kind, name="good") as good:
        cfg = daemon_config(server=PINGING, profiles={"default": ["stuck", "good"]},
                            providers={"stuck": openai_at(stuck.url, timeouts={"first_byte": 0.8}),
                                       "good": upstream(good.url, kind=good_kind)})
        with running(cfg, tmp_path) as d:
            client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=20)
            with client.responses.stream(model="m", input=USER) as s:
                events = list(s)
                final = s.get_final_response()
            types = [e.type for e in events]
            assert types.count("response.created") == 1 and types.count("response.in_progress") == 1
            _assert_numbered(events)
            assert final.output_text == "Hello from good"
            assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
            r = httpx.post(d.url + "/v1/responses", json={"model": "m", "input": "x", "stream": True}, timeout=20)
            assert ": ping" in r.text.split("response.output_item.added")[0]  # pings while the first one hung


def test_race_committed_before_any_event_sends_one_prologue(tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_first_byte;delay=0.8") as a, \
            FakeServer("anthropic", name="b", behaviour="slow_first_byte;delay=0.6") as b:
        cfg = daemon_config(server=PINGING, providers={"a": a.url, "b": anthropic_at(b.url)},
                            profiles={"default": {"providers": ["a", "b"], "mode": "race"}})
        with running(cfg, tmp_path) as d:
            client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=20)
            with client.responses.stream(model="m", input=USER) as s:
                events = list(s)
                final = s.get_final_response()
            assert [e.type for e in events].count("response.created") == 1
            _assert_numbered(events)
            assert final.output_text == "Hello from b"
