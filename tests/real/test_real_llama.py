"""coderouterd with a real llama.cpp llama-server (SmolLM2-135M, built by `make real-llama`) as a managed
process: supervision and readiness, every ingress through official SDKs and real CLIs, the usage it journals,
context limits, tool calls, and a kill -9 in the middle of a stream.

One daemon and one server serve the whole module (loading the model and the clients is the slow part); the
fault test runs last because it restarts the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import anthropic
import httpx
import openai
import orjson
import pytest

from coderouterd.state.journal_reader import journal_rows
from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.daemon import DaemonProcess, free_port
from tests.support.ports import dead_port
from tests.support.real_llama import paths, server_argv
from tests.support.wait import wait_for

# A real model on two CPU cores: each test here takes tens of seconds when the machine is idle, and several times
# that when it is not. The suite-wide 120 s guard is for tests that should be instant.
pytestmark = pytest.mark.timeout(900)

SLOTS = 3
CTX = 4096  # tokens per slot: Codex's smallest request is about 2,000 tokens
MODEL = "smollm2"

CONFIG = """
[server]
port = {PORT}

[providers.llama]
kind = "openai"
base_url = "http://127.0.0.1:@LP@/v1"
model = "@MODEL@"
timeouts = { connect = 5, first_byte = 120, idle = 60, total = 300 }

[providers.llama.process]
command = @ARGV@
ready_url = "http://127.0.0.1:@LP@/health"
start_timeout_s = 60
startsecs = 0.2

[providers.big]
kind = "openai"
base_url = "@BIG@/v1"

[profiles.default]
providers = ["llama"]
health_action = "warn"

