"""corectl's operating commands end to end: the real daemon, real managed backends, the real corectl process.

Providers/status with managed processes, restart (new pid, ready again), a crash loop that goes FATAL and is
revived by `corectl restart`, logs (tail and follow), model control against fake Ollama and LM Studio, explain
(from memory, then from the journal), audit/journal commands with the daemon stopped, replay compare on a
journal with known answers, and exit 3 whenever a command needs the daemon and it is not running."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fakes.runner import FakeServer, free_port
from tests.support import cli
from tests.support.daemon import ROOT, DaemonProcess, admin_get
from tests.support.ports import dead_port
from tests.support.wait import wait_for

FAKE_BACKEND = str(ROOT / "tests" / "support" / "fake_backend.py")


def corectl(*args: str, sock: str | None = None, state_dir: str | None = None, timeout: float = 60,
            ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["COLUMNS"] = "200"
    if sock:
        env["CODEROUTER_SOCKET"] = sock
    if state_dir:
        env["CODEROUTER_STATE_DIR"] = state_dir
    return cli.corectl(list(args), env=env, timeout=timeout)


def ok_json(*args: str, sock: str | None = None, state_dir: str | None = None) -> dict:
    r = corectl(*args, "--json", sock=sock, state_dir=state_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    return orjson.loads(r.stdout)


def sock_of(d: DaemonProcess) -> str:
    return str(d.state_dir / "coderouterd.sock")


def process_block(name: str, command: list[str], ready_port: int, *, max_restarts: int = 3,
                  window: float = 60) -> str:
    return f"""
[providers.{name}.process]
command = {orjson.dumps(command).decode()}
cwd = "{ROOT}"
ready_url = "http://127.0.0.1:{ready_port}/api/tags"
stop_timeout_s = 2
startsecs = 0.2
max_restarts = {max_restarts}
restart_window_s = {window}
"""


BASE = """
[server]
port = {PORT}
[state]
flush_interval_s = 0.1
[health]
probe_interval_s = 0.5
recovery_backoff_s = [5]
"""


@pytest.fixture
def backup():
    with FakeServer("openai", name="backup") as f:
        yield f


def chat(d: DaemonProcess) -> httpx.Response:
    return httpx.post(d.url + "/v1/chat/completions", timeout=10,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})


# -- managed processes: status, providers, restart, logs, explain -----------------------------------------------

def test_status_providers_restart_logs_and_explain(tmp_path, backup):
    port = free_port()
    cmd = [sys.executable, "-m", "tests.fakes", "--kind", "ollama", "--port", str(port), "--models", "qwen3"]
    # A second managed backend the user already runs, with its configured command: adopted by its URL (verified:
    # same command, same user), never started or restarted by us.
    uport = free_port()
    ucmd = [sys.executable, "-m", "tests.fakes", "--kind", "ollama", "--port", str(uport)]
    users = subprocess.Popen(ucmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert users.stdout is not None and users.stdout.readline().startswith("READY")
    cfg = BASE + f"""
