"""The real Gemini CLI through coderouterd to a Gemini API upstream (`kind = "gemini"`, the fake Gemini server):
the pass-through end to end. A tool round trip with the CLI's own read_file, where the upstream refuses a function
call sent back without the thoughtSignature it gave it (as Gemini 3 does): the CLI's second turn gets through only
if the signature went to the CLI and came back untouched.

Skipped, like tests/e2e/test_gemini_cli.py, only when npm could not install the CLI."""

from __future__ import annotations

import pytest

from tests.e2e.test_gemini_cli import _skip_reason, gemini_p
from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, warn
from tests.support.daemon import running

KEY_ENV = "CODEROUTER_TEST_GEMINI_KEY"
KEY = "AIza-cli-upstream"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("e2e_gemini_cli_upstream")
    with FakeServer("gemini", name="gem", models=["qwen3"], api_key=KEY) as gem:
        config = daemon_config(providers={"gem": {"kind": "gemini", "base_url": gem.url, "api_key_env": KEY_ENV}},
                               profiles={"default": warn("gem")})
        with running(config, tmp, env={KEY_ENV: KEY}) as d:
            yield {"daemon": d, "default": gem}


def test_gemini_cli_tool_round_trip_keeps_the_signature(env, tmp_path):
    gem = env["default"]
    gem.reset()
    gem.fake.state.script(['tools;tool=read_file;args={"file_path":"notes.txt"}', "echo_tool_result"])
    proc, out = gemini_p(env, tmp_path, "default", "read notes.txt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.get("response") == "Tool said: the secret word is pineapple", proc.stdout[-2000:]
    turns = [r for r in gem.requests if r["path"].endswith(("generateContent", "streamGenerateContent"))]
    assert len(turns) == 2 and all(t["headers"]["x-goog-api-key"] == KEY for t in turns)
    assert all(t["path"] == "/v1beta/models/qwen3:streamGenerateContent" and t["query"] == "alt=sse" for t in turns)
    call_turn = next(c for c in turns[1]["json"]["contents"] if c["role"] == "model")
    call = next(p for p in call_turn["parts"] if "functionCall" in p)
    assert call["thoughtSignature"] == gem.fake.sign("read_file", {"file_path": "notes.txt"})
    assert out["stats"]["tools"]["byName"]["read_file"]["success"] == 1
