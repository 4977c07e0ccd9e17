"""Local models on demand, within a memory budget, with real child processes (the fake servers run as
processes): a request starts a stopped model and waits (a stream gets pings), an idle one stops and the next
request starts it again, a budget that holds one model swaps them without ever running both, a pinned one is
never stopped to make room, and a process that cannot start is a non-retryable error naming why."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_supervision import backend_pids
from tests.fakes.runner import FakeServer, free_port
from tests.support.cli import corectl
from tests.support.config import daemon_config, upstream
from tests.support.daemon import ROOT, DaemonProcess, admin_get, running
from tests.support.metrics import scrape, series, total
from tests.support.sse import event_names
from tests.support.wait import wait_for

USER = [{"role": "user", "content": "hi"}]


def fake_cmd(port: int, *, start_delay: float = 0.0, exclusive: tuple[Path, list[int]] | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "tests.fakes", "--kind", "openai", "--port", str(port), "--models", "m"]
    if start_delay:
        cmd += ["--start-delay", str(start_delay)]
    if exclusive is not None:
        log, ports = exclusive
        cmd = [sys.executable, "-m", "tests.support.exclusive", str(log), ",".join(map(str, ports)), "--", *cmd]
    return cmd


def managed(port: int, cmd: list[str], **process) -> dict:
    proc = {"command": cmd, "cwd": str(ROOT), "ready_url": f"http://127.0.0.1:{port}/v1/models",
            "stop_timeout_s": 3, "startsecs": 0.2, "max_restarts": 1, "restart_window_s": 60, **process}
    return upstream(f"http://127.0.0.1:{port}", kind="openai", process=proc)


def config(providers: dict, profiles: dict, **tables) -> str:
    return daemon_config(state={"flush_interval_s": 0.1}, health={"probe_interval_s": 0.5},
                         server={"stream_hold_s": 0.1, "ping_interval_s": 0.2},
                         providers=providers, profiles=profiles, **tables)


def ask(d, profile="default", *, stream=False, timeout=60):
    body = {"model": "m", "max_tokens": 5, "messages": USER, "stream": stream}
    return httpx.post(d.url + "/v1/messages", json=body, headers={"x-coderouter-profile": profile}, timeout=timeout)


def status(d) -> dict:
    return admin_get(d.state_dir / "coderouterd.sock") or {}


def audit(d) -> str:
    p = d.state_dir / "audit.jsonl"
    return p.read_text() if p.exists() else ""


def test_on_demand_start_waits_and_a_stream_gets_pings(tmp_path):
    port = free_port()
    cfg = config({"local": managed(port, fake_cmd(port, start_delay=1.5), start="on_demand")},
                 {"default": ["local"]})
    with running(cfg, tmp_path) as d:
        assert wait_for(lambda: status(d).get("models") is not None, 20)
        assert backend_pids(port) == []  # on demand: nothing runs before a request needs it
        r = ask(d, stream=True)
        assert r.status_code == 200, r.text
        names = event_names(r.text)
        assert "ping" in names and names.index("ping") < names.index("content_block_start"), names
        assert names[-1] == "message_stop"
        assert len(backend_pids(port)) == 1
        assert '"started"' in audit(d) or wait_for(lambda: '"started"' in audit(d), 10)
    assert backend_pids(port) == []


def test_idle_stop_then_the_next_request_starts_it_again_and_is_served(tmp_path):
    port = free_port()
    cfg = config({"local": managed(port, fake_cmd(port), idle_stop_s=1)}, {"default": ["local"]})
    with running(cfg, tmp_path) as d:
        assert wait_for(lambda: ask(d).status_code == 200, 30)
        assert wait_for(lambda: backend_pids(port) == [], 30)  # stopped once idle (start = "always" too)
        procs = wait_for(lambda: (status(d).get("processes") or {}).get("local", {}).get("last_stop_reason"), 10)
        assert procs == "idle"
        assert wait_for(lambda: "reason: idle" in audit(d), 10)
        r = ask(d)
        assert r.status_code == 200, r.text
        assert r.headers["x-coderouter-provider"] == "local" and len(backend_pids(port)) == 1


def test_a_budget_for_one_swaps_models_and_never_runs_both(tmp_path):
    a, b = free_port(), free_port()
    log = tmp_path / "starts.log"
    providers = {
        "coder": managed(a, fake_cmd(a, exclusive=(log, [a, b])), start="on_demand", memory_mb=1000),
        "small": managed(b, fake_cmd(b, exclusive=(log, [a, b])), start="on_demand", memory_mb=1000),
    }
    cfg = config(providers, {"default": ["coder"], "fast": ["small"]}, models={"memory_budget_mb": 1500})
    with running(cfg, tmp_path) as d:
        assert wait_for(lambda: status(d).get("models") is not None, 20)
        for profile in ("default", "fast", "default", "fast", "fast", "default"):
            r = ask(d, profile, stream=profile == "fast")
            assert r.status_code == 200, r.text
            assert r.headers["x-coderouter-provider"] == ("coder" if profile == "default" else "small")
        starts = log.read_text().splitlines()
        assert len(starts) == 5 and all(line.endswith("others_alive=[]") for line in starts), starts
        st = status(d)
        assert st["models"]["resident"] == ["coder"] and st["models"]["memory_held_mb"] == 1000
        assert st["processes"]["small"]["last_stop_reason"] == "room for coder"
        assert wait_for(lambda: "reason: room for small" in audit(d), 10)
        models = corectl(["--socket", str(d.state_dir / "coderouterd.sock"), "models", "list"],
                         env={**d.env, "COLUMNS": "200"})
        assert "room for coder" in models.stdout and "1,000 MB held of 1,500 MB budget" in models.stdout, \
            models.stdout + models.stderr
        metrics = scrape(d)
        assert series(metrics, "coderouter_models_memory_held_mb") == [({}, 1000.0)]
        assert total(metrics, "coderouter_process_last_stop", process="small", reason="room for coder") == 1.0
        now = httpx.get(d.url + "/ui/api/now", timeout=10).json()  # the dashboard's data
        assert now["models"]["resident"] == ["coder"] and now["processes"]["small"]["memory_mb"] == 1000


def test_pinned_is_not_stopped_for_room_but_stops_by_hand(tmp_path):
    a, b = free_port(), free_port()
    providers = {"coder": managed(a, fake_cmd(a), memory_mb=1000, pinned=True),
                 "small": managed(b, fake_cmd(b), start="on_demand", memory_mb=1000)}
    cfg = config(providers, {"default": ["coder"], "fast": ["small"]}, models={"memory_budget_mb": 1500})
    d = DaemonProcess(cfg, tmp_path).start()
    sock = str(d.state_dir / "coderouterd.sock")
    try:
        assert wait_for(lambda: ask(d).status_code == 200, 30)
        r = ask(d, "fast")
        # No room while the pinned model holds its memory: said at once, and not as something to retry.
        assert r.status_code == 500 and r.headers.get("x-should-retry") == "false", r.text
        assert "pinned coder" in r.json()["error"]["message"]
        assert len(backend_pids(a)) == 1 and backend_pids(b) == []
        stop = corectl(["--socket", sock, "stop", "coder"])
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert backend_pids(a) == []
        r = ask(d, "fast")
        assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "small", r.text
    finally:
        d.stop()


@pytest.mark.parametrize("missing", ["binary", "model"])
def test_a_process_that_cannot_start_is_a_non_retryable_error_naming_why(tmp_path, missing):
    port = free_port()
    gone = tmp_path / "nowhere"
    cmd = [str(gone / "llama-server")] if missing == "binary" else [*fake_cmd(port), "-m", str(gone / "m.gguf")]
    cfg = config({"local": managed(port, cmd)}, {"default": ["local"]})
    with running(cfg, tmp_path) as d:
        assert wait_for(lambda: (status(d).get("processes") or {}).get("local", {}).get("state") == "fatal", 20)
        r = ask(d)
        assert r.status_code == 500 and r.headers.get("x-should-retry") == "false", r.text
        assert "retry-after" not in r.headers  # no time to come back at: retrying cannot help
        assert r.json()["error"]["type"] == "api_error"
        assert ("cannot execute" if missing == "binary" else "m.gguf' not found") in r.json()["error"]["message"]
        body = {"model": "m", "max_tokens": 5, "messages": USER}
        oa = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=30)
        assert oa.status_code == 500 and oa.headers.get("x-should-retry") == "false"
        resp = httpx.post(d.url + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
        assert resp.status_code == 400 and resp.headers.get("x-should-retry") == "false"
    check = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(d.config_path), "--check"],
                           cwd=ROOT, env=d.env, capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "process local cannot start" in check.stderr, check.stderr
    assert ("llama-server' not found" if missing == "binary" else "m.gguf' not found") in check.stderr
    cc = corectl(["config", "check", str(d.config_path)], env=d.env)
    assert cc.returncode == 1 and "process local cannot start" in cc.stdout, cc.stdout + cc.stderr


def test_a_request_before_the_managed_server_is_up_waits_and_counts_no_failure(tmp_path):
    port = free_port()
    cfg = config({"local": managed(port, fake_cmd(port, start_delay=1.0))}, {"default": ["local"]})
    with running(cfg, tmp_path) as d:
        r = ask(d)  # at once: the server is not even spawned yet, or still loading
        assert r.status_code == 200, r.text
        assert r.headers["x-coderouter-provider"] == "local"
        assert "DEGRADED" not in audit(d) and "UNHEALTHY" not in audit(d)


def test_failover_first_while_the_local_model_starts_or_wait_when_the_profile_says_so(tmp_path):
    port = free_port()
    with FakeServer("openai", name="remote") as remote:
        local = managed(port, fake_cmd(port, start_delay=1.0), start="on_demand")
        cfg = config({"local": local, "remote": remote.url},
                     {"default": ["local", "remote"],
                      "patient": {"providers": ["local", "remote"], "on_demand_start": "wait"}})
        with running(cfg, tmp_path) as d:
            assert wait_for(lambda: status(d).get("models") is not None, 20)
            r = ask(d)
            assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "remote"
            # ...and the start it triggered goes on: the next request finds the local model up.
            assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "local", 30)
            assert wait_for(lambda: corectl(["--socket", str(d.state_dir / "coderouterd.sock"), "stop",
                                             "local"]).returncode == 0, 10)
            r = ask(d, "patient")
            assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "local", r.text


def test_a_model_that_is_up_is_served_while_another_is_swapped_in(tmp_path):
    a, b, c = free_port(), free_port(), free_port()
    gate = tmp_path / "let-c-start"
    gated_c = [sys.executable, "-m", "tests.support.gated", str(gate), "--", *fake_cmd(c)]
    providers = {"a": managed(a, fake_cmd(a), start="on_demand", memory_mb=1000),
                 "b": managed(b, fake_cmd(b), start="on_demand", memory_mb=1000),
                 "c": managed(c, gated_c, start="on_demand", memory_mb=1000, start_timeout_s=120)}
    cfg = config(providers, {"default": ["a"], "pb": ["b"], "pc": ["c"]}, models={"memory_budget_mb": 2500})
    d = DaemonProcess(cfg, tmp_path).start()

    def state(name: str) -> str | None:
        return (status(d).get("processes") or {}).get(name, {}).get("state")

    try:
        assert wait_for(lambda: status(d).get("models") is not None, 20)
        assert ask(d).status_code == 200 and ask(d, "pb").status_code == 200
        with ThreadPoolExecutor(1) as pool:
            swap = pool.submit(ask, d, "pc", stream=True, timeout=120)
            # c is being swapped in (a, the least recently used, stopped for it) and its start is held open...
            assert wait_for(lambda: state("c") == "starting" and state("a") == "stopped", 30)
            # ...while b, which is up, serves at once: no request for it waits behind the swap.
            r = ask(d, "pb")
            assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "b"
            assert state("c") == "starting"  # the swap was still under way when b answered
            gate.touch()
            done = swap.result()
        assert done.status_code == 200 and "message_stop" in done.text, done.text
        assert status(d)["processes"]["a"]["last_stop_reason"] == "room for c"
    finally:
        d.stop()


def test_metrics_follow_one_upstream_through_its_life(tmp_path):
    # upstream/lifecycle.py, as /metrics shows it: from the start (E14), every move the supervisor's events and
    # the scheduler make: stopped on demand, resident once a request started it, stopped on demand again after a
    # stop by hand (an on-demand model: the next request starts it), resident again.
    port = free_port()
    cfg = config({"local": managed(port, fake_cmd(port), start="on_demand")}, {"default": ["local"]})
    with running(cfg, tmp_path) as d:
        sock = str(d.state_dir / "coderouterd.sock")

        def phase() -> list[str]:
            return [labels["phase"] for labels, v in series(scrape(d), "coderouter_upstream_lifecycle",
                                                            provider="local") if v == 1]

        assert wait_for(lambda: phase() == ["stopped_on_demand"], 20)
        first = scrape(d)
        assert total(first, "coderouter_breaker_state", provider="local") == 0
        assert ("coderouter_health_state", (("provider", "local"),)) in first
        assert ask(d).status_code == 200
        assert phase() == ["resident"] and total(scrape(d), "coderouter_upstream_in_flight", provider="local") == 0
        stop = corectl(["--socket", sock, "stop", "local"])
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert phase() == ["stopped_on_demand"] and backend_pids(port) == []
        r = ask(d)
        assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "local", r.text
        assert phase() == ["resident"]