[providers.ollama-qwen3]
base_url = "http://127.0.0.1:{port}/v1"
{process_block("ollama-qwen3", cmd, port)}
[providers.theirs]
base_url = "http://127.0.0.1:{uport}/v1"
{process_block("theirs", ucmd, uport)}
[providers.backup]
base_url = "{backup.url}/v1"
[profiles.default]
providers = ["ollama-qwen3", "backup"]
"""
    d = DaemonProcess(cfg, tmp_path).start()
    sock = sock_of(d)
    try:
        def ready() -> bool:
            st = admin_get(sock)
            return bool(st) and (st["processes"].get("ollama-qwen3") or {}).get("state") == "ready"

        assert wait_for(ready, 15), "managed backend never became ready"
        st = ok_json("status", sock=sock)
        assert st["processes"]["ollama-qwen3"]["state"] == "ready"
        old_pid = st["processes"]["ollama-qwen3"]["pid"]
        assert st["processes"]["ollama-qwen3"]["providers"] == ["ollama-qwen3"]
        assert st["state_dir"] == str(d.state_dir) and st["store"]["healthy"] is True
        assert st["budget"]["global"]["spent"] == 0 and "ollama-qwen3" in st["health"]

        provs = {p["name"]: p for p in ok_json("providers", sock=sock)["providers"]}
        assert provs["ollama-qwen3"]["process"] == "ollama-qwen3"
        assert provs["ollama-qwen3"]["process_state"] == "ready"
        assert provs["backup"]["process"] is None

        human = corectl("status", sock=sock)
        assert human.returncode == 0, human.stderr
        assert "Managed processes" in human.stdout and str(old_pid) in human.stdout
        assert "spend" in human.stdout and "WARNING" not in human.stdout

        # A request, so explain has something real to explain.
        r = wait_for(lambda: (lambda r: r if r.headers.get("x-coderouter-provider") == "ollama-qwen3" else None)(
            chat(d)), 10)
        assert r and r.status_code == 200
        rid = r.headers["x-request-id"]

        restarted = corectl("restart", "ollama-qwen3", "--wait", "20", sock=sock)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert "ready" in restarted.stdout
        procs = ok_json("status", sock=sock)["processes"]
        snap = procs["ollama-qwen3"]
        assert snap["state"] == "ready" and snap["pid"] not in (None, old_pid)
        assert snap["restarts_total"] == 1

        unknown = corectl("restart", "nope", sock=sock)
        assert unknown.returncode == 1 and "ollama-qwen3" in unknown.stderr and "nope" in unknown.stderr
        theirs = corectl("restart", "theirs", sock=sock)
        assert theirs.returncode == 1 and "did not start" in theirs.stderr, theirs.stderr
        assert procs["theirs"]["external"] is True and procs["theirs"]["state"] == "ready"

        logs = corectl("logs", "ollama-qwen3", "-n", "3", sock=sock)
        assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 3
        full = ok_json("logs", "ollama-qwen3", "-n", "100", sock=sock)
        assert sum("starting:" in line for line in full["lines"]) == 2  # the first start and the restart
        assert full["log"].endswith("ollama-qwen3.log")

        # logs -f prints what is appended (the next restart's lines) and Ctrl-C ends it with status 0. It is
        # following once it has printed the last line (-n 1); the restart comes after that, not after a sleep.
        follow = subprocess.Popen([sys.executable, "-m", "corectl", "logs", "ollama-qwen3", "-n", "1", "-f"],
                                  cwd=ROOT, env={**os.environ, "CODEROUTER_SOCKET": sock}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout], daemon=True).start()
        seen: list[str] = []
        try:
            seen.append(lines.get(timeout=30))
            assert corectl("restart", "ollama-qwen3", sock=sock).returncode == 0
            deadline = time.monotonic() + 30
            while not any("starting:" in line for line in seen) and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    seen.append(lines.get(timeout=0.2))
            follow.send_signal(signal.SIGINT)
            follow.wait(timeout=10)
        finally:
            if follow.poll() is None:
                follow.kill()
        assert follow.returncode == 0, follow.stderr.read()
        assert any("starting:" in line for line in seen), seen

        explained = corectl("explain", rid, sock=sock)
        assert explained.returncode == 0, explained.stderr
        assert "from coderouterd's memory" in explained.stdout and "Attempts" in explained.stdout
        ex = ok_json("explain", rid, sock=sock)
        assert ex["source"] == "memory" and ex["trace"]["served_by"] == "ollama-qwen3"
        assert ex["trace"]["effective_order"] == ["ollama-qwen3", "backup"]
        assert [a["outcome"] for a in ex["trace"]["attempts"]] == ["ok"]
        assert corectl("explain", "req_unknown", sock=sock).returncode == 1
    finally:
        d.stop()
        users.kill()
        users.wait()
    # Once the daemon is gone, the journal still explains the request.
    ex = ok_json("explain", rid, "--state-dir", str(d.state_dir), sock=sock)
    assert ex["source"] == "journal" and ex["trace"]["served_by"] == "ollama-qwen3"
    assert ex["trace"]["status"] == 200
    missing = corectl("explain", "req_unknown", "--state-dir", str(d.state_dir), sock=sock)
    assert missing.returncode == 3 and "not running" in missing.stderr


def test_crash_loop_goes_fatal_and_restart_revives_it(tmp_path, backup):
    port = free_port()
    flag = tmp_path / "broken"
    flag.write_text("remove me to fix the backend")
    cmd = [sys.executable, FAKE_BACKEND, "--port", str(port), "--fail-while-exists", str(flag)]
    cfg = BASE + f"""
