"""Real Claude Code (pinned in tests/clients, `make test` runs `npm ci` there) in print mode against the
daemon and a fake local backend that writes its tool calls as streamed text, the way a local model without a
tool-call parser does. Claude Code must run the tool and send its result back; a call quoted in a code fence
must reach the user as text. Claude Code gets a private HOME and config dir, a token, and only the daemon's
loopback URL; non-essential traffic (telemetry, update checks, title generation) is switched off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.fakes.behaviour import TEXT_TOOL_COMMAND
from tests.fakes.runner import FakeServer
from tests.support.clients import cli, skip_reason
from tests.support.config import daemon_config, upstream, warn
from tests.support.daemon import DaemonProcess, running

CLAUDE = cli("claude")


def _skip_reason() -> str | None:
    return skip_reason(CLAUDE, "Claude Code")



EXPECTED_OUTPUT = TEXT_TOOL_COMMAND.removeprefix("echo ")


@pytest.fixture(params=["openai"])
def setup(request, tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    kind = request.param
    with FakeServer(kind, name="local", models=["qwen3-coder"]) as local:
        cfg = daemon_config(providers={"local": upstream(local.url, kind=kind)}, profiles={"default": warn("local")})
        with running(cfg, tmp_path) as d:
            yield d, local, tmp_path


def run_claude(daemon: DaemonProcess, tmp: Path, prompt: str) -> dict:
    home = tmp / "home"
    work = tmp / "work"
    home.mkdir()
    work.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({
        "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": daemon.url, "ANTHROPIC_AUTH_TOKEN": "test-token", "ANTHROPIC_MODEL": "qwen3-coder",
        "ANTHROPIC_SMALL_FAST_MODEL": "qwen3-coder", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "qwen3-coder",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "NO_PROXY": "127.0.0.1,localhost",
    })
    r = subprocess.run([str(CLAUDE), "-p", prompt, "--allowedTools", "Bash", "--output-format", "json"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"claude exited {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}" \
                              f"\ndaemon: {daemon.log()[-2000:]}"
    return orjson.loads(r.stdout.strip().splitlines()[-1])


def _generations(fake: FakeServer) -> list[dict]:
    return [r["json"] for r in fake.requests if r["path"] in ("/v1/chat/completions", "/v1/messages")]


def _tool_results(fake: FakeServer) -> list[str]:
    """Tool results sent back, from OpenAI `tool` messages or Anthropic `tool_result` blocks."""
    out = []
    for body in _generations(fake):
        for m in body.get("messages") or ():
            if m.get("role") == "tool":
                out.append(orjson.dumps(m.get("content")).decode())
            elif m.get("role") == "user" and isinstance(m.get("content"), list):
                out += [orjson.dumps(b.get("content")).decode() for b in m["content"]
                        if isinstance(b, dict) and b.get("type") == "tool_result"]
    return out


@pytest.mark.parametrize("fmt", ["hermes", "qwen_xml"])
def test_claude_code_runs_a_tool_call_written_as_streamed_text(setup, fmt):
    daemon, local, tmp = setup
    local.set_behaviour(f"text_tools;format={fmt};split=3")
    result = run_claude(daemon, tmp, "Run `echo repaired-ok` with the Bash tool and tell me what it printed.")
    gens = _generations(local)
    # Streaming all the way: the repair never replays a streamed request upstream without streaming. Claude Code
    # itself retries a stream it gave up on (on a loaded machine) as a non-streaming request; those are the
    # client's own, and the journal says so. Every non-streaming request upstream must be one of them.
    daemon.stop()
    from coderouterd.state.journal_reader import journal_rows

    client_non_streaming = sum(not row["streaming"] for row in journal_rows(daemon.state_dir / "state.db"))
    assert sum(not body.get("stream") for body in gens) == client_non_streaming, [b.get("stream") for b in gens]
    assert gens and gens[0].get("stream")
    assert any(EXPECTED_OUTPUT in t for t in _tool_results(local)), _tool_results(local)
    assert f"The tool said: {EXPECTED_OUTPUT}" in result["result"]
    assert not result.get("is_error")


@pytest.mark.parametrize("setup", ["anthropic"], indirect=True)
def test_claude_code_through_an_anthropic_wire_local_backend(setup):
    """LM Studio and llama.cpp also speak the Messages API: the same repair on the Anthropic wire."""
    daemon, local, tmp = setup
    local.set_behaviour("text_tools;format=hermes;split=3")
    result = run_claude(daemon, tmp, "Run `echo repaired-ok` with the Bash tool and tell me what it printed.")
    assert any(EXPECTED_OUTPUT in t for t in _tool_results(local)), _tool_results(local)
    assert f"The tool said: {EXPECTED_OUTPUT}" in result["result"]


def test_claude_code_shows_a_quoted_call_as_text(setup):
    daemon, local, tmp = setup
    local.set_behaviour("text_tools;format=quoted;split=3")
    result = run_claude(daemon, tmp, "How does a tool call look? Do not run anything.")
    assert _tool_results(local) == []
    assert "<tool_call>" in result["result"] and "Nothing was run." in result["result"]