[profiles.chain]
providers = ["llama", "big"]
health_action = "warn"
"""


def managed_config(port: int, big_url: str = "http://127.0.0.1:9") -> str:
    p = paths()
    # Greedy decoding by default (clients that send no temperature, as Claude Code's main calls): the small
    # model then answers the same way every run, so a chatty answer cannot make a client test flaky.
    argv = server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], port, slots=SLOTS, ctx_per_slot=CTX,
                       extra=("--temp", "0"))
    # --slot-save-path is added by coderouterd itself (affinity.manage_slot_save), under its state directory.
    return (CONFIG.replace("@LP@", str(port)).replace("@ARGV@", json.dumps(argv))
            .replace("@MODEL@", MODEL).replace("@BIG@", big_url))


class Env:
    def __init__(self, daemon: DaemonProcess, llama_port: int) -> None:
        self.d = daemon
        self.llama_url = f"http://127.0.0.1:{llama_port}"
        self.first_answer: anthropic.types.Message | None = None
        self.big: FakeServer | None = None

    def admin(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.d.state_dir / "coderouterd.sock")),
                            base_url="http://coderouterd", timeout=30)

    def process(self) -> dict:
        with self.admin() as a:
            procs = a.get("/v1/processes").json()["processes"]
        return procs[0] if isinstance(procs, list) else next(iter(procs.values()))

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.d.url, api_key="x", max_retries=0, timeout=120)

    def corectl(self, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
        env.update({"COLUMNS": "200", "CODEROUTER_SOCKET": str(self.d.state_dir / "coderouterd.sock"),
                    "CODEROUTER_STATE_DIR": str(self.d.state_dir), "XDG_CONFIG_HOME": str(self.d.tmp / "xdg")})
        argv = [*args, "--config", str(self.d.config_path)] if args[0] in ("doctor",) else list(args)
        return cli.corectl(argv, env=env, timeout=300)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    paths()  # skips with the reason when the real server could not be had
    tmp = tmp_path_factory.mktemp("real_llama")
    port = free_port()
    big = FakeServer("openai", name="big").start()  # a provider with a large window behind the small server
    d = DaemonProcess(managed_config(port, big.url), tmp)
    d.start()
    e = Env(d, port)
    e.big = big
    try:
        # The very first request goes out while llama-server is still starting and loading its model: it waits
        # for readiness instead of failing.
        e.first_answer = e.anthropic().messages.create(
            model="claude-sonnet-5", max_tokens=8, messages=[{"role": "user", "content": "Say hi."}])
        yield e
    finally:
        d.stop()
        big.stop()


def test_a_request_sent_while_the_model_loads_waits_for_it(env):
    msg = env.first_answer
    assert msg is not None and msg.content and msg.content[0].type == "text"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    assert env.process()["state"] == "ready"


def test_status_models_and_doctor_show_the_real_model_its_context_and_slots(env):
    status = env.corectl("status")
    assert status.returncode == 0, status.stderr
    assert "llama" in status.stdout and "ready" in status.stdout.lower()
    with env.admin() as a:
        providers = a.get("/v1/providers").json()
    text = orjson.dumps(providers).decode()
    assert f'"total":{SLOTS}' in text.replace(" ", "")  # the slot table discovered from the real server
    models = env.corectl("models", "list")
    assert models.returncode == 0, models.stderr + models.stdout
    assert "SmolLM2" in models.stdout or MODEL in models.stdout or "smollm" in models.stdout.lower()
    doctor = env.corectl("doctor")
    assert "llama" in doctor.stdout, doctor.stdout + doctor.stderr
    assert str(CTX) in doctor.stdout.replace(",", ""), doctor.stdout  # the context window of one slot


def test_anthropic_and_openai_ingresses_stream_and_not(env):
    client = env.anthropic()
    msg = client.messages.create(model="claude-sonnet-5", max_tokens=8,
                                 messages=[{"role": "user", "content": "Name a colour."}])
    assert msg.content[0].type == "text" and msg.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(model="claude-sonnet-5", max_tokens=8,
                                messages=[{"role": "user", "content": "Name a fruit."}]) as st:
        text = "".join(st.text_stream)
        final = st.get_final_message()
    assert final.usage.output_tokens > 0 and isinstance(text, str)
    oa = openai.OpenAI(base_url=env.d.url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = oa.chat.completions.create(model="any", max_tokens=8, messages=[{"role": "user", "content": "Count to 3."}])
    assert r.choices[0].message.content is not None and r.usage.prompt_tokens > 0
    chunks = list(oa.chat.completions.create(model="any", max_tokens=8, stream=True,
                                             stream_options={"include_usage": True},
                                             messages=[{"role": "user", "content": "Count to 4."}]))
    assert any(c.usage for c in chunks)


def test_the_journal_holds_the_usage_the_server_reported(env):
    oa = openai.OpenAI(base_url=env.d.url + "/v1", api_key="x", max_retries=0, timeout=120)
    raw = oa.chat.completions.with_raw_response.create(
        model="any", max_tokens=6, messages=[{"role": "user", "content": "Spell the word journal."}])
    r = raw.parse()
    rid = raw.headers["x-request-id"]
    client = env.anthropic()
    araw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=6,
                                                    messages=[{"role": "user", "content": "Spell the word usage."}])
    a = araw.parse()
    arid = araw.headers["request-id"] if "request-id" in araw.headers else araw.headers["x-request-id"]
    rows: dict[str, dict] = {}
    deadline = time.monotonic() + 30  # a ceiling: the journal's writer flushes every 250 ms
    while time.monotonic() < deadline and not (rid in rows and arid in rows):
        rows = {row["request_id"]: row for row in journal_rows(env.d.state_dir / "state.db")}
        time.sleep(0.2)
    row = rows[rid]
    # The OpenAI ingress relays the server's own usage: the journal must hold exactly that.
    cached = (r.usage.prompt_tokens_details.cached_tokens or 0) if r.usage.prompt_tokens_details else 0
    assert row["input_tokens"] + (row["cache_read_tokens"] or 0) == r.usage.prompt_tokens
    assert (row["cache_read_tokens"] or 0) == cached
    assert row["output_tokens"] == r.usage.completion_tokens
    arow = rows[arid]
    assert arow["input_tokens"] == a.usage.input_tokens and arow["output_tokens"] == a.usage.output_tokens
    assert (arow["cache_read_tokens"] or 0) == (a.usage.cache_read_input_tokens or 0)
    # ... and the server's own count for that request agrees: the slot that served it last holds its prompt and
    # all but the last generated token (tests/real/test_llama_contract.py).
    with httpx.Client(base_url=env.llama_url) as http:
        slots = [s for s in http.get("/slots").json() if "id_task" in s]
    last = max(slots, key=lambda s: s["id_task"])
    assert last["n_prompt_tokens"] == a.usage.input_tokens + (a.usage.cache_read_input_tokens or 0) \
        + a.usage.output_tokens - 1


def test_a_prompt_over_the_slot_context_is_prompt_too_long_with_the_servers_numbers(env):
    long = " ".join(f"word{i}" for i in range(4000))
    with pytest.raises(anthropic.BadRequestError) as e:
        env.anthropic().messages.create(model="claude-sonnet-5", max_tokens=8,
                                        messages=[{"role": "user", "content": long}])
    err = e.value.body["error"]
    assert err["type"] == "invalid_request_error"
    import re

    m = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", err["message"])
    assert m, err["message"]
    assert int(m.group(1)) > CTX and int(m.group(2)) == CTX


def test_the_window_read_from_the_server_sends_an_oversize_prompt_past_it_untried(env):
    long = " ".join(f"word{i}" for i in range(4000))
    with httpx.Client(base_url=env.llama_url) as http:
        before = {s["id"]: s.get("id_task") for s in http.get("/slots").json()}
    env.big.reset()
    raw = env.anthropic().messages.with_raw_response.create(
        model="claude-sonnet-5", max_tokens=8, messages=[{"role": "user", "content": long}],
        extra_headers={"x-coderouter-profile": "chain"})
    assert raw.headers["x-coderouter-provider"] == "big"
    assert raw.headers["x-coderouter-attempts"].startswith("llama:skipped:context"), raw.headers
    with httpx.Client(base_url=env.llama_url) as http:
        after = {s["id"]: s.get("id_task") for s in http.get("/slots").json()}
    assert after == before  # the small server never saw it


def test_tool_schemas_the_template_never_renders_do_not_send_a_fitting_prompt_elsewhere(env):
    """SmolLM2's chat template renders no tool schemas: ~40 KB of them put the estimate far over the 4,096-token
    slot, but the server’s own count (/apply-template + /tokenize) is a few dozen tokens, so it serves."""
    tools = [{"name": f"tool_{i}", "description": "Does one careful thing. " * 40,
              "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}}} for i in range(40)]
    body = {"model": "claude-sonnet-5", "max_tokens": 8, "tools": tools,
            "messages": [{"role": "user", "content": "Say hi."}]}
    assert len(json.dumps(body)) / 4 > CTX
    r = httpx.post(env.d.url + "/v1/messages", json=body, headers={"x-coderouter-profile": "chain"}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["x-coderouter-provider"] == "llama", r.headers["x-coderouter-attempts"]
    assert r.json()["usage"]["input_tokens"] < CTX  # what the server counted, as it reported it


TOOL = {"name": "get_weather", "description": "Get the current weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.mark.parametrize("forced", [False, True])
def test_tool_calls_reach_the_client_as_well_formed_blocks(env, forced):
    kw = {"tool_choice": {"type": "tool", "name": "get_weather"}} if forced else {}
    msg = env.anthropic().messages.create(
        model="claude-sonnet-5", max_tokens=48, tools=[TOOL],
        messages=[{"role": "user", "content": "What is the weather in Paris? Use the tool."}], **kw)
    kinds = [b.type for b in msg.content]
    print(f"\nforced={forced}: the model answered {kinds}, stop_reason={msg.stop_reason}: "
          + "; ".join(repr(b.input) if b.type == "tool_use" else repr(b.text[:80]) for b in msg.content))
    assert kinds and set(kinds) <= {"text", "tool_use"}
    for b in msg.content:
        if b.type == "tool_use":
            assert b.name == "get_weather" and isinstance(b.input, dict) and b.id
    if "tool_use" in kinds:
        assert msg.stop_reason == "tool_use"
    # What SmolLM2 does, recorded: its chat template has no tool-call format, so llama-server (with --jinja)
    # applies no tool grammar even for tool_choice "required" (the named choice is sent as "required" with that
    # tool alone: llama-server reads tool_choice only as a string), and the model answers in text, which must
    # still arrive as well-formed text blocks.


def test_claude_code_says_hi_through_the_real_model(env, tmp_path):
    from tests.e2e.test_claude_code import CLAUDE, _skip_reason

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    home.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    child = {k: v for k, v in os.environ.items() if k in keep}
    child.update({
        "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": env.d.url,
        "ANTHROPIC_AUTH_TOKEN": "test-token", "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "NO_PROXY": "127.0.0.1,localhost",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
    })
    # Claude Code's own system prompt and tools run to ~20k tokens, ten times what a slot of this 135M model
    # holds: a short system prompt and no tools make the same request shape fit. The output cap is roomy: an
    # answer that reaches it is an error to Claude Code, which then asks again.
    r = subprocess.run([str(CLAUDE), "-p", "say hi", "--bare", "--system-prompt", "You are a helpful assistant.",
                        "--tools", "", "--output-format", "json"], env=child, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out.get("is_error") is False and out.get("result", "").strip(), out


def test_claude_code_asking_more_output_than_the_slot_holds_still_answers(env, tmp_path):
    """Claude Code's default output cap (32,000 tokens) is eight times this slot's whole context: the prompt fits,
    prompt plus max_tokens does not. The real llama-server does not refuse that (measured: it generates until the
    slot is full and says finish_reason "length"), so coderouterd must not either: the session answers at once.
    Servers that do refuse it (vLLM, OpenAI) are answered in the Anthropic API's own wording, which Claude Code
    lowers max_tokens on (tests/e2e/test_claude_code_overflow.py)."""
    from tests.e2e.test_claude_code import CLAUDE, _skip_reason

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    home.mkdir()
    child = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")}
    child.update({
        "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": env.d.url,
        "ANTHROPIC_AUTH_TOKEN": "test-token", "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "NO_PROXY": "127.0.0.1,localhost",
    })
    r = subprocess.run([str(CLAUDE), "-p", "say hi", "--bare", "--system-prompt", "You are a helpful assistant.",
                        "--tools", "", "--output-format", "json"], env=child, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out.get("is_error") is False and out.get("result", "").strip(), out
    assert out["modelUsage"][MODEL]["maxOutputTokens"] > CTX  # it did ask for more than the slot holds


def test_codex_exec_through_the_real_model(env, tmp_path):
    from tests.e2e.test_codex_cli import CODEX, CODEX_CONFIG, _skip_reason

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "codex-home"
    home.mkdir()
    instructions = tmp_path / "instructions.md"
    instructions.write_text("You are a helpful assistant. Answer in one short sentence.\n")
    # Codex's own instructions and tools run to ~10k tokens: its instructions are replaced and the optional
    # tools switched off, so the request (~2k tokens) fits a slot of this small model.
    (home / "config.toml").write_text(
        f'model_instructions_file = "{instructions}"\n'
        + CODEX_CONFIG.replace("@URL@", env.d.url).replace("@PROFILE@", "default")
        + "\n[features]\nmulti_agent = false\ngoals = false\nview_image = false\nrequest_user_input = false\n")
    out = tmp_path / "last.txt"
    child = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CODEX_HOME": str(home),
             "CODEROUTER_KEY": "k", "NO_COLOR": "1"}
    r = subprocess.run([str(CODEX), "exec", "--skip-git-repo-check", "-o", str(out), "say hi"], env=child,
                       cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    # The model decodes greedily, but Codex's prompt carries this run's working directory, so its answer differs
    # from run to run; now and then SmolLM2 repeats itself until the slot is full. That answer still came through
    # whole: streamed text, then the Responses wire's `incomplete` (max_output_tokens), which Codex reports in its
    # own words and exits 1 on. Anything else is a failure of ours.
    ran_out = "Incomplete response returned, reason: max_output_tokens" in r.stderr + r.stdout
    if r.returncode != 0 and ran_out:
        # Then the journal shows that answer served: a Responses request, 200, the model's tokens relayed.
        def served() -> bool:
            return any(row["ingress"] == "responses" and row["status"] == 200 and (row["output_tokens"] or 0) > 100
                       for row in journal_rows(env.d.state_dir / "state.db"))

        assert wait_for(served, 30), r.stdout[-2000:] + r.stderr[-3000:]
        return
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert out.exists() and out.read_text().strip()


def test_corectl_init_finds_the_real_server_and_its_config_serves(env, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    closed = [dead_port() for _ in range(3)]
    ports = ["--backend-port", f"llamacpp={env.llama_url.rsplit(':', 1)[1]}", "--backend-port",
             f"lmstudio={closed[0]}", "--backend-port", f"ollama={closed[1]}", "--backend-port", f"vllm={closed[2]}"]
    child = {k: v for k, v in os.environ.items() if not k.startswith(("CODEROUTER_", "XDG_"))}
    child["HOME"] = str(home)
    r = cli.corectl(["init", *ports], env=child)
    assert r.returncode == 0, r.stderr
    assert "llama.cpp" in r.stdout and "found" in r.stdout, r.stdout
    written = (home / ".config" / "coderouter" / "config.toml").read_text()
    port = free_port()
    d = DaemonProcess(written.replace("port = 8088", f"port = {port}"), tmp_path, port=port).start()
    try:
        msg = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0, timeout=120).messages.create(
            model="claude-sonnet-5", max_tokens=6, messages=[{"role": "user", "content": "Say hi."}])
        assert msg.content and msg.content[0].type == "text"
    finally:
        d.stop()


@pytest.fixture(scope="module")
def copilot_cache(tmp_path_factory):
    # Copilot CLI unpacks its bundled package (~235 MB) here on first start: once for the module.
    return tmp_path_factory.mktemp("copilot-cache")


COPILOT_CAP = 12


@pytest.mark.parametrize("wire", ["chat", "anthropic", "responses"])
def test_copilot_cli_says_hi_through_the_real_model(env, tmp_path, copilot_cache, wire):
    """Copilot CLI (BYOK, headless) answers through coderouterd from the real model on each of its three wires.
    No tool round trip: SmolLM2's chat template renders no tool schemas and has no tool-call format, so asked to
    read a file with `view` the model answers in text (tried: it suggested a shell command)."""
    from tests.e2e.test_copilot_cli import COPILOT, _skip_reason, provider_env

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    home.mkdir()
    usage = tmp_path / "usage.json"
    # Copilot's system prompt and its 17 tools run to ~48 KB, three times a slot of this model; with `view` the
    # only tool, the prompt drops the others' guidance: ~9 KB, about 1,900 tokens, which fits. It names no output
    # limit on the chat and Responses wires (8,192 on Anthropic's): its own cap stops the 135M model, which at
    # temperature 0 (Copilot's own) repeats a sentence until the slot is full. An answer cut at the cap is asked to
    # go on twice ("Please continue from where you left off."): a small cap keeps those three calls short.
    child = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "TMPDIR": str(tmp_path),
             "XDG_CACHE_HOME": str(copilot_cache), "NO_COLOR": "1", **provider_env(env.d.url, wire),
             # Not a short key: the CLI masks the key's value wherever it occurs in what it prints.
             "COPILOT_MODEL": MODEL, "COPILOT_PROVIDER_API_KEY": "local-key",
             "COPILOT_PROVIDER_MAX_OUTPUT_TOKENS": str(COPILOT_CAP),
             "COPILOT_OFFLINE": "true", "COPILOT_AUTO_UPDATE": "false"}
    start = time.time()
    r = subprocess.run([str(COPILOT), "-p", "say hi", "--allow-all-tools", "--available-tools", "view",
                        "--output-format", "json", "--no-auto-update", "--usage-output-file", str(usage)],
                       env=child, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    said = [e["data"]["content"] for e in events if e["type"] == "assistant.message" and e["data"].get("content")]
    assert said and said[-1].strip(), r.stdout[-2000:]
    assert events[-1]["type"] == "result" and events[-1]["exitCode"] == 0
    seen = json.loads(usage.read_text())["modelMetrics"][MODEL]
    calls = seen["requests"]["count"]
    # Each call was served by the real server: the journal holds the server's own counts (not estimates), and
    # Copilot's usage report adds up to the same numbers.
    ingress = {"chat": "openai", "anthropic": "anthropic", "responses": "responses"}[wire]
    rows: list[dict] = []

    def journaled() -> bool:
        rows[:] = journal_rows(env.d.state_dir / "state.db", since=start)
        return len(rows) >= calls

    assert wait_for(journaled, 30)  # a ceiling: the journal's writer flushes every 250 ms
    print(f"\n{wire}: {said[-1][:80]!r} in {len(rows)} calls, usage {seen['usage']}")
    assert 1 <= len(rows) == calls <= 3, "\n".join(json.dumps(x) for x in rows)
    for row in rows:
        assert (row["ingress"], row["provider"], row["status"], row["usage_estimated"]) == \
            (ingress, "llama", 200, False), row
        assert 0 < row["output_tokens"] <= COPILOT_CAP, row
    prompt = [row["input_tokens"] + (row["cache_read_tokens"] or 0) for row in rows]
    assert 1000 < prompt[0] < CTX, rows
    assert seen["usage"]["outputTokens"] == sum(row["output_tokens"] for row in rows), (seen, rows)
    assert seen["usage"]["inputTokens"] == sum(prompt), (seen, rows)
    assert seen["usage"]["cacheReadTokens"] == sum(row["cache_read_tokens"] or 0 for row in rows), (seen, rows)
    # The server's own record: the slot that served the last call holds its prompt and all but the last token.
    with httpx.Client(base_url=env.llama_url) as http:
        slots = [s for s in http.get("/slots").json() if "id_task" in s]
    last = max(slots, key=lambda s: s["id_task"])
    assert last["n_prompt_tokens"] == prompt[-1] + rows[-1]["output_tokens"] - 1, (last, rows[-1])


def test_zz_kill_9_mid_stream_is_a_well_formed_error_then_the_restarted_server_serves(env):
    """Last in the module: it kills the server. The stream in flight ends with an error event in its own
    protocol; the supervisor restarts the server; a request sent 0.3 s after a second kill waits for the
    restart and is served; the affinity index for the server was emptied."""
    for ingress in ("anthropic", "openai"):
        pid = env.process()["pid"]
        if ingress == "anthropic":
            req = {"model": "claude-sonnet-5", "max_tokens": 400, "stream": True,
                   "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}
            path = "/v1/messages"
        else:
            req = {"model": "any", "max_tokens": 400, "stream": True,
                   "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}
            path = "/v1/chat/completions"
        events: list[str] = []
        with httpx.stream("POST", env.d.url + path, json=req, timeout=120,
                          headers={"anthropic-version": "2023-06-01"}) as resp:
            assert resp.status_code == 200
            killed = False
            for line in resp.iter_lines():
                events.append(line)
                if not killed and ("text_delta" in line or '"content"' in line):
                    os.kill(pid, signal.SIGKILL)
                    killed = True
        assert killed, events[:10]
        data = [orjson.loads(e[6:]) for e in events if e.startswith("data: ") and e != "data: [DONE]"]
        if ingress == "anthropic":
            assert data[-1]["type"] == "error" and data[-1]["error"]["type"], data[-3:]
            assert any(e == "event: error" for e in events)
        else:
            assert "error" in data[-1], data[-3:]
        _wait_ready(env, old_pid=pid)
    # A session warms its slot; the server is killed; a request sent once the daemon has seen it waits for the
    # restart instead of failing, and affinity predicts nothing of the cache that died with the process.
    client = env.anthropic()
    session = {"x-claude-code-session-id": "0b5e55ed-0000-4000-8000-000000000001"}
    # ~110 tokens of prefix: enough to tell warm from cold (a cold turn caches none), at ~100 tokens a second.
    history = [{"role": "user", "content": "Remember the number 42. " * 16}]

    def turn() -> str:
        raw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=4, messages=history,
                                                       extra_headers=session)
        history.extend([{"role": "assistant", "content": raw.parse().content[0].text or "ok"},
                        {"role": "user", "content": f"And now turn {len(history)}."}])
        return raw.headers["x-request-id"]

    def affinity_of(rid: str) -> dict:
        with env.admin() as a:
            return a.get(f"/v1/requests/{rid}").json()["affinity"]

    turn()
    warm = affinity_of(turn())
    assert warm["predicted_tokens"] > 80 and warm["cached_tokens"] > 80, warm
    pid = env.process()["pid"]
    os.kill(pid, signal.SIGKILL)
    # The next turn is sent once the supervisor has seen the crash (not after a pause that hopes it has).
    assert wait_for(lambda: (p := env.process())["pid"] != pid or p["state"] != "ready", 60), env.process()
    after = affinity_of(turn())
    assert env.process()["pid"] != pid
    assert after["predicted_tokens"] == 0 and after["cached_tokens"] < 20, after
    assert affinity_of(turn())["cached_tokens"] > 80  # and it is warm again on the next turn


def _wait_ready(env: Env, old_pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = env.process()
        if p["state"] == "ready" and p["pid"] != old_pid:
            return
        time.sleep(0.1)
    raise AssertionError(f"llama-server not restarted: {env.process()}")


def test_gemini_cli_says_hi_through_the_real_model(env, tmp_path):
    from tests.e2e.test_gemini_cli import GEMINI, SETTINGS, _skip_reason

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    # Gemini CLI's own system prompt and tools run to ~10k tokens: the prompt is replaced (GEMINI_SYSTEM_MD) and
    # one tool kept, so the request (~500 tokens) fits a slot of this small model. It sends temperature 1 and no
    # output limit: greedy decoding and a cap (its own modelConfigs) keep this 135M model from rambling to the
    # end of its window, which took minutes on this machine.
    settings = {**SETTINGS, "model": {"name": MODEL}, "tools": {"core": ["read_file"]},
                "modelConfigs": {"customOverrides": [{"match": {"model": MODEL}, "modelConfig": {
                    "generateContentConfig": {"temperature": 0, "maxOutputTokens": 128}}}]}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    system = tmp_path / "system.md"
    system.write_text("You are a helpful assistant. Answer in one short sentence.\n")
    child = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "TMPDIR": str(tmp_path),
             "GOOGLE_GEMINI_BASE_URL": env.d.url, "GEMINI_API_KEY": "k", "GEMINI_SYSTEM_MD": str(system),
             "NO_BROWSER": "true", "GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_TELEMETRY_ENABLED": "false",
             "NO_COLOR": "1"}
    r = subprocess.run([str(GEMINI), "-p", "say hi", "--output-format", "json"], env=child, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out.get("response", "").strip(), out
    assert out["stats"]["models"][MODEL]["tokens"]["prompt"] > 0  # the server's own count, as usageMetadata
