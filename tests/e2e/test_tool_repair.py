"""Tool calls written as text by a local model reach the official SDKs as real tool calls, on both ingresses,
stream and non-stream, from an OpenAI-wire and an Anthropic-wire local backend; a call quoted in a code fence
stays text; the repair shows in the audit log and in `corectl status`."""

from __future__ import annotations

import re

import anthropic
import openai
import orjson
import pytest

from coderouterd.state import read_audit
from tests.e2e.test_control_plane import corectl, status_json
from tests.fakes.behaviour import TEXT_TOOL_COMMAND
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import admin_get, running
from tests.support.wait import wait_for


def config(local_url: str, local_anthropic_url: str, sock: str) -> str:
    return daemon_config(
        server={"stream_hold_s": 0.3}, admin={"socket": sock}, breaker=NO_BREAKER,
        providers={"local": openai_at(local_url), "local-anthropic": anthropic_at(local_anthropic_url),
                   "local-off": openai_at(local_url, tool_repair="off")},
        profiles={"default": warn("local"), "anthropic-wire": warn("local-anthropic"), "off": warn("local-off")})

SCHEMA = {"type": "object", "required": ["command"], "properties": {"command": {"type": "string"}}}
A_TOOLS = [{"name": "Bash", "description": "run a command", "input_schema": SCHEMA}]
O_TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": SCHEMA}}]
USER = [{"role": "user", "content": "run echo"}]
CALL_INPUT = {"command": TEXT_TOOL_COMMAND}
PROFILES = ["default", "anthropic-wire"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_repair")
    with FakeServer("openai", name="local", behaviour="text_tools") as local, \
            FakeServer("anthropic", name="local-anthropic", behaviour="text_tools") as local_a:
        with running(config(local.url, local_a.url, str(tmp / "admin.sock")), tmp) as d:
            yield {"daemon": d, "fakes": [local, local_a], "sock": str(tmp / "admin.sock")}


def _set(env, behaviour: str) -> None:
    for f in env["fakes"]:
        f.set_behaviour(behaviour)


def _anthropic(env, profile: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env["daemon"].url, api_key="x", max_retries=0, timeout=20,
                               default_headers={"x-coderouter-profile": profile})


def _openai(env, profile: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=env["daemon"].url + "/v1", api_key="x", max_retries=0, timeout=20,
                         default_headers={"x-coderouter-profile": profile})


@pytest.mark.parametrize("fmt", ["hermes", "qwen_xml", "mistral"])
@pytest.mark.parametrize("profile", PROFILES)
def test_anthropic_sdk_stream(env, profile, fmt):
    _set(env, f"text_tools;format={fmt};split=3")
    with _anthropic(env, profile).messages.stream(model="qwen3", max_tokens=100, messages=USER,
                                                  tools=A_TOOLS) as s:
        text = "".join(s.text_stream)
        msg = s.get_final_message()
    tool_uses = [b for b in msg.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in tool_uses] == [("Bash", CALL_INPUT)]
    assert msg.stop_reason == "tool_use" and msg.usage.output_tokens > 0
    assert "<tool_call>" not in text and "TOOL_CALLS" not in text
    assert text == ("I'll run it." if fmt == "hermes" else "")


@pytest.mark.parametrize("profile", PROFILES)
def test_anthropic_sdk_non_stream(env, profile):
    _set(env, "text_tools;format=qwen_xml")
    msg = _anthropic(env, profile).messages.create(model="qwen3", max_tokens=100, messages=USER, tools=A_TOOLS)
    assert [(b.type, getattr(b, "input", None)) for b in msg.content] == [("tool_use", CALL_INPUT)]
    assert msg.stop_reason == "tool_use" and msg.usage.input_tokens > 0


@pytest.mark.parametrize("profile", PROFILES)
def test_openai_sdk_stream(env, profile):
    _set(env, "text_tools;format=hermes;split=2")
    args, name, finish, text = "", "", None, ""
    for c in _openai(env, profile).chat.completions.create(model="qwen3", messages=USER, tools=O_TOOLS,
                                                          stream=True, stream_options={"include_usage": True}):
        if not c.choices:
            assert c.usage.completion_tokens > 0
            continue
        d = c.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert (name, orjson.loads(args), finish, text) == ("Bash", CALL_INPUT, "tool_calls", "I'll run it.")


@pytest.mark.parametrize("profile", PROFILES)
def test_openai_sdk_non_stream(env, profile):
    _set(env, "text_tools;format=qwen_xml")
    r = _openai(env, profile).chat.completions.create(model="qwen3", messages=USER, tools=O_TOOLS)
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, orjson.loads(call.function.arguments)) == ("Bash", CALL_INPUT)
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens > 0


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("stream", [True, False])
def test_quoted_call_in_a_fence_reaches_the_user_as_text(env, profile, stream):
    _set(env, "text_tools;format=quoted")
    client = _anthropic(env, profile)
    if stream:
        with client.messages.stream(model="qwen3", max_tokens=100, messages=USER, tools=A_TOOLS) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(model="qwen3", max_tokens=100, messages=USER, tools=A_TOOLS)
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "end_turn"
    assert "```\n<tool_call>\n" in msg.content[0].text and msg.content[0].text.endswith("Nothing was run.")


