"""Issue 23 item 8: the README's "local first, then Anthropic" profile survives a fallback in the middle of a
conversation. Turn 1 is served by a local model that reasons (its thinking reaches the client signed
`coderouter-unsigned`); the local server then fails, and the Claude-Code-shaped turn 2, echoing those blocks,
goes to the Anthropic fake, which checks signatures as the real API does and refuses any it did not make."""

from __future__ import annotations

import copy

import httpx
import orjson
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import DaemonProcess, running

BASH = {"name": "Bash", "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}


# Claude Code's main turns send adaptive thinking; manual thinking is where the API is strictest (a tool turn must
# open with a signed thinking block).
THINKING = [{"type": "adaptive"}, {"type": "enabled", "budget_tokens": 2048}]


def _claude_code_body(messages: list, thinking: dict) -> dict:
    return {"model": "qwen3-coder", "max_tokens": 32000, "stream": True, "messages": messages, "tools": [BASH],
            "thinking": thinking,
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}


def _message(resp: httpx.Response) -> dict:
    """The assistant message a streamed answer builds, as Claude Code assembles it."""
    assert resp.status_code == 200, resp.text
    blocks: dict[int, dict] = {}
    partial: dict[int, str] = {}
    for line in resp.text.splitlines():
        if not line.startswith("data: "):
            continue
        ev = orjson.loads(line[6:])
        if ev["type"] == "error":
            pytest.fail(f"error event: {ev}")
        if ev["type"] == "content_block_start":
            blocks[ev["index"]] = dict(ev["content_block"])
        elif ev["type"] == "content_block_delta":
            b, d = blocks[ev["index"]], ev["delta"]
            if d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] = d["signature"]
            elif d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "input_json_delta":
                partial[ev["index"]] = partial.get(ev["index"], "") + d["partial_json"]
    for i, js in partial.items():
        blocks[i]["input"] = orjson.loads(js or "{}")
    return {"role": "assistant", "content": [blocks[i] for i in sorted(blocks)]}


def _last_sent(fake: FakeServer) -> dict:
    return [r["json"] for r in fake.requests if r["path"] == "/v1/messages"][-1]


def _sent_blocks(fake: FakeServer) -> list[dict]:
    """The content blocks of the last Messages request the fake received."""
    return [b for m in _last_sent(fake)["messages"] if isinstance(m["content"], list) for b in m["content"]]


@pytest.fixture
def chain(tmp_path):
    with FakeServer("openai", name="local", models=["qwen3-coder"]) as local, \
            FakeServer("anthropic", name="cloud") as cloud:
        cfg = daemon_config(providers={"local": openai_at(local.url),
                                       "anthropic": anthropic_at(cloud.url, model="claude-sonnet-5")},
                            profiles={"default": warn("local", "anthropic")})
        with running(cfg, tmp_path) as d:
            yield d, local, cloud


def _post(d: DaemonProcess, body: dict) -> httpx.Response:
    return httpx.post(d.url + "/v1/messages", json=body, timeout=30,
                      headers={"anthropic-version": "2023-06-01", "x-api-key": "k"})


@pytest.mark.parametrize("thinking", THINKING)
def test_a_tool_loop_begun_locally_finishes_on_anthropic(chain, thinking):
    d, local, cloud = chain
    local.set_behaviour("tools;reason=1;tool=Bash")
    history = [{"role": "user", "content": "list the files"}]
    turn1 = _message(_post(d, _claude_code_body(history, thinking)))
    kinds = [b["type"] for b in turn1["content"]]
    assert kinds[0] == "thinking" and "tool_use" in kinds
    assert turn1["content"][0]["signature"] == "coderouter-unsigned"
    call = next(b for b in turn1["content"] if b["type"] == "tool_use")
    history += [turn1, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                     "content": "a.py\nb.py"}]}]
    body = _claude_code_body(history, thinking)

    # What the fix prevents: the same turn sent to Anthropic as it is refused.
    direct = httpx.post(cloud.url + "/v1/messages", json={**copy.deepcopy(body), "model": "claude-sonnet-5"})
    assert direct.status_code == 400 and "Invalid `signature`" in direct.text

    local.set_behaviour("500")
    cloud.reset()
    turn2 = _message(_post(d, body))
    assert turn2["content"][-1]["text"] == "Hello from cloud"
    sent = _last_sent(cloud)
    assert "thinking" not in sent  # the loop's turn cannot open with a signed thinking block: off for it
    assert sent["messages"][1]["content"][0]["type"] == "text"  # the local reasoning, still seen by the model

    # Turn 3, a new question after the loop ended: thinking is on again, Anthropic's own block goes back
    # verbatim and the local one of turn 1 is gone.
    local.set_behaviour("500")
    cloud.set_behaviour("reasoning")
    history += [turn2, {"role": "user", "content": "and now?"}]
    turn3 = _message(_post(d, _claude_code_body(history, thinking)))
    assert turn3["content"][0]["type"] == "thinking" and turn3["content"][0]["signature"] != "coderouter-unsigned"
    cloud.set_behaviour("ok")
    history += [turn3, {"role": "user", "content": "thanks"}]
    assert _message(_post(d, _claude_code_body(history, thinking)))["content"][-1]["text"] == "Hello from cloud"
    assert _last_sent(cloud)["thinking"] == thinking
    sent_blocks = _sent_blocks(cloud)
    assert turn3["content"][0] in sent_blocks
    assert not any(b.get("signature") == "coderouter-unsigned" for b in sent_blocks)






@pytest.mark.parametrize("thinking", THINKING)
def test_a_conversation_moving_between_two_anthropic_upstreams_never_sends_one_the_others_signatures(
        tmp_path, thinking):
    """Each upstream signs with its own key (as a gateway and the Anthropic API do): a block one signed is refused
    by the other, so it must not reach it. Turns alternate between them as the first fails and recovers."""
    with FakeServer("anthropic", name="first") as first, FakeServer("anthropic", name="second") as second:
        cfg = daemon_config(providers={"first": anthropic_at(first.url, model="claude-sonnet-5"),
                                       "second": anthropic_at(second.url, model="claude-sonnet-5")},
                            profiles={"default": warn("first", "second")})
        with running(cfg, tmp_path) as d:
            first.set_behaviour("reasoning")
            history = [{"role": "user", "content": "think about it"}]
            turn1 = _message(_post(d, _claude_code_body(history, thinking)))
            assert turn1["content"][0]["type"] == "thinking"
            history += [turn1, {"role": "user", "content": "and then?"}]
            body = _claude_code_body(history, thinking)
            direct = httpx.post(second.url + "/v1/messages", json={**copy.deepcopy(body), "model": "claude-sonnet-5"})
            assert direct.status_code == 400 and "Invalid `signature`" in direct.text  # what the fix prevents

            first.set_behaviour("500")
            second.set_behaviour("reasoning")
            turn2 = _message(_post(d, body))  # served by the second: the first's block is not sent there
            assert turn2["content"][0]["type"] == "thinking"
            assert turn1["content"][0] not in _sent_blocks(second)

            first.set_behaviour("ok")
            first.reset()
            history += [turn2, {"role": "user", "content": "and now?"}]
            turn3 = _message(_post(d, _claude_code_body(history, thinking)))  # back on the first
            assert turn3["content"][-1]["text"] == "Hello from first"
            sent = _sent_blocks(first)
            assert turn1["content"][0] in sent and turn2["content"][0] not in sent  # its own goes back verbatim
