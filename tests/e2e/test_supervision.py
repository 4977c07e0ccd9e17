"""The daemon owns real backend processes: starts them, notices crashes at once, fails over while it restarts
them exactly once, lets them rejoin, and never leaves an orphan or a duplicate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fakes.runner import FakeServer, free_port
from tests.support.config import daemon_config, upstream
from tests.support.daemon import ROOT, DaemonProcess, admin_get, running
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

USER = [{"role": "user", "content": "hi"}]


def managed_ollama(port: int) -> dict:
    """A provider whose server (a standalone fake Ollama on `port`) the daemon starts and supervises."""
    cmd = [sys.executable, "-m", "tests.fakes", "--kind", "ollama", "--port", str(port), "--models", "qwen3"]
    process = {"command": cmd, "cwd": str(ROOT), "ready_url": f"http://127.0.0.1:{port}/api/tags",
               "stop_timeout_s": 2, "startsecs": 0.2, "max_restarts": 3, "restart_window_s": 60}
    return upstream(f"http://127.0.0.1:{port}", kind="openai", process=process)


def managed_config(port: int, fallback_url: str, *, probe_interval_s: float = 0.5) -> str:
    return daemon_config(
        state={"flush_interval_s": 0.1},
        health={"probe_interval_s": probe_interval_s, "recovery_backoff_s": [0.3, 0.6]},
        providers={"ollama-qwen3": managed_ollama(port), "backup": fallback_url},
        profiles={"default": ["ollama-qwen3", "backup"], "coding": ["ollama-qwen3", "backup"]})


def backend_pids(port: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "tests.fakes" in cmd and str(port) in cmd:
            out.append(p.pid)
    return out




def ask(d, profile="default", timeout: float = 10):
    return httpx.post(d.url + "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER},
                      headers={"x-coderouter-profile": profile}, timeout=timeout)


def _process(d) -> dict | None:
    """The daemon's one managed process as GET /v1/processes shows it, or None while the socket is silent."""
    snap = admin_get(d.state_dir / "coderouterd.sock", "/v1/processes")
    return next(iter(snap["processes"].values())) if snap and snap["processes"] else None


def in_flight(d) -> float:
    return total(scrape(d), "coderouter_requests_in_flight")


@pytest.fixture
def backup():
    with FakeServer("openai", name="backup") as f:
        yield f


def test_crash_is_failed_over_restarted_once_and_rejoins(tmp_path, backup):
    port = free_port()
    with running(managed_config(port, backup.url), tmp_path) as d:
        assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "ollama-qwen3", 20)
        [pid] = backend_pids(port)
        httpx.post(f"http://127.0.0.1:{port}/_fake/crash")
        # Requests during the outage are served by the backup, with no error visible to the client.
        served = []

        def served_by_backup() -> bool:
            r = ask(d, "coding")
            assert r.status_code == 200
            served.append(r.headers["x-coderouter-provider"])
            return served[-1] == "backup"

        assert wait_for(served_by_backup, 15, step=0), served
        new = wait_for(lambda: [p for p in backend_pids(port) if p != pid], 15)
        assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "ollama-qwen3", 15)
        # Routing resumes at "ready"; "rejoined" follows the first recovery probe and the writer's next flush.
        words = ('"exited"', '"excluded"', '"rejoined"')
        assert wait_for(lambda: all(w in (d.state_dir / "audit.jsonl").read_text() for w in words), 15), \
            (d.state_dir / "audit.jsonl").read_text()
        # Exactly one new process, even though two profiles and the health monitor all saw the outage: the
        # supervisor's own count, read once all of them have (rejoined), not a pause that hopes they have.
        proc = _process(d)
        assert proc and proc["restarts_total"] == 1 and proc["pid"] == new[0], proc
        assert backend_pids(port) == new
    assert backend_pids(port) == []  # no orphans after SIGTERM


def test_external_backend_is_adopted_not_duplicated(tmp_path, backup):
    port = free_port()
    # The user runs the very command the process is configured with: verified, so adopted.
    ext = subprocess.Popen(managed_ollama(port)["process"]["command"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert ext.stdout.readline().startswith("READY")
        with running(managed_config(port, backup.url), tmp_path) as d:
            assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "ollama-qwen3", 10)
            # The supervisor's own record says it took the user's server as external rather than starting one.
            proc = _process(d)
            assert proc and proc["external"] and proc["state"] == "ready" and proc["pid"] is None, proc
            assert backend_pids(port) == [ext.pid]
        assert ext.poll() is None  # the user's own server is left running
    finally:
        ext.kill()
        ext.wait()


def test_daemon_kill_9_then_restart_adopts_without_duplicate(tmp_path, backup):
    port = free_port()
    cfg = managed_config(port, backup.url)
    d = DaemonProcess(cfg, tmp_path).start()
    try:
        assert wait_for(lambda: len(backend_pids(port)) == 1, 20)
        assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "ollama-qwen3", 20)
        [pid] = backend_pids(port)
        assert wait_for(lambda: (proc := _process(d)) and proc["state"] == "ready" and proc["pid"] == pid, 20)
        d.kill9()
        with running(cfg, tmp_path, port=d.port) as d2:
            assert wait_for(lambda: ask(d2).headers.get("x-coderouter-provider") == "ollama-qwen3", 20)
            proc = _process(d2)
            assert proc and proc["adopted"] and proc["pid"] == pid, proc
            assert backend_pids(port) == [pid]  # adopted: same process, no second copy
        assert wait_for(lambda: backend_pids(port) == [], 5)
    finally:
        for p in backend_pids(port):
            os.kill(p, signal.SIGKILL)


