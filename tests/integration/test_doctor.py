"""`corectl doctor` against the fake backends: verdicts, suggestions and exit codes."""

import asyncio

import orjson
import pytest
from typer.testing import CliRunner

from coderouterd.config import parse_config_text
from corectl.doctor import DoctorError, Limits, doctor_app, exit_code, run_doctor
from tests.fakes.runner import FakeServer
from tests.support.ports import dead_port

FAST = Limits(probe=2.0, generation=5.0)


def provider_toml(name: str, base_url: str, kind: str = "openai", extra: str = "", **keys: str | int) -> str:
    lines = [f"[providers.{name}]", f'kind = "{kind}"', f'base_url = "{base_url}"', extra]
    lines += [f"{key} = {orjson.dumps(value).decode()}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def config(*providers: str) -> str:
    first = providers[0].split("]")[0].removeprefix("[providers.")
    return "".join(providers) + f'[profiles.default]\nproviders = ["{first}"]\n'


def doctor(text: str, names: list[str] | None = None, limits: Limits = FAST) -> list[dict]:
    return asyncio.run(run_doctor(parse_config_text(text, "test.toml"), names, limits=limits))


def checks(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


def generation_requests(server: FakeServer, path: str = "/v1/chat/completions") -> list[dict]:
    return [r["json"] for r in server.requests if r["path"] == path]


def test_tool_calling_llamacpp_backend_is_ok():
    with FakeServer("openai", behaviour="tools", models=["qwen"], n_ctx=32768) as s:
        [result] = doctor(config(provider_toml("local", s.url + "/v1", model="qwen", context_window=32768)))
        bodies = generation_requests(s)
    c = checks(result)
    assert result["backend"] == "llama.cpp"
    assert [x["name"] for x in result["checks"]] == ["reachable", "auth", "model", "generation", "streaming",
                                                     "tools", "vision", "thinking", "context"]
    assert all(x["status"] == "ok" for x in result["checks"]), result["checks"]
    assert "structured tool call get_current_time" in c["tools"]["message"]
    assert "repair not needed" in c["tools"]["message"]
    assert "32768" in c["context"]["message"]
    assert exit_code([result]) == 0
    tool_body = next(b for b in bodies if b.get("tools"))
    assert tool_body["tool_choice"] == "required"
    assert tool_body["tools"][0]["function"]["name"] == "get_current_time"
    stream_body = next(b for b in bodies if b.get("stream"))
    assert stream_body["stream_options"] == {"include_usage": True}
    assert all(b["model"] == "qwen" and b["max_tokens"] <= 256 for b in bodies)


def test_plain_text_answer_to_tools_needs_tuning():
    with FakeServer("openai", behaviour="text_only_for_tools", models=["qwen"], n_ctx=32768) as s:
        [result] = doctor(config(provider_toml("local", s.url + "/v1", model="qwen")))
    tools = checks(result)["tools"]
    assert tools["status"] == "warn"
    assert "plain text" in tools["message"]
    assert "--jinja" in tools["suggestion"] and "capabilities.tools = false" in tools["suggestion"]
    assert checks(result)["generation"]["status"] == "ok"
    assert exit_code([result]) == 2


@pytest.mark.parametrize("fmt,shown", [("hermes", "hermes"), ("qwen_xml", "qwen_xml"), ("mistral", "mistral")])
def test_tool_calls_written_as_text_name_the_format_and_the_repair(fmt, shown):
    with FakeServer("openai", behaviour=f"text_tools;format={fmt}", models=["qwen"], n_ctx=32768) as s:
        [local] = doctor(config(provider_toml("local", s.url + "/v1", model="qwen")))
        [off] = doctor(config(provider_toml("local", s.url + "/v1", model="qwen", tool_repair="off")))
    tools = checks(local)["tools"]
    assert tools["status"] == "ok"
    assert f"as text ({shown} format)" in tools["message"] and "repair is needed and on" in tools["message"]
    tools = checks(off)["tools"]
    assert tools["status"] == "warn" and "repair is off" in tools["message"]
    assert 'tool_repair = "on"' in tools["suggestion"]


def test_a_quoted_call_is_not_taken_for_a_text_call():
    with FakeServer("openai", behaviour="text_tools;format=quoted", models=["qwen"], n_ctx=32768) as s:
        [result] = doctor(config(provider_toml("local", s.url + "/v1", model="qwen")))
    assert checks(result)["tools"]["status"] == "warn" and "plain text" in checks(result)["tools"]["message"]


def test_thinking_model_answering_only_reasoning_is_ok_with_a_note():
    with FakeServer("lmstudio", behaviour="all_reasoning", models=["r1"], context_length=32768) as s:
        [result] = doctor(config(provider_toml("lms", s.url + "/v1", model="r1", context_window=32768)))
    c = checks(result)
    assert result["backend"] == "lmstudio"
    assert c["thinking"]["status"] == "ok"
    assert "reasoning consumed the budget" in c["thinking"]["message"]
    assert "raise max_tokens" in c["thinking"]["message"]
    assert c["generation"]["status"] == "ok" and "raise max_tokens" in c["generation"]["message"]
    # A tool probe eaten by reasoning proves nothing either way: no false alarm.
    assert c["tools"]["status"] == "skip"
    assert c["context"]["status"] == "ok" and "loaded instance" in c["context"]["message"]
    assert exit_code([result]) == 0


def test_ollama_default_4k_context_needs_tuning():
    with FakeServer("ollama", behaviour="tools", models=["qwen3:30b"], context_length=4096) as s:
        [result] = doctor(config(provider_toml("ollama", s.url, kind="ollama", model="qwen3:30b")))
        tool_body = next(b for b in generation_requests(s) if b.get("tools"))
    ctx = checks(result)["context"]
    assert ctx["status"] == "warn"
    assert "4096" in ctx["message"]
    assert "PARAMETER num_ctx 32768" in ctx["suggestion"] and "OLLAMA_CONTEXT_LENGTH" in ctx["suggestion"]
    assert checks(result)["tools"]["status"] == "ok"
    assert "tool_choice" not in tool_body  # Ollama does not support it
    assert exit_code([result]) == 2


def test_ollama_behind_openai_url_with_a_large_window_is_ok():
    with FakeServer("ollama", models=["qwen3"], context_length=32768) as s:
        [result] = doctor(config(provider_toml("ollama", s.url + "/v1", model="qwen3", context_window=32768)))
    c = checks(result)
    assert result["backend"] == "ollama"
    assert "not loaded yet" in c["model"]["message"]
    assert c["context"]["status"] == "ok" and "/api/ps" in c["context"]["message"]


def test_configured_window_larger_than_real_needs_tuning():
    with FakeServer("openai", behaviour="tools", models=["m"], n_ctx=32768) as s:
        [result] = doctor(config(provider_toml("local", s.url + "/v1", model="m", context_window=131072)))
    ctx = checks(result)["context"]
    assert ctx["status"] == "warn"
    assert "context_window = 32768" in ctx["suggestion"]
    assert exit_code([result]) == 2


def test_unreachable_provider_exits_1_and_others_are_still_probed():
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    with FakeServer("openai", behaviour="tools", models=["m"], n_ctx=32768) as s:
        results = doctor(config(provider_toml("up", s.url + "/v1", model="m", context_window=32768),
                                provider_toml("down", dead, model="m")))
    by_name = {r["provider"]: r for r in results}
    assert checks(by_name["down"])["reachable"]["status"] == "fail"
    assert all(c["status"] == "skip" for c in by_name["down"]["checks"][1:])
    assert all(c["status"] == "ok" for c in by_name["up"]["checks"])
    assert exit_code(results) == 1


def test_hanging_provider_is_unreachable_within_the_probe_timeout():
    with FakeServer("openai", behaviour="hang", models=["m"]) as s:
        [result] = doctor(config(provider_toml("stuck", s.url + "/v1", model="m")),
                          limits=Limits(probe=0.3, generation=0.5))
    reachable = checks(result)["reachable"]
    assert reachable["status"] == "fail" and "within 0.3s" in reachable["message"]
    assert exit_code([result]) == 1


def test_rejected_key_names_the_env_var(monkeypatch):
    monkeypatch.delenv("DOCTOR_TEST_KEY", raising=False)
    with FakeServer("openai", behaviour="401", models=["m"]) as s:
        [result] = doctor(config(provider_toml("cloud", s.url + "/v1", model="m", api_key_env="DOCTOR_TEST_KEY")))
    auth = checks(result)["auth"]
    assert auth["status"] == "fail" and "401" in auth["message"]
    assert "DOCTOR_TEST_KEY" in auth["suggestion"]
    assert exit_code([result]) == 2


def test_missing_model_suggests_a_pull():
    with FakeServer("ollama", models=["llama3"]) as s:
        [result] = doctor(config(provider_toml("ollama", s.url, kind="ollama", model="qwen3:30b")))
    model = checks(result)["model"]
    assert model["status"] == "fail"
    assert "ollama pull qwen3:30b" in model["suggestion"] and "llama3" in model["suggestion"]


def test_anthropic_provider_tools_and_key(monkeypatch):
    monkeypatch.setenv("DOCTOR_ANTHROPIC_KEY", "sk-test")
    with FakeServer("anthropic", behaviour="tools", models=["claude-x"]) as s:
        [result] = doctor(config(provider_toml("claude", s.url + "/v1", kind="anthropic", model="claude-x",
                                               api_key_env="DOCTOR_ANTHROPIC_KEY")))
        bodies = generation_requests(s, "/v1/messages")
        assert s.saw_api_key
    c = checks(result)
    assert c["tools"]["status"] == "ok" and c["streaming"]["status"] == "ok"
    assert "message_stop" in c["streaming"]["message"]
    assert c["auth"]["message"] == "key from $DOCTOR_ANTHROPIC_KEY accepted"
    assert c["context"]["status"] == "skip"
    assert next(b for b in bodies if b.get("tools"))["tool_choice"] == {"type": "any"}
    assert exit_code([result]) == 0


def test_inline_think_tags_are_recognised():
    with FakeServer("openai", behaviour="reasoning;think_tags=1", models=["m"], n_ctx=32768) as s:
        [result] = doctor(config(provider_toml("local", s.url + "/v1", model="m", context_window=32768,
                                               extra="capabilities = { tools = false }")))
    c = checks(result)
    assert c["thinking"]["status"] == "ok" and "<think>" in c["thinking"]["message"]
    assert "--reasoning-format deepseek" in c["thinking"]["suggestion"]
    assert "<think>" not in c["generation"]["message"]
    assert c["tools"]["status"] == "skip" and "capabilities.tools = false" in c["tools"]["message"]


def test_empty_model_probes_the_first_listed_one():
    with FakeServer("openai", models=["first", "second"], n_ctx=32768) as s:
        [result] = doctor(config(provider_toml("any", s.url + "/v1")))
        bodies = generation_requests(s)
    assert result["model"] == "first"
    assert {b["model"] for b in bodies} == {"first"}


def test_unknown_provider_is_refused():
    with pytest.raises(DoctorError, match="known: a"):
        doctor(config(provider_toml("a", "http://127.0.0.1:1/v1")), ["nope"])


def test_cli_json_and_exit_codes(tmp_path):
    with FakeServer("openai", behaviour="text_only_for_tools", models=["m"], n_ctx=32768) as s:
        path = tmp_path / "config.toml"
        path.write_text(config(provider_toml("local", s.url + "/v1", model="m", context_window=32768)))
        runner = CliRunner()
        result = runner.invoke(doctor_app, ["local", "--config", str(path), "--json"])
        human = runner.invoke(doctor_app, ["--config", str(path)])
        unknown = runner.invoke(doctor_app, ["nope", "--config", str(path)])
    assert result.exit_code == 2, result.output
    data = orjson.loads(result.stdout)
    assert data["exit_code"] == 2 and data["ok"] is False
    assert data["providers"][0]["provider"] == "local"
    assert human.exit_code == 2
    assert "NEEDS TUNING" in human.stdout and "capabilities.tools = false" in human.stdout
    assert unknown.exit_code == 1 and "unknown provider nope" in unknown.output


def test_cli_invalid_config_exits_1(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[providers.x]\nkind = 'openai'\n")
    result = CliRunner().invoke(doctor_app, ["--config", str(path), "--json"])
    assert result.exit_code == 1
    assert orjson.loads(result.stdout)["ok"] is False


@pytest.mark.parametrize("server_vision, declared, status, words", [
    (True, "", "ok", "set capabilities.vision = true"),
    (False, "", "warn", "set capabilities.vision = false"),
    (False, "capabilities = { vision = false }", "ok", "replaced by a short note"),
    (True, "capabilities = { vision = false }", "warn", "set capabilities.vision = true"),
])
def test_vision_probe_sends_a_png_and_says_which_value_to_set(server_vision, declared, status, words):
    with FakeServer("openai", behaviour="tools", models=["m"], n_ctx=32768, vision=server_vision) as s:
        (result,) = doctor(config(provider_toml("p", s.url + "/v1", extra=declared)))
        sent = [r for r in generation_requests(s) if isinstance(r["messages"][0]["content"], list)]
    v = checks(result)["vision"]
    assert v["status"] == status
    assert words in v["message"] + " " + v["suggestion"]
    assert sent and sent[0]["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_gemini_backend_is_asked_in_its_own_wire(monkeypatch):
    """A kind = "gemini" provider: the probes go to Google's URLs with the key header, as Gemini requests, and
    every check reads the answers (the model from models.list, the window from models.get)."""
    monkeypatch.setenv("DOCTOR_GEMINI_KEY", "AIza-doctor")
    with FakeServer("gemini", behaviour="tools", models=["gemini-2.5-flash"], api_key="AIza-doctor",
                    input_limit=1048576) as s:
        [result] = doctor(config(provider_toml("gem", s.url, kind="gemini", model="gemini-2.5-flash",
                                               api_key_env="DOCTOR_GEMINI_KEY")))
        paths = [r["path"] + ("?" + r["query"] if r["query"] else "") for r in s.requests]
        bodies = [r["json"] for r in s.requests if r["path"].endswith("Content")]
    c = checks(result)
    for name in ("reachable", "auth", "model", "generation", "streaming", "tools"):
        assert c[name]["status"] == "ok", c[name]
    assert "ended with a finishReason" in c["streaming"]["message"]
    assert "/v1beta/models/gemini-2.5-flash:generateContent" in paths
    assert "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse" in paths
    tool_body = next(b for b in bodies if b.get("tools"))
    assert tool_body["tools"][0]["functionDeclarations"][0]["name"] == "get_current_time"
    assert tool_body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