def test_tool_repair_off_leaves_the_text(env):
    _set(env, "text_tools;format=hermes")
    msg = _anthropic(env, "off").messages.create(model="qwen3", max_tokens=100, messages=USER, tools=A_TOOLS)
    assert [b.type for b in msg.content] == ["text"] and "<tool_call>" in msg.content[0].text


def test_audit_and_status_show_the_repairs(env):
    _set(env, "text_tools;format=hermes")
    raw = _anthropic(env, "default").messages.with_raw_response.create(model="qwen3", max_tokens=100,
                                                                       messages=USER, tools=A_TOOLS)
    request_id = raw.headers["x-request-id"]
    def repaired() -> list[dict]:
        events = [e for e in read_audit(env["daemon"].state_dir)
                  if e["kind"] == "tool_repaired" and e["request_id"] == request_id]
        # Polled from here (a corectl per poll costs a process start); what corectl shows is read once, below.
        st = admin_get(env["sock"]) or {"providers": []}
        providers = {p["name"]: p["tool_repair"] for p in st["providers"]}
        return events if providers.get("local", {}).get("repaired") else []

    events = wait_for(repaired)
    providers = {p["name"]: p["tool_repair"] for p in status_json(env["sock"])["providers"]}
    assert len(events) == 1 and events[0]["provider"] == "local" and events[0]["calls"] == 1
    assert events[0]["formats"] == ["hermes"] and not events[0]["streaming"]
    local = providers["local"]
    assert local["mode"] == "auto" and local["local"] and local["repaired"] >= 1 and local["answers"] >= 1
    assert 0 < local["rate"] <= 1
    assert providers["local-off"]["answers"] == 0
    explained = corectl("explain", request_id, env_socket=env["sock"])
    assert explained.returncode == 0 and "1 tool call(s) written as text (hermes)" in explained.stdout
    shown = corectl("status", env_socket=env["sock"])
    assert shown.returncode == 0 and "Repair" in shown.stdout and re.search(r"\d+/\d+ \(\d+%\)", shown.stdout)


R_TOOLS = [{"type": "function", "name": "Bash", "description": "run a command", "parameters": SCHEMA}]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("stream", [True, False])
def test_responses_ingress_gets_function_call_items(env, profile, stream):
    _set(env, "text_tools;format=qwen_xml;split=3")
    client = _openai(env, profile)
    if stream:
        with client.responses.stream(model="qwen3", input="run echo", tools=R_TOOLS) as s:
            events = list(s)
            final = s.get_final_response()
        assert any(e.type == "response.function_call_arguments.done" for e in events)
        assert not any(e.type == "response.output_text.delta" and "<tool_call>" in e.delta for e in events)
    else:
        final = client.responses.create(model="qwen3", input="run echo", tools=R_TOOLS)
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, orjson.loads(c.arguments)) for c in calls] == [("Bash", CALL_INPUT)]
    assert not [o for o in final.output if o.type == "message"]  # the markup never reaches the client
    assert final.usage.output_tokens > 0


def test_responses_ingress_quoted_call_stays_text(env):
    _set(env, "text_tools;format=quoted")
    final = _openai(env, "default").responses.create(model="qwen3", input="show me", tools=R_TOOLS)
    assert [o.type for o in final.output] == ["message"] and "<tool_call>" in final.output_text