[providers.flaky]
base_url = "http://127.0.0.1:{port}/v1"
{process_block("flaky", cmd, port, max_restarts=2, window=30)}
[providers.backup]
base_url = "{backup.url}/v1"
[profiles.default]
providers = ["flaky", "backup"]
"""
    d = DaemonProcess(cfg, tmp_path).start()
    sock = sock_of(d)
    try:
        def fatal() -> bool:
            st = admin_get(sock)
            return bool(st) and st["processes"]["flaky"]["state"] == "fatal"

        assert wait_for(fatal, 20), "the crash loop never went FATAL"
        snap = ok_json("status", sock=sock)["processes"]["flaky"]
        assert snap["state"] == "fatal"
        assert snap["last_exit_code"] == 3 and snap["pid"] is None
        assert "2 restarts within 30s" in snap["fatal_reason"]
        # A fatal process does not come back by itself: self-healing waits for it to be started again instead
        # of probing its port (whatever answers there is not ours, issue 34), so no probe is scheduled.
        assert ok_json("status", sock=sock)["processes"]["flaky"].get("next_probe_at") is None

        human = corectl("status", sock=sock)
        assert "fatal" in human.stdout and "corectl restart flaky" in human.stdout
        # Requests are still served, by the backup.
        assert chat(d).headers["x-coderouter-provider"] == "backup"

        audit = ok_json("audit", "tail", "--kind", "process", "-n", "50", sock=sock)
        events = [r["event"] for r in audit["records"] if r["process"] == "flaky"]
        assert "fatal" in events and events.count("exited") == 3

        # Still broken: a restart brings it up, it exits, and corectl says it is not ready.
        again = corectl("restart", "flaky", "--wait", "1", sock=sock)
        assert again.returncode == 1 and "not ready" in again.stderr

        assert wait_for(fatal, 20)  # the second loop ends FATAL too
        assert ok_json("status", sock=sock)["processes"]["flaky"]["state"] == "fatal"
        flag.unlink()
        fixed = corectl("restart", "flaky", "--wait", "20", "--json", sock=sock)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        data = orjson.loads(fixed.stdout)
        assert data["ready"] is True and data["process"]["state"] == "ready" and data["process"]["pid"]
        assert data["process"]["fatal_reason"] is None
        # Ready again, self-healing probes its own server (no longer the port alone) and it rejoins.
        def rejoined() -> bool:
            st = admin_get(sock) or {}
            flaky = next((p for p in st.get("providers") or [] if p["name"] == "flaky"), {})
            return flaky.get("health") == "HEALTHY" and not st["processes"]["flaky"].get("recovering")

        assert wait_for(rejoined, 60), admin_get(sock)
    finally:
        d.stop()


# -- model control ----------------------------------------------------------------------------------------------

def test_models_list_load_unload_on_ollama_and_lmstudio(tmp_path):
    with FakeServer("ollama", models=["qwen3", "llama3"]) as ol, \
            FakeServer("lmstudio", models=["lm-a", "lm-b"]) as lm, FakeServer("openai", models=["o"]) as oa:
        cfg = BASE + f"""
