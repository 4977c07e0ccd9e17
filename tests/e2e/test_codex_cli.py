"""The real Codex CLI (npm @openai/codex, pinned in tests/clients/package.json) through coderouterd: `codex exec`
with a private CODEX_HOME holding the README's config, against an OpenAI-compatible and an Anthropic upstream,
a plain answer and a tool loop in which Codex runs the command the model asked for and sends its output back.

`make test` installs the CLI with `npm ci` in tests/clients; only when npm could not reach its registry is this
module skipped (the reason is in tests/clients/.npm-unavailable)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fakes.runner import FakeServer
from tests.support.clients import cli, skip_reason
from tests.support.config import local_and_cloud
from tests.support.daemon import running

CODEX = cli("codex")


def _skip_reason() -> str | None:
    return skip_reason(CODEX, "Codex CLI")



# What the README tells a Codex user to write, plus the profile header and no client-side retries (a failure
# must show as a failure here, not as five reconnects).
CODEX_CONFIG = """
model = "qwen3"
model_provider = "coderouter"

[model_providers.coderouter]
name = "coderouter"
base_url = "@URL@/v1"
wire_api = "responses"
env_key = "CODEROUTER_KEY"
request_max_retries = 0
stream_max_retries = 0
http_headers = { "x-coderouter-profile" = "@PROFILE@" }
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("e2e_codex")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, FakeServer("anthropic", name="cloud") as cloud:
        with running(local_and_cloud(local.url, cloud.url), tmp) as d:
            yield {"daemon": d, "default": local, "cloud": cloud}


def codex_exec(env, tmp_path: Path, profile: str, prompt: str) -> tuple[subprocess.CompletedProcess, str]:
    home = tmp_path / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(CODEX_CONFIG.replace("@URL@", env["daemon"].url).replace("@PROFILE@", profile))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    out = tmp_path / "last-message.txt"
    child_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CODEX_HOME": str(home),
                 "CODEROUTER_KEY": "local-key", "NO_COLOR": "1"}
    proc = subprocess.run([str(CODEX), "exec", "--skip-git-repo-check", "-o", str(out), prompt], env=child_env,
                          cwd=work, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    return proc, out.read_text() if out.exists() else ""


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_codex_exec_plain_answer(env, tmp_path, profile):
    fake = env[profile]
    fake.reset()
    proc, last = codex_exec(env, tmp_path, profile, "say hi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last.strip() == "Hello from " + ("local" if profile == "default" else "cloud")
    gens = [r for r in fake.requests if r["method"] == "POST"]
    assert len(gens) == 1
    body = gens[0]["json"]
    if profile == "default":
        assert body["messages"][0]["role"] == "system"  # Codex's developer items became the system prompt
        names = [t["function"]["name"] for t in body["tools"]]
    else:
        assert body["system"]
        names = [t["name"] for t in body["tools"]]
    assert "exec_command" in names and "web_search" not in names


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_codex_exec_tool_loop(env, tmp_path, profile):
    fake = env[profile]
    fake.reset()
    # First turn: the model asks for exec_command; second turn: it quotes the tool output Codex sent back.
    fake.script(["tools;tool=exec_command;cmd=echo coderouter-tool-ok", "echo_tool_result"])
    proc, last = codex_exec(env, tmp_path, profile, "run the echo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last.startswith("Tool said:") and "coderouter-tool-ok" in last, last
    gens = [r for r in fake.requests if r["method"] == "POST"]
    assert len(gens) == 2
    second = gens[1]["json"]["messages"]
    if profile == "default":
        call = second[-2]["tool_calls"][0]
        assert call["function"]["name"] == "exec_command"
        assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == call["id"]
    else:
        use = [b for b in second[-2]["content"] if b["type"] == "tool_use"][0]
        result = [b for b in second[-1]["content"] if b["type"] == "tool_result"][0]
        assert use["name"] == "exec_command" and result["tool_use_id"] == use["id"]
