"""What the attack and the real-server QA of issue 43 found in a managed server's lifecycle, against the real daemon
with real child processes:

- N9: a listener that takes an on-demand server's port after the daemon spawned it, and before it binds, is refused
  as an impostor: nothing is relayed to it, the client is served elsewhere, and the audit log says why.
- D2: after `kill -9` of the daemon, the restarted one adopts the on-demand server left running and counts it
  against the budget: asking for the other model stops it first, never runs both, and no request fails.
- D1: planned stops (idle, `corectl stop`, room for another) are audited as planned, never as a crash."""

from __future__ import annotations

import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import orjson
import psutil

from tests.e2e.test_ondemand import ask, audit, config, fake_cmd, managed, status
from tests.e2e.test_supervision import backend_pids
from tests.fakes.runner import FakeServer, free_port
from tests.support.cli import corectl
from tests.support.daemon import DaemonProcess, running
from tests.support.wait import wait_for


def process_events(d, process: str) -> list[dict]:
    out = []
    for line in audit(d).splitlines():
        rec = orjson.loads(line)
        if rec.get("kind") == "process" and rec.get("process") == process and rec.get("primary", True):
            out.append(rec)
    return out


def test_an_impostor_on_the_port_at_ready_is_refused_and_never_relayed_to(tmp_path):
    port = free_port()
    gate = tmp_path / "bind-now"  # never created: our server would bind only after it
    cmd = [*fake_cmd(port), "--start-when", str(gate)]
    with FakeServer("openai", name="backup") as backup:
        cfg = config({"llm": managed(port, cmd, start="on_demand"), "backup": backup.url},
                     {"default": ["llm", "backup"]})
        with running(cfg, tmp_path) as d, ThreadPoolExecutor(1) as pool:
            assert wait_for(lambda: status(d).get("models") is not None, 20)
            pending = pool.submit(ask, d)  # starts the on-demand server, and waits for it
            assert wait_for(lambda: backend_pids(port), 30), "the daemon never spawned the server"
            [child] = backend_pids(port)
            # The attacker: binds the port in the window and answers every probe (its owner is this test's process).
            with FakeServer("openai", name="impostor", port=port) as impostor:
                r = pending.result(timeout=120)
                assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "backup", r.text
                llm = wait_for(lambda: (status(d).get("processes") or {}).get("llm", {}).get("fatal_reason"), 30)
                assert llm and "refused as an impostor" in llm and f"held by pid {os.getpid()}" in llm, llm
                assert f"not by the server we started (pid {child})" in llm, llm
                # Asked again: the provider is known not to start; the answer still comes from the backup.
                r2 = ask(d)
                assert r2.status_code == 200 and r2.headers["x-coderouter-provider"] == "backup", r2.text
                # No prompt ever reached it (its GETs are the readiness probes, and server discovery's /props).
                relayed = [q for q in impostor.requests if q.get("method") != "GET"]
                assert relayed == [], relayed
            assert wait_for(lambda: backend_pids(port) == [], 10)  # our child was stopped
            fatal = wait_for(lambda: [e for e in process_events(d, "llm") if e["event"] == "fatal"], 20)
            assert fatal and "refused as an impostor" in fatal[0]["detail"], process_events(d, "llm")
            assert not [e for e in process_events(d, "llm") if e["event"] == "ready"]


