"""The real GitHub Copilot CLI (npm @github/copilot, pinned in tests/clients/package.json) through coderouterd, in
its bring-your-own-key mode with no GitHub login, headless (`copilot -p ... --allow-all-tools`), on each of the
three wires it can speak: chat completions (its default), Anthropic Messages (`COPILOT_PROVIDER_TYPE=anthropic`)
and Responses (`COPILOT_PROVIDER_WIRE_API=responses`). On each, against a chat-completions upstream and an
Anthropic one: a plain answer, and a tool round trip in which the CLI runs its built-in `view` tool for the model
and sends the file back. What it sends is in docs/clients.md.

`make test` installs the CLI with `npm ci` in tests/clients; only when npm could not reach its registry is this
module skipped (the reason is in tests/clients/.npm-unavailable)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.fakes.runner import FakeServer
from tests.support.clients import cli, skip_reason
from tests.support.config import anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import running

COPILOT = cli("copilot")

WIRES = ["chat", "anthropic", "responses"]
# Not "cloud": the CLI treats the values of COPILOT_PROVIDER_HEADERS as secrets and masks them in everything it
# prints, and the cloud fake answers "Hello from cloud".
PROFILES = ["default", "claude"]
# The path each wire's requests take to the upstream of each profile: the local fake speaks chat completions,
# the cloud one Anthropic Messages.
UPSTREAM_PATH = {"default": "/v1/chat/completions", "claude": "/v1/messages"}
LIMIT = 321


def _skip_reason() -> str | None:
    return skip_reason(COPILOT, "Copilot CLI")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("e2e_copilot_cli")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, FakeServer("anthropic", name="cloud") as cloud:
        config = daemon_config(
            providers={"local": openai_at(local.url), "cloud": anthropic_at(cloud.url, model="claude-sonnet-5")},
            profiles={"default": warn("local"), "claude": warn("cloud"),
                      "capped": warn("local", default_max_tokens=LIMIT)})
        with running(config, tmp / "daemon") as d:
            # The CLI unpacks its bundled package (~235 MB) into $XDG_CACHE_HOME/copilot on first start: once for
            # the module, not once per test's private HOME.
            yield {"daemon": d, "default": local, "claude": cloud, "cache": tmp / "xdg-cache"}


def provider_env(url: str, wire: str) -> dict[str, str]:
    """What the README tells a Copilot CLI user to set for each wire."""
    if wire == "anthropic":  # the Anthropic SDK adds /v1/messages itself
        return {"COPILOT_PROVIDER_BASE_URL": url, "COPILOT_PROVIDER_TYPE": "anthropic"}
    out = {"COPILOT_PROVIDER_BASE_URL": url + "/v1"}
    if wire == "responses":
        out["COPILOT_PROVIDER_WIRE_API"] = "responses"
    return out


def copilot_p(env, tmp_path: Path, wire: str, profile: str, prompt: str) -> tuple[subprocess.CompletedProcess, list]:
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "notes.txt").write_text("the secret word is pineapple\n")
    child_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "TMPDIR": str(tmp_path),
                 "XDG_CACHE_HOME": str(env["cache"]), "NO_COLOR": "1",
                 **provider_env(env["daemon"].url, wire),
                 "COPILOT_MODEL": "qwen3", "COPILOT_PROVIDER_API_KEY": "local-key",
                 # Loopback only: no GitHub sign-in, telemetry, web tools or update check.
                 "COPILOT_OFFLINE": "true", "COPILOT_AUTO_UPDATE": "false",
                 # The profile header, through the CLI's own provider-headers variable.
                 "COPILOT_PROVIDER_HEADERS": f"x-coderouter-profile: {profile}"}
    proc = subprocess.run([str(COPILOT), "-p", prompt, "--allow-all-tools", "--output-format", "json",
                           "--no-auto-update"], env=child_env, cwd=work, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, events


def answers(events: list) -> list[str]:
    return [e["data"]["content"] for e in events if e["type"] == "assistant.message" and e["data"].get("content")]


def upstream_bodies(fake: FakeServer, profile: str) -> list[dict]:
    return [r["json"] for r in fake.requests if r["path"] == UPSTREAM_PATH[profile]]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("wire", WIRES)
def test_copilot_plain_answer(env, tmp_path, wire, profile):
    fake = env[profile]
    fake.reset()
    proc, events = copilot_p(env, tmp_path, wire, profile, "say hi")
    assert proc.returncode == 0, (proc.stderr[-2000:], proc.stdout[-2000:])
    assert answers(events) == ["Hello from " + ("local" if profile == "default" else "cloud")], proc.stdout[-2000:]
    assert events[-1]["type"] == "result" and events[-1]["exitCode"] == 0
    (body,) = upstream_bodies(fake, profile)  # one model call per prompt: no title or classifier call
    names = [t["function"]["name"] if "function" in t else t["name"] for t in body["tools"]]
    assert {"bash", "view", "edit"} <= set(names)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("wire", WIRES)
def test_copilot_tool_round_trip(env, tmp_path, wire, profile):
    """The model asks for `view` on the file (arguments streamed in fragments); the CLI reads it and sends the
    result back; the model's answer quotes it."""
    fake = env[profile]
    fake.reset()
    notes = tmp_path / "work" / "notes.txt"
    fake.script([f'tools;tool=view;args={json.dumps({"path": str(notes)})}', "echo_tool_result"])
    proc, events = copilot_p(env, tmp_path, wire, profile, "read notes.txt")
    assert proc.returncode == 0, (proc.stderr[-2000:], proc.stdout[-2000:])
    assert answers(events)[-1] == "Tool said: the secret word is pineapple", proc.stdout[-2000:]
    done = [e["data"] for e in events if e["type"] == "tool.execution_complete"]
    assert [d["success"] for d in done] == [True]
    assert len(upstream_bodies(fake, profile)) == 2  # the call, then the answer with the file's text


@pytest.mark.parametrize("wire", ["chat", "responses"])
def test_copilot_sends_no_output_limit_and_a_profile_default_gives_one(env, tmp_path, wire):
    """On the chat and Responses wires Copilot names no output limit (a small local model then writes until its
    context is full); `default_max_tokens` on the profile gives the request one."""
    fake = env["default"]
    fake.reset()
    proc, _ = copilot_p(env, tmp_path / "plain", wire, "default", "say hi")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (plain,) = upstream_bodies(fake, "default")
    assert "max_tokens" not in plain and "max_completion_tokens" not in plain
    fake.reset()
    proc, _ = copilot_p(env, tmp_path / "capped", wire, "capped", "say hi")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (capped,) = upstream_bodies(fake, "default")
    assert capped["max_tokens"] == LIMIT
