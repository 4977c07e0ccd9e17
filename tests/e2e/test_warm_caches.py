"""KV caches that survive planned stops and crashes, end to end: the real daemon manages the fake llama-server
(a script named `llama-server`, so it gets `--slot-save-path` like the real one) and the conversation's next
turn after a daemon restart, or after kill -9 of the server, is served from its saved prefix. What it cost
shows in `corectl status` and /metrics."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support import cli
from tests.support.claude_sessions import Session
from tests.support.daemon import ROOT, DaemonProcess, admin_get, free_port, running
from tests.support.held import held_turn
from tests.support.metrics import scrape, series, total
from tests.support.wait import wait_for

CONFIG = """
[server]
port = {PORT}
[state]
flush_interval_s = 0.1
[providers.llama]
kind = "openai"
base_url = "http://127.0.0.1:@LP@/v1"
model = "coder"
[providers.llama.process]
command = @ARGV@
cwd = "@ROOT@"
ready_url = "http://127.0.0.1:@LP@/health"
stop_timeout_s = 2
startsecs = 0.1
[profiles.default]
providers = ["llama"]
health_action = "warn"
[affinity]
clone_min_tokens = 100000
save_idle_after_s = @IDLE@
"""


def _config(tmp: Path, port: int, idle: float) -> str:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.fakes --kind llamacpp --no-record \"$@\"\n")
    script.chmod(0o755)
    model = tmp / "coder.gguf"
    model.write_bytes(b"weights")
    argv = [str(script), "-m", str(model), "--port", str(port), "-np", "2", "-c", str(2 * 65536)]
    return (CONFIG.replace("@LP@", str(port)).replace("@ARGV@", json.dumps(argv)).replace("@ROOT@", str(ROOT))
            .replace("@IDLE@", str(idle)))


def _wait(pred, what: str, timeout: float = 60.0):
    got = wait_for(pred, timeout)
    assert got, f"timed out waiting for {what}"
    return got


def _ready(d: DaemonProcess) -> dict:
    def ready():
        st = admin_get(d.state_dir / "coderouterd.sock", "/v1/processes")
        procs = (st or {}).get("processes") or {}
        proc = procs[0] if isinstance(procs, list) and procs else next(iter(procs.values()), None) \
            if isinstance(procs, dict) else None
        return proc if proc and proc.get("state") == "ready" else None

    return _wait(ready, "the managed llama-server to be ready")


def _turn(d: DaemonProcess, s: Session) -> dict:
    r = httpx.post(d.url + "/v1/messages", json=s.main_body(), timeout=60,
                   headers={**s.headers, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    s.advance()
    return r.json()["usage"]


def _bins(d: DaemonProcess) -> list[str]:
    try:
        return sorted(n for n in os.listdir(d.state_dir / "slots") if n.endswith(".bin"))
    except FileNotFoundError:
        return []


def test_the_next_turn_after_a_daemon_restart_is_served_from_the_slots_saved_at_shutdown(tmp_path):
    port = free_port()
    config = _config(tmp_path, port, idle=0)  # no background saves: only the save before the stop
    a, b = Session(60), Session(61)
    with running(config, tmp_path) as d:
        _ready(d)
        for s in (a, b, a, b):
            _turn(d, s)
        assert _bins(d) == []
    assert len(_bins(d)) == 2  # both lanes' slots, saved before the server was stopped
    with running(config, tmp_path) as d2:
        _ready(d2)
        usage = _turn(d2, a)
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage
        st = admin_get(d2.state_dir / "coderouterd.sock")
        warm = next(p for p in st["providers"] if p["name"] == "llama")["cache"]["slots"]["warm"]
        assert warm["restores"] == 1 and warm["restore_bytes"] > 0 and warm["disk_bytes"] > 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
        out = cli.corectl(["--socket", str(d2.state_dir / "coderouterd.sock"), "status"], env=env).stdout
        assert "llama slot caches: 0 saved" in out and "1 restored" in out
        assert total(scrape(d2), "coderouter_slot_restores_total", provider="llama") == 1.0
        # The dashboard's local models line reads the saved caches from the same answer as status.
        models = httpx.get(d2.url + "/ui/api/now", timeout=10).json()["models"]
        assert models["saved_lanes"] == {"llama": 2} and models["saved_bytes"] == warm["disk_bytes"] > 0


def test_after_kill_9_of_the_server_the_lane_resumes_from_its_background_save(tmp_path):
    port = free_port()
    a = Session(62)
    with running(_config(tmp_path, port, idle=0.2), tmp_path) as d:
        proc = _ready(d)
        _turn(d, a)
        _turn(d, a)
        _wait(lambda: _bins(d), "the idle lane's background save")
        side = d.state_dir / "slots" / (_bins(d)[0] + ".json")
        _wait(side.exists, "its sidecar")
        assert orjson.loads(side.read_bytes())["key"]["n_ctx"] == 65536
        os.kill(proc["pid"], signal.SIGKILL)
        _wait(lambda: (p := _ready(d)) and p["pid"] != proc["pid"], "the supervisor's restart")
        usage = _turn(d, a)
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage
        assert series(scrape(d), "coderouter_slot_saves_total", provider="llama")


def test_a_config_change_that_restarts_the_server_saves_its_slots_first(tmp_path):
    port = free_port()
    config = _config(tmp_path, port, idle=0)
    a = Session(63)
    with running(config, tmp_path) as d:
        first = _ready(d)
        _turn(d, a)
        _turn(d, a)
        # Another command line for the same server (a flag the fake ignores): the reload restarts it.
        d.config_path.write_text(d.config_path.read_text().replace('"-np"', '"--threads-http", "2", "-np"'))
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.state_dir / "coderouterd.sock")),
                          base_url="http://coderouterd", timeout=30) as admin:
            assert admin.post("/v1/reload").json()["ok"]
        _wait(lambda: (p := _ready(d)) and p["pid"] != first["pid"], "the reload's restart")
        assert len(_bins(d)) == 1  # saved before the old server stopped
        usage = _turn(d, a)
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage


def _gguf_header() -> bytes:
    """A model file's header as llama.cpp writes it (what the memory estimate reads): 30 layers, 3 KV heads of 64."""
    import struct

    def s(x: str) -> bytes:
        return struct.pack("<Q", len(x.encode())) + x.encode()

    kv = {"general.architecture": "llama", "llama.block_count": 30, "llama.embedding_length": 576,
          "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3, "llama.context_length": 8192}
    out = b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", 0, len(kv))
    for k, v in kv.items():
        out += s(k) + (struct.pack("<I", 8) + s(v) if isinstance(v, str) else struct.pack("<II", 4, v))
    return out


def test_a_disk_budget_below_one_slot_file_is_said_at_start_up_and_by_config_check(tmp_path):
    """Issue 43, D5: with max_saved_mb below one slot file every save was written and deleted at once, silently.
    One full slot of 65,536 tokens here is 2 x 30 layers x 3 heads x 64 x 2 bytes a token: 1.4 GiB."""
    from coderouterd.state import read_audit

    port = free_port()
    config = _config(tmp_path, port, idle=0) + "max_saved_mb = 100\n"
    (tmp_path / "coder.gguf").write_bytes(_gguf_header())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    with running(config, tmp_path) as d:
        _ready(d)
        check = cli.corectl(["config", "check", str(d.config_path)], env=env)
        said = _wait(lambda: [e for e in read_audit(d.state_dir) if e["kind"] == "slot_budget_too_small"],
                     "the audit record")
        log = d.log()
    note = ("process llama: affinity.max_saved_mb = 100 is smaller than one of its slot files with its slot full "
            "(65,536 tokens, about 1,440 MB)")
    assert len(said) == 1 and said[0]["process"] == "llama" and said[0]["note"].startswith(note), said
    assert log.count(note) == 1, log
    assert check.returncode == 0 and note in check.stdout, check.stdout + check.stderr
    # Within the budget: nothing said.
    d.config_path.write_text(d.config_path.read_text().replace("max_saved_mb = 100", "max_saved_mb = 2000"))
    ok = cli.corectl(["config", "check", str(d.config_path)], env=env)
    assert ok.returncode == 0 and "max_saved_mb" not in ok.stdout, ok.stdout


def test_a_truncated_slot_file_is_refused_and_leaves_an_audit_line_and_a_cache_bust(tmp_path):
    """Issue 43, D4: a restore that could not happen (the file cut after it was saved) is refused before the
    server sees it, and the turn's cache bust names the slot file: in the audit log, `corectl explain`,
    `corectl status` and /metrics."""
    from coderouterd.state import read_audit

    port = free_port()
    config = _config(tmp_path, port, idle=0)
    a = Session(64)
    with running(config, tmp_path) as d:
        _ready(d)
        _turn(d, a)
        _turn(d, a)
    (name,) = _bins(d)  # saved before the server stopped
    path = d.state_dir / "slots" / name
    path.write_bytes(path.read_bytes()[:100])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    with running(config, tmp_path) as d2:
        _ready(d2)
        r = httpx.post(d2.url + "/v1/messages", json=a.main_body(), timeout=60,
                       headers={**a.headers, "anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["cache_read_input_tokens"] == 0  # recomputed, and served
        rid = r.headers["x-request-id"]
        sock = str(d2.state_dir / "coderouterd.sock")
        explained = cli.corectl(["--socket", sock, "explain", rid, "--json"], env=env)
        aff = orjson.loads(explained.stdout)["trace"]["affinity"]
        assert aff["slot_restore"]["outcome"] == "refused", aff
        assert aff["slot_restore"]["problem"].startswith("truncated: 100 bytes, saved as ")
        text = cli.corectl(["--socket", sock, "explain", rid], env={**env, "COLUMNS": "200"}).stdout
        assert "slot restore" in text and "refused: truncated" in text, text
        status = cli.corectl(["--socket", sock, "status"], env={**env, "COLUMNS": "200"}).stdout
        assert "1 file(s) refused (truncated or gone)" in status, status
        assert total(scrape(d2), "coderouter_slot_restores_unproven_total", provider="llama", why="refused") == 1
    busts = [e for e in read_audit(d2.state_dir) if e["kind"] == "cache_bust"]
    assert len(busts) == 1 and busts[0]["request_id"] == rid and busts[0]["cause"] == "slot file"
    assert busts[0]["segment"].startswith("slot restore refused (truncated: 100 bytes")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_under_which_the_server_is_killed_is_sent_again_to_its_restart_with_its_lane_restored(
        tmp_path, stream):
    """Issue 44 section 2: the server is killed -9 while it computes a turn (before any of the answer reached the
    client). The daemon waits for the supervisor's restart (a streaming client gets its 200 and pings meanwhile)
    and sends the request again, to a fresh server whose slot is first restored from the lane's saved file: the
    retry reads the conversation's prefix from the file instead of recomputing it (the QA saw 6.75x)."""
    port = free_port()
    a = Session(64 + stream)
    with running(_config(tmp_path, port, idle=0.2), tmp_path) as d:
        proc = _ready(d)
        _turn(d, a)
        _turn(d, a)
        _wait(lambda: _bins(d), "the idle lane's background save")
        # The next turn takes its time (the server computing a long prompt): the server is killed in it.
        answer = held_turn(d, port, a, stream=stream)
        os.kill(proc["pid"], signal.SIGKILL)
        r = answer()
        assert r.status_code == 200, r.text
        attempts = r.headers["x-coderouter-attempts"].split(",")
        assert len(attempts) == 2 and attempts[0].startswith("llama:") and attempts[1] in ("llama:ok", "llama:streaming"), attempts
        if stream:
            events = [orjson.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
            assert [e["type"] for e in events].count("message_start") == 1, events
            assert events[-1]["type"] == "message_stop", events[-3:]
        # What the server reported for the retry (a streaming client's opening went out before it answered).
        record = admin_get(d.state_dir / "coderouterd.sock", "/v1/requests/" + r.headers["x-request-id"])
        usage = record["usage"]
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage
        assert record["affinity"]["cached_tokens"] > 0.5 * prompt, record["affinity"]
        assert _ready(d)["pid"] != proc["pid"]
        st = admin_get(d.state_dir / "coderouterd.sock")
        warm = next(p for p in st["providers"] if p["name"] == "llama")["cache"]["slots"]["warm"]
        assert warm["restores"] == 1, warm


def test_a_request_to_an_unmanaged_server_that_dies_is_not_held_for_a_restart(tmp_path):
    """Nobody restarts a server coderouterd does not manage: its connection error ends the request at once."""
    from tests.support.ports import dead_port

    config = CONFIG.split("[providers.llama.process]")[0].replace("@LP@", str(dead_port()))
    with running(config + '[profiles.default]\nproviders = ["llama"]\n', tmp_path) as d:
        r = httpx.post(d.url + "/v1/messages", json=Session(66).main_body(), timeout=60,
                       headers={"anthropic-version": "2023-06-01"})
    assert r.status_code >= 500, r.text
    assert r.headers["x-coderouter-attempts"] == "llama:connect_error", r.headers


class _Hung:
    """A provider that takes each generation request and holds it until released, then drops the connection (a
    failover error): a slow failover tried while the killed server restarts. Anything else gets a 404."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.release = threading.Event()
        self.held = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                got = conn.recv(65536)
                if not got:
                    return
                head += got
            if b"/chat/completions" not in head.split(b"\r\n", 1)[0]:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            self.held.set()
            self.release.wait(120)

    def close(self) -> None:
        self.release.set()
        self.sock.close()


def test_a_server_that_came_back_while_a_failover_was_tried_still_gets_its_retry(tmp_path):
    """The server is killed under a turn; the request fails over to the next provider, which takes longer to fail
    than the server takes to restart. When the chain is exhausted the server is up again, a fresh instance: the
    request is still sent to it once more (not held for exit news that came long ago, then answered with the
    error)."""
    port = free_port()
    hung = _Hung()
    config = _config(tmp_path, port, idle=0.2).replace(
        '[profiles.default]\nproviders = ["llama"]',
        f'[providers.cloud]\nkind = "openai"\nbase_url = "http://127.0.0.1:{hung.port}/v1"\nmodel = "coder"\n'
        '[profiles.default]\nproviders = ["llama", "cloud"]')
    a = Session(67)
    try:
        with running(config, tmp_path) as d:
            proc = _ready(d)
            _turn(d, a)
            answer = held_turn(d, port, a)
            os.kill(proc["pid"], signal.SIGKILL)
            _wait(hung.held.is_set, "the failover attempt")
            _wait(lambda: (p := _ready(d)) and p["pid"] != proc["pid"], "the supervisor's restart")
            hung.release.set()  # the failover fails now, with the server already back
            r = answer()
            assert r.status_code == 200, r.text
            attempts = r.headers["x-coderouter-attempts"].split(",")
            assert len(attempts) == 3 and attempts[0].startswith("llama:") and attempts[1].startswith("cloud:") \
                and attempts[2] == "llama:ok", attempts
    finally:
        hung.close()


def test_a_stream_already_open_when_its_server_is_killed_goes_on_whole_from_the_restart(tmp_path):
    """The client has its 200 and the stream's opening (committed while the server computed the prompt) when the
    server is killed: the retry's answer continues that same stream, with one message_start and no error, and
    reads the lane's prefix from its saved file."""
    port = free_port()
    a = Session(68)
    config = _config(tmp_path, port, idle=0.2).replace("[server]\n", "[server]\nping_interval_s = 1\n", 1)
    with running(config, tmp_path) as d:
        proc = _ready(d)
        _turn(d, a)
        _turn(d, a)
        _wait(lambda: _bins(d), "the idle lane's background save")
        fake = f"http://127.0.0.1:{port}/_fake"
        httpx.post(fake + "/script", json={"behaviours": ["slow_first_byte;delay=600"]}, timeout=10)
        opened = threading.Event()
        out: dict = {}

        def send() -> None:
            with httpx.stream("POST", d.url + "/v1/messages", json={**a.main_body(), "stream": True}, timeout=120,
                              headers={**a.headers, "anthropic-version": "2023-06-01"}) as r:
                out["r"] = r
                opened.set()
                out["text"] = r.read().decode()

        t = threading.Thread(target=send)
        t.start()
        _wait(opened.is_set, "the stream's 200")
        _wait(lambda: httpx.get(fake + "/stats", timeout=10).json()["queued"] == 0, "the turn at the server")
        os.kill(proc["pid"], signal.SIGKILL)
        t.join(120)
        r, text = out["r"], out["text"]
        assert r.status_code == 200 and r.headers["x-coderouter-attempts"] == "llama:streaming", r.headers
        events = [orjson.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: ")]
        kinds = [e["type"] for e in events]
        assert kinds.count("message_start") == 1 and "error" not in kinds and kinds[-1] == "message_stop", kinds
        record = admin_get(d.state_dir / "coderouterd.sock", "/v1/requests/" + r.headers["x-request-id"])
        outcomes = [x["outcome"] for x in record["attempts"]]
        assert len(outcomes) == 2 and outcomes[-1] == "ok", record["attempts"]
        usage = record["usage"]
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage
