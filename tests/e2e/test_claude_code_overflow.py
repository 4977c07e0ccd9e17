"""Real Claude Code (pinned in tests/clients) against a server that, as vLLM and OpenAI do, refuses a request whose
prompt fits but whose prompt plus max_tokens does not. Claude Code asks for 32,000 output tokens; the daemon must
say so in the Anthropic API's own words ("input length and `max_tokens` exceed context limit: P + M > L"), the one
wording Claude Code lowers max_tokens and retries on, so the session answers with no manual step. Before the fix
it said "prompt is too long: P tokens leave no room for the requested output", which Claude Code cannot act on.

Claude Code's own system prompt and tools are left out (`--bare`, a short system prompt, no tools) so the prompt
is small next to the window: its retry asks for limit - prompt - 1000 tokens, and gives up below 3,000."""

from __future__ import annotations

import os
import subprocess

import orjson
import pytest

from tests.e2e.test_claude_code import CLAUDE, _skip_reason
from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, upstream, warn
from tests.support.daemon import running

WINDOW = 9000  # the fake's max_model_len: Claude Code's 32,000 output tokens never fit, 5,000-odd do


def _claude(url: str, tmp) -> subprocess.CompletedProcess:
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")}
    env.update({
        "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_AUTH_TOKEN": "test-token", "ANTHROPIC_MODEL": "qwen3-coder",
        "ANTHROPIC_SMALL_FAST_MODEL": "qwen3-coder", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "NO_PROXY": "127.0.0.1,localhost",
    })
    env.pop("CLAUDE_CODE_MAX_OUTPUT_TOKENS", None)  # its default output cap (32,000) is the point
    return subprocess.run([str(CLAUDE), "-p", "say hi", "--bare", "--system-prompt", "You are a helpful assistant.",
                           "--tools", "", "--output-format", "json"], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)


def test_claude_code_lowers_max_tokens_when_only_the_output_overflows_and_answers(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with FakeServer("openai", name="vllm", models=["qwen3-coder"], max_model_len=WINDOW) as fake:
        cfg = daemon_config(providers={"vllm": upstream(fake.url, kind="openai")}, profiles={"default": warn("vllm")})
        with running(cfg, tmp_path) as d:
            r = _claude(d.url, tmp_path)
            asked = [req["json"].get("max_tokens") for req in fake.requests if req["path"] == "/v1/chat/completions"]
            detail = f"max_tokens asked: {asked}\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-1500:]}\n" \
                     f"daemon: {d.log()[-1500:]}"
            assert r.returncode == 0, detail
            out = orjson.loads(r.stdout.strip().splitlines()[-1])
            assert out.get("is_error") is False and out.get("result", "").strip(), detail
            # First its default, refused; then the lower figure it computed from our numbers, served.
            assert asked[0] == 32000 and asked[-1] < WINDOW, detail
            assert asked[-1] >= 3000, detail
