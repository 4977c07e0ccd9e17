"""The real Gemini CLI (npm @google/gemini-cli, pinned in tests/clients/package.json) through coderouterd, headless
(`gemini -p`), with a private HOME holding the README's settings: a plain answer, and a tool round trip in which
the CLI runs its built-in read_file for the model and sends the file back, against a chat-completions upstream
and an Anthropic one.

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
from tests.support.config import local_and_cloud
from tests.support.daemon import running

GEMINI = cli("gemini")

# What the README tells a Gemini CLI user to write in ~/.gemini/settings.json: API-key auth (with only the base
# URL set, `-p` refuses the "gateway" auth type it would pick), a fixed model (no routing-classifier call before
# every turn), and nothing that phones home.
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "model": {"name": "qwen3"},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ide": {"enabled": False},
}


def _skip_reason() -> str | None:
    return skip_reason(GEMINI, "Gemini CLI")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("e2e_gemini_cli")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, FakeServer("anthropic", name="cloud") as cloud:
        with running(local_and_cloud(local.url, cloud.url), tmp) as d:
            yield {"daemon": d, "default": local, "cloud": cloud}


def gemini_p(env, tmp_path: Path, profile: str, prompt: str,
             settings: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS if settings is None else settings))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "notes.txt").write_text("the secret word is pineapple\n")
    child_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "TMPDIR": str(tmp_path),
                 "GOOGLE_GEMINI_BASE_URL": env["daemon"].url, "GEMINI_API_KEY": "local-key",
                 # The profile header, through the CLI's own custom-headers variable.
                 "GEMINI_CLI_CUSTOM_HEADERS": f"x-coderouter-profile:{profile}",
                 "NO_BROWSER": "true", "GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_TELEMETRY_ENABLED": "false",
                 "NO_COLOR": "1"}
    proc = subprocess.run([str(GEMINI), "-p", prompt, "--output-format", "json"], env=child_env, cwd=work,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc, out


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_gemini_cli_plain_answer(env, tmp_path, profile):
    fake = env[profile]
    fake.reset()
    proc, out = gemini_p(env, tmp_path, profile, "say hi")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.get("response") == "Hello from " + ("local" if profile == "default" else "cloud"), proc.stdout[-2000:]
    assert fake.count("/v1/chat/completions" if profile == "default" else "/v1/messages") == 1
    tokens = out["stats"]["models"]["qwen3"]["tokens"]
    assert tokens["prompt"] > 0 and tokens["candidates"] > 0  # usageMetadata reached the CLI's accounting


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_gemini_cli_tool_round_trip(env, tmp_path, profile):
    """The model asks for read_file (arguments streamed in fragments); the CLI reads the file and sends the
    result back as a functionResponse; the model's answer quotes it."""
    fake = env[profile]
    fake.reset()
    fake.script(['tools;tool=read_file;args={"file_path":"notes.txt"}', "echo_tool_result"])
    proc, out = gemini_p(env, tmp_path, profile, "read notes.txt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.get("response") == "Tool said: the secret word is pineapple", proc.stdout[-2000:]
    assert out["stats"]["tools"]["byName"]["read_file"]["success"] == 1
    path = "/v1/chat/completions" if profile == "default" else "/v1/messages"
    turns = [r["json"] for r in fake.requests if r["path"] == path]
    assert len(turns) == 2  # the call, then the answer with the file's text (health probes aside)
    names = [t["function"]["name"] if "function" in t else t["name"] for t in turns[0]["tools"]]
    assert "read_file" in names


@pytest.mark.parametrize("profile", ["default", "cloud"])
def test_gemini_cli_auto_model_asks_its_classifier_through_structured_output(env, tmp_path, profile):
    """Without a model setting the CLI's `auto` model asks its routing classifier first, for JSON by a schema
    written with Gemini's upper-case types: structured output on a chat upstream, a forced tool on an Anthropic
    one. The classifier reads the answer (no "[Routing] ... failed" fallback) and the turn goes on."""
    fake = env[profile]
    fake.reset()
    settings = {k: v for k, v in SETTINGS.items() if k != "model"}
    proc, out = gemini_p(env, tmp_path, profile, "say hi", settings)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.get("response") == "Hello from " + ("local" if profile == "default" else "cloud"), proc.stdout[-2000:]
    assert "[Routing]" not in proc.stderr, proc.stderr[-2000:]
    path = "/v1/chat/completions" if profile == "default" else "/v1/messages"
    classifier, turn = [r["json"] for r in fake.requests if r["path"] == path]
    if profile == "default":
        schema = classifier["response_format"]["json_schema"]["schema"]
        assert schema["type"] == "object" and schema["properties"]["complexity_score"]["type"] == "integer"
    else:
        assert classifier["tool_choice"] == {"type": "tool", "name": "structured_output"}
        assert classifier["tools"][0]["input_schema"]["type"] == "object"
    assert turn["model"] != classifier["model"] or profile == "cloud"  # the classifier's choice was used