def test_unmanaged_provider_restart_command_runs_when_unhealthy(tmp_path, backup):
    marker = tmp_path / "restarted"
    with FakeServer("openai", name="flaky", behaviour="500") as flaky:
        cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
        cfg = daemon_config(health={"probe_interval_s": 60, "recovery_backoff_s": [0.2, 0.4]},
                            providers={"flaky": upstream(flaky.url, restart_command=cmd), "backup": backup.url},
                            profiles={"default": {"providers": ["flaky", "backup"]}})
        with running(cfg, tmp_path) as d:
            for _ in range(3):
                assert ask(d).status_code == 200
            assert wait_for(marker.exists, 10)  # UNHEALTHY after 3 failures -> restart_command ran, detached
            flaky.set_behaviour("ok")
            # probe-only recovery with back-off brings it back at its original place in the chain
            assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "flaky", 10)


def lone_managed_config(port: int, start_when: Path) -> str:
    """One managed backend and nothing behind it: a request has nowhere else to go. The backend binds its port
    only once `start_when` exists, so a test decides when it becomes ready."""
    cmd = [sys.executable, "-m", "tests.fakes", "--kind", "openai", "--port", str(port), "--models", "qwen3",
           "--start-when", str(start_when)]
    process = {"command": cmd, "cwd": str(ROOT), "ready_url": f"http://127.0.0.1:{port}/health",
               "stop_timeout_s": 2, "startsecs": 0.1, "start_timeout_s": 30}
    return daemon_config(health={"recovery_backoff_s": [0.3, 0.6]},
                         providers={"local": upstream(f"http://127.0.0.1:{port}", kind="openai", process=process)},
                         profiles={"default": {"providers": ["local"], "health_action": "warn"}})


def test_requests_wait_for_a_starting_or_restarting_backend_instead_of_failing(tmp_path):
    port, gate = free_port(), tmp_path / "start-backend"
    with running(lone_managed_config(port, gate), tmp_path) as d:
        # Sent while the backend is still starting: it cannot bind before the gate exists, and the gate is made
        # only once the daemon holds the request. So the request did wait, whatever the machine's load.
        answer: dict = {}
        t = threading.Thread(target=lambda: answer.update(r=ask(d, timeout=60)))
        t.start()
        assert wait_for(lambda: in_flight(d) >= 1, 30), "the request never reached the daemon"
        gate.touch()
        t.join(60)
        r = answer["r"]
        assert r.status_code == 200, r.text
        trace = admin_get(d.state_dir / "coderouterd.sock", f"/v1/requests/{r.headers['x-request-id']}")
        assert trace and any("waited for local" in n.get("why", "") for n in trace["order_notes"]), trace
        pid = wait_for(lambda: backend_pids(port))[0]
        os.kill(pid, signal.SIGKILL)
        # Sent once the supervisor has seen the crash (no longer "ready" with the old pid), so the request
        # finds it restarting: wait, then serve.
        assert wait_for(lambda: (proc := _process(d)) and (proc["state"] != "ready" or proc["pid"] != pid), 30)
        r = ask(d, timeout=60)
        assert r.status_code == 200, r.text
        assert backend_pids(port) and backend_pids(port)[0] != pid


def test_a_fatal_backend_fixed_by_a_reload_rejoins(tmp_path, backup):
    """Self-healing waits for a fatal process to be started again; a reload that fixes its command replaces the
    process object it waits on. The recovery must follow the new process, not hold the provider out for good."""
    port = free_port()
    good = managed_config(port, backup.url)
    bad = good.replace(sys.executable, str(tmp_path / "no-such-python"), 1)
    assert bad != good
    with running(bad, tmp_path) as d:
        audit = d.state_dir / "audit.jsonl"
        # Fatal at once (a bad path): self-healing excludes it and waits; the backup serves meanwhile.
        assert wait_for(lambda: audit.exists() and all(w in audit.read_text() for w in ('"fatal"', '"excluded"')),
                        20), audit.read_text() if audit.exists() else "no audit yet"
        assert ask(d).headers.get("x-coderouter-provider") == "backup"
        d.config_path.write_text(good.replace("{PORT}", str(d.port)))  # as DaemonProcess writes it
        d.signal(signal.SIGHUP)
        assert wait_for(lambda: ask(d).headers.get("x-coderouter-provider") == "ollama-qwen3", 30), d.log()[-3000:]
        assert wait_for(lambda: '"rejoined"' in audit.read_text(), 15), audit.read_text()
    assert backend_pids(port) == []