class Overlap:
    """Polls the process table for the two servers: the most that ran at once, from start to stop."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = sum(1 for p in self.ports if any(_running(pid) for pid in backend_pids(p)))
            self.most = max(self.most, alive)
            self._stop.wait(0.02)

    def __enter__(self) -> Overlap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kill_9_then_restart_adopts_the_surviving_on_demand_model_within_the_budget(tmp_path):
    a, b = free_port(), free_port()
    log = tmp_path / "starts.log"
    providers = {
        "coder": managed(a, fake_cmd(a, exclusive=(log, [a, b])), start="on_demand", memory_mb=1000),
        "small": managed(b, fake_cmd(b, exclusive=(log, [a, b])), start="on_demand", memory_mb=1000),
    }
    cfg = config(providers, {"default": ["coder"], "fast": ["small"]}, models={"memory_budget_mb": 1500})
    d = DaemonProcess(cfg, tmp_path).start()
    try:
        with Overlap([a, b]) as overlap:
            r = ask(d)
            assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "coder", r.text
            [coder] = backend_pids(a)
            d.kill9()  # the daemon, not its child
            assert backend_pids(a) == [coder]
            with running(cfg, tmp_path, port=d.port) as d2:
                st = wait_for(lambda: (got := status(d2)).get("models") and got, 20)
                # Adopted before the proxy answered: resident, holding its memory, and the process is ours.
                assert st["models"]["resident"] == ["coder"] and st["models"]["memory_held_mb"] == 1000, st["models"]
                proc = st["processes"]["coder"]
                assert proc["state"] == "ready" and proc["adopted"] and proc["pid"] == coder, proc
                r = ask(d2, "fast")
                assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "small", r.text
                assert wait_for(lambda: backend_pids(a) == [], 10)  # stopped to make room, not left beside it
                st = status(d2)
                assert st["models"]["resident"] == ["small"], st["models"]
                assert st["processes"]["coder"]["last_stop_reason"] == "room for small"
                r = ask(d2)  # and back: the swap works as it did before the crash
                assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "coder", r.text
                stops = wait_for(lambda: [e for e in process_events(d2, "coder") if e["event"] == "stopped"], 10)
                assert stops and stops[0]["detail"].startswith("planned stop, reason: room for small"), stops
        assert overlap.most == 1, "both models ran at once"
        starts = log.read_text().splitlines()
        assert len(starts) == 3 and all(line.endswith("others_alive=[]") for line in starts), starts
    finally:
        d.stop()
        for p in backend_pids(a) + backend_pids(b):
            os.kill(p, signal.SIGKILL)


def test_planned_stops_are_audited_as_planned_never_as_a_crash(tmp_path):
    """A server that exits 1 on a second SIGTERM (tests/support/interruptible.py, like llama-server): an idle stop,
    a stop to make room and `corectl stop` each signal it once; it exits 0, and the audit log says planned."""
    a, b = free_port(), free_port()
    sig_log = tmp_path / "signals.log"

    def interruptible(port: int, **process) -> dict:
        cmd = [sys.executable, "-m", "tests.support.interruptible", "--port", str(port), "--log", str(sig_log),
               "--grace", "0.3", "--children", "1"]
        return managed(port, cmd, stop_timeout_s=10, **process)

    providers = {"coder": interruptible(a, start="on_demand", memory_mb=1000, idle_stop_s=1),
                 "small": interruptible(b, start="on_demand", memory_mb=1000)}
    cfg = config(providers, {"default": ["coder"], "fast": ["small"]}, models={"memory_budget_mb": 1500})
    with running(cfg, tmp_path) as d:
        sock = str(d.state_dir / "coderouterd.sock")
        assert ask(d).status_code == 200  # coder starts ...
        assert wait_for(lambda: (status(d).get("processes") or {}).get("coder", {}).get("last_stop_reason"), 30)
        assert ask(d, "fast").status_code == 200  # ... stops when idle; small starts
        assert ask(d).status_code == 200  # coder again: small stops to make room
        stop = corectl(["--socket", sock, "stop", "coder"])  # and by hand
        assert stop.returncode == 0, stop.stdout + stop.stderr

        def stopped() -> list[dict]:
            evs = [e for p in ("coder", "small") for e in process_events(d, p) if e["event"] == "stopped"]
            return evs if len(evs) >= 3 else []

        evs = wait_for(stopped, 20)
        details = sorted(e["detail"] for e in evs)
        assert details == ["planned stop, reason: idle; exited with code 0",
                           "planned stop, reason: manual; exited with code 0",
                           "planned stop, reason: room for coder; exited with code 0"], details
        crashes = [e for p in ("coder", "small") for e in process_events(d, p)
                   if e["event"] in ("exited", "fatal", "restarting")]
        assert crashes == [], crashes
    lines = sig_log.read_text().splitlines()
    assert not [ln for ln in lines if "sigterm 2" in ln or "exit 1" in ln], lines
    assert sum("sigterm 1" in ln for ln in lines) == 6, lines  # 3 stops x (server + its worker)