[providers.ol]
base_url = "{ol.url}/v1"
[providers.lm]
base_url = "{lm.url}/v1"
[providers.b]
base_url = "{oa.url}/v1"
[profiles.default]
providers = ["ol", "lm", "b"]
"""
        d = DaemonProcess(cfg, tmp_path).start()
        sock = sock_of(d)
        try:
            def loaded() -> dict[str, dict[str, bool]]:
                entries = ok_json("models", "list", sock=sock)["providers"]
                return {e["provider"]: {m["id"]: m["loaded"] for m in e["models"]} for e in entries}

            listing = {e["provider"]: e for e in ok_json("models", "list", sock=sock)["providers"]}
            assert listing["ol"]["backend"] == "ollama" and listing["lm"]["backend"] == "lmstudio"
            assert loaded() == {"ol": {"qwen3": False, "llama3": False}, "lm": {"lm-a": False, "lm-b": False},
                                "b": {"o": None}}  # unknown on a plain OpenAI server
            unsupported = corectl("models", "load", "o", "--provider", "b", sock=sock)
            assert unsupported.returncode == 1
            assert unsupported.stderr.startswith("corectl: b: this backend has no model load API"), unsupported.stderr
            assert "b: b:" not in unsupported.stderr  # the provider is named once

            for provider, model in (("ol", "qwen3"), ("lm", "lm-b")):
                r = corectl("models", "load", model, "--provider", provider, sock=sock)
                assert r.returncode == 0 and f"Loaded {model} on {provider}" in r.stdout, r.stdout + r.stderr
            assert loaded() == {"ol": {"qwen3": True, "llama3": False}, "lm": {"lm-a": False, "lm-b": True},
                                "b": {"o": None}}
            human = corectl("models", "list", "lm", sock=sock)
            assert human.returncode == 0 and "loaded" in human.stdout and "lmstudio" in human.stdout
            assert "ollama" not in human.stdout

            again = ok_json("models", "load", "lm-b", "--provider", "lm", sock=sock)
            assert again["already_loaded"] is True  # no second LM Studio instance
            for provider, model in (("ol", "qwen3"), ("lm", "lm-b")):
                assert ok_json("models", "unload", model, "--provider", provider, sock=sock)["loaded"] is False
            assert loaded() == {"ol": {"qwen3": False, "llama3": False}, "lm": {"lm-a": False, "lm-b": False},
                                "b": {"o": None}}  # unknown on a plain OpenAI server

            bad = corectl("models", "load", "x", "--provider", "nope", sock=sock)
            assert bad.returncode == 1 and "valid providers: b, lm, ol" in bad.stderr
            assert bad.stderr.startswith("corectl: ")  # no spinner debris when stderr is not a terminal
            missing = corectl("models", "load", "ghost", "--provider", "lm", sock=sock)
            assert missing.returncode == 1 and "not found" in missing.stderr
            # The backend's message, not its error dict.
            assert "{" not in missing.stderr and missing.stderr.count("\n") == 1
        finally:
            d.stop()


def test_models_on_a_closed_backend_is_one_line_and_no_traceback(tmp_path):
    closed = dead_port()
    cfg = BASE + f"""
[providers.lms]
base_url = "http://127.0.0.1:{closed}/v1"
[profiles.default]
providers = ["lms"]
"""
    d = DaemonProcess(cfg, tmp_path).start()
    sock = sock_of(d)
    try:
        url = f"http://127.0.0.1:{closed}/v1"
        for args in (("models", "list", "lms"), ("models", "load", "m", "--provider", "lms"),
                     ("models", "unload", "m", "--provider", "lms")):
            r = corectl(*args, sock=sock)
            assert r.returncode == 1, (args, r.stdout, r.stderr)
            assert r.stderr.startswith(f"corectl: lms: cannot reach the backend at {url}"), r.stderr
            assert r.stderr.count("\n") == 1, r.stderr
        listing = ok_json("models", "list", sock=sock)["providers"]
        assert listing[0]["error"].startswith(f"cannot reach the backend at {url}")
    finally:
        d.stop()
    assert "Traceback" not in d.log() and "internal error" not in d.log()


# -- history with the daemon stopped ----------------------------------------------------------------------------

def test_audit_and_journal_work_with_the_daemon_stopped(tmp_path, backup):
    cfg = BASE + f"""
