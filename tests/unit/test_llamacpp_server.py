"""servers/llamacpp.LlamaServer, the only code that speaks llama-server's HTTP API, against a client of plain
dicts (servers/ performs no I/O of its own), and the pure helpers that read and write its command line."""

from __future__ import annotations

import asyncio
from pathlib import Path

from coderouterd.servers.llamacpp import (
    LlamaServer,
    ctx_size,
    model_file,
    parallel,
    saves_to,
    with_slot_save_path,
)


class Client:
    """Answers by (method, path); records what was asked."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.asked: list[tuple] = []

    async def get(self, path: str):
        self.asked.append(("GET", path))
        return self.answers[("GET", path)]

    async def post(self, path: str, body: dict, timeout: float):
        self.asked.append(("POST", path, body, timeout))
        got = self.answers[("POST", path)]
        if isinstance(got, BaseException):
            raise got
        return got


def _run(coro):
    return asyncio.run(coro)


def test_props_and_the_slot_api():
    props = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 2}
    c = Client({("GET", "/props"): (200, props), ("GET", "/slots"): (501, None)})
    s = LlamaServer(c.get, c.post)
    assert _run(s.props()) == props
    assert _run(s.slots_on()) is False  # --no-slots
    c.answers[("GET", "/props")] = (503, None)  # still loading
    assert _run(s.props()) is None


def test_save_and_restore_say_the_status_and_the_counts():
    c = Client({("POST", "/slots/1?action=save"): (200, {"n_saved": 12, "n_written": 4096}),
                ("POST", "/slots/0?action=restore"): (501, None)})
    s = LlamaServer(c.get, c.post)
    saved = _run(s.save(1, "cr-x-lane-0.bin", 30.0))
    assert saved.ok and saved.count("n_saved") == 12 and saved.count("n_written") == 4096
    assert c.asked[-1] == ("POST", "/slots/1?action=save", {"filename": "cr-x-lane-0.bin"}, 30.0)
    refused = _run(s.restore(0, "cr-x-lane-0.bin", 30.0))
    assert not refused.ok and refused.status == 501 and refused.count("n_restored") == 0
    c.answers[("POST", "/slots/0?action=restore")] = TimeoutError()
    assert _run(s.restore(0, "f", 1.0)).status == 0  # no answer in time


def test_template_and_token_count():
    c = Client({("POST", "/apply-template"): (200, {"prompt": "<s>hi"}),
                ("POST", "/tokenize"): (200, {"tokens": [1, 2, 3]})})
    s = LlamaServer(c.get, c.post)
    assert _run(s.apply_template({"messages": []}, 5.0)) == (200, "<s>hi")
    assert _run(s.tokenize("<s>hi", 5.0, special=True)) == (200, 3)
    assert c.asked[-1][2] == {"content": "<s>hi", "add_special": True, "parse_special": True}
    c.answers[("POST", "/tokenize")] = (404, None)
    assert _run(s.tokenize("x", 5.0)) == (404, None)


def test_the_command_line_helpers(tmp_path):
    d = tmp_path / "slots"
    cmd = ["/opt/bin/llama-server", "-m", "m.gguf", "-c", "8192", "-np", "4"]
    given = with_slot_save_path(cmd, d)
    assert given == [*cmd, "--slot-save-path", str(d)] and saves_to(given, d)
    assert with_slot_save_path(["llama-server", "--slot-save-path=/mine"], d) == [
        "llama-server", "--slot-save-path=/mine"]
    assert not saves_to(["llama-server", "--slot-save-path=/mine"], d)
    assert with_slot_save_path(["ollama", "serve"], d) == ["ollama", "serve"]
    # Through a wrapper that hands the server the rest of its command line: the flag reaches it.
    for wrapper in (["nice", "-n", "5"], ["taskset", "-c", "0"], ["env", "GGML_X=1"],
                    ["sh", "-c", 'sleep 2; exec "$0" "$@"']):
        wrapped = [*wrapper, "/opt/bin/llama-server", "-m", "m.gguf"]
        assert with_slot_save_path(wrapped, d) == [*wrapped, "--slot-save-path", str(d)], wrapper
    # A string the shell parses names no element: nothing is appended (it would reach `sh`, not the server);
    # nor for a model file or an argument that only contains the name.
    for other in (["sh", "-c", "sleep 2; exec llama-server -m m.gguf"], ["python", "-m", "x", "llama-server.gguf"],
                  ["runner", "--log", "/var/log/llama-server-1.log"]):
        assert with_slot_save_path(other, d) == other, other
    assert model_file(cmd, "/w") == Path("/w/m.gguf") and model_file(["python3", "-m", "x"]) is None
    assert ctx_size(cmd) == 8192 and ctx_size(["llama-server", "--ctx-size=4096"]) == 4096
    assert ctx_size(["llama-server", "-c", "lots"]) == 0 and parallel(cmd) == 4 and parallel(["llama-server"]) == 0