[providers.backup]
base_url = "{backup.url}/v1"
[profiles.default]
providers = ["backup"]
[profiles.alt]
providers = ["backup"]
"""
    d = DaemonProcess(cfg, tmp_path).start()
    sock = sock_of(d)
    try:
        rids = [chat(d).headers["x-request-id"] for _ in range(3)]
        assert corectl("profile", "use", "alt", sock=sock).returncode == 0
    finally:
        d.stop()
    sdir = str(d.state_dir)
    assert corectl("providers", sock=sock).returncode == 3  # really stopped

    audit = ok_json("audit", "tail", "--kind", "profile_switched", state_dir=sdir)
    assert [(r["old"], r["new"]) for r in audit["records"]] == [("default", "alt")]
    text = corectl("audit", "tail", "-n", "2", "--state-dir", sdir)
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 2 and "daemon" in text.stdout
    assert ok_json("audit", "tail", "--since", "1h", state_dir=sdir)["records"]
    assert ok_json("audit", "tail", "--since", "2099-01-01", state_dir=sdir)["records"] == []

    tail = ok_json("journal", "tail", "-n", "2", state_dir=sdir)
    assert [r["request_id"] for r in tail["rows"]] == rids[1:]
    human = corectl("journal", "tail", state_dir=sdir)
    assert human.returncode == 0 and all(rid in human.stdout for rid in rids)

    out = tmp_path / "journal.csv"
    r = corectl("journal", "export", "--format", "csv", "--since", "1h", "-o", str(out), state_dir=sdir)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [row["request_id"] for row in rows] == rids and {row["provider"] for row in rows} == {"backup"}
    jsonl = corectl("journal", "export", "--format", "jsonl", state_dir=sdir)
    assert [orjson.loads(line)["request_id"] for line in jsonl.stdout.splitlines()] == rids
    assert corectl("journal", "export", "--until", "2h", state_dir=sdir).stdout == ""
    bad = corectl("journal", "export", "--since", "yesterdayish", state_dir=sdir)
    assert bad.returncode == 2 and "not a time" in bad.stderr

    # audit tail -f follows new records (here appended by hand) until Ctrl-C, which exits 0.
    # The backlog line (-n 1) is printed once following has begun: no guessing how long start-up takes.
    follow = subprocess.Popen([sys.executable, "-m", "corectl", "audit", "tail", "-n", "1", "-f", "--state-dir", sdir],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        backlog = follow.stdout.readline()
        assert "daemon" in backlog, backlog
        with open(Path(sdir) / "audit.jsonl", "ab") as f:
            f.write(orjson.dumps({"ts": "2030-01-01T00:00:00.000Z", "kind": "guard_fired", "tool": "grep"}) + b"\n")
        followed = follow.stdout.readline()
        follow.send_signal(signal.SIGINT)
        out_f, err_f = follow.communicate(timeout=5)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err_f
    assert "guard_fired" in followed and "tool=grep" in followed

    nowhere = corectl("journal", "tail", "--state-dir", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 1 and "no state directory" in nowhere.stderr


# -- replay compare on a journal with known answers -------------------------------------------------------------

def write_journal(sdir: Path, now: float) -> None:
    from coderouterd.state import RequestFinished, Store

    rows = []
    for i in range(25):  # last week: "fast" on profile old, 100 ms, $0.002 each, 1 error in 25
        rows.append(RequestFinished(request_id=f"a{i}", ingress="anthropic", profile="old", provider="fast",
                                    latency_ms=100.0, ttfb_ms=40.0, input_tokens=1000, output_tokens=100,
                                    cost_usd=0.002, status=500 if i == 0 else 200, ts=now - 8 * 86400 + i))
    for i in range(25):  # this week: "slow" on profile new, 200 ms, $0.001 each, streaming
        rows.append(RequestFinished(request_id=f"b{i}", ingress="anthropic", profile="new", provider="slow",
                                    latency_ms=200.0, ttfb_ms=60.0, input_tokens=3000, output_tokens=100,
                                    cost_usd=0.001, streaming=True, ts=now - 3600 + i))
    for i in range(3):  # a handful on a third provider: a small sample
        rows.append(RequestFinished(request_id=f"c{i}", ingress="openai", profile="new", provider="tiny",
                                    latency_ms=50.0, cost_usd=0.0, ts=now - 60 + i))
    store = Store(sdir / "state.db")
    store.open()
    store.journal_sink()(rows)
    store.close()


def test_replay_compare_on_a_known_journal(tmp_path):
    sdir = tmp_path / "state"
    sdir.mkdir()
    write_journal(sdir, time.time())

    res = ok_json("replay", "compare", "fast", "slow", "--state-dir", str(sdir))
    assert res["a"]["requests"] == 25 and res["b"]["requests"] == 25
    assert res["a"]["p50_latency_ms"] == 100.0 and res["b"]["p50_latency_ms"] == 200.0
    assert res["delta"]["p50_latency_ms"] == pytest.approx(100.0)
    assert res["delta"]["avg_cost_usd"] == pytest.approx(-50.0)
    assert res["delta_abs"]["error_rate"] == pytest.approx(-0.04)
    assert res["delta"]["avg_input_tokens"] == pytest.approx(200.0)
    assert res["small_sample"] is False
    assert res["verdict"] == "slow is 50% cheaper per request, 100% slower at p50 and has fewer errors " \
                             "(0.0% vs 4.0%)"

    human = corectl("replay", "compare", "fast", "slow", "--state-dir", str(sdir))
    assert human.returncode == 0, human.stderr
    assert res["verdict"] in " ".join(human.stdout.split())
    for cell in ("+100%", "-50%", "-4.0 pp", "+100.0 pp", "200 ms"):
        assert cell in human.stdout, cell

    # Profiles, and a time filter that leaves only this week's rows.
    by_profile = ok_json("replay", "compare", "old", "new", "--by", "profile", "--state-dir", str(sdir))
    assert (by_profile["a"]["requests"], by_profile["b"]["requests"]) == (25, 28)
    # Names that are profiles are compared as profiles without being told (issue 23: --by was required).
    assert ok_json("replay", "compare", "old", "new", "--state-dir", str(sdir)) == by_profile
    recent = ok_json("replay", "compare", "old", "new", "--by", "profile", "--since", "2d", "--state-dir", str(sdir))
    assert recent["a"]["requests"] == 0 and recent["verdict"].startswith("No requests for old")

    # Windows: last week against this week, narrowed to one profile; then a small sample is flagged.
    win = ok_json("replay", "compare", "--window", "14d..7d", "7d..", "--state-dir", str(sdir))
    assert (win["a"]["requests"], win["b"]["requests"]) == (25, 28)
    win = ok_json("replay", "compare", "--window", "14d..7d", "7d..now", "--profile", "new", "--state-dir", str(sdir))
    assert (win["a"]["requests"], win["b"]["requests"]) == (0, 28)
    small = corectl("replay", "compare", "slow", "tiny", "--state-dir", str(sdir))
    assert small.returncode == 0 and "small sample: 25 vs 3 requests" in small.stdout

    bad = corectl("replay", "compare", "--window", "7d", "0d", "--state-dir", str(sdir))
    assert bad.returncode == 2 and "START..END" in bad.stderr


# -- the daemon is not running ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["providers"], ["stop", "x"], ["logs", "x"], ["top"], ["models", "load", "m", "--provider", "p"],
])
def test_commands_needing_the_daemon_exit_3_when_it_is_not_running(tmp_path, args):
    r = corectl(*args, "--json", sock=str(tmp_path / "none.sock"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "coderouterd is not running" in r.stderr
    assert orjson.loads(r.stdout)["running"] is False
