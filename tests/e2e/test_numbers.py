"""Numbers you can trust: after real traffic and real faults against the real daemon, /metrics, the journal, the
audit log and the client's own count tell the same story."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter

import httpx
import pytest

from coderouterd.state.audit import read_audit
from coderouterd.state.journal_reader import journal_rows
from coderouterd.state.store import Store
from tests.e2e.test_supervision import backend_pids, managed_config, managed_ollama, wait_for
from tests.fakes.runner import FakeServer, free_port
from tests.support.config import daemon_config
from tests.support.daemon import DaemonProcess, running
from tests.support.metrics import scrape, total

USER = [{"role": "user", "content": "hi"}]



def one_provider(url: str) -> str:
    """A daemon config with one OpenAI-compatible provider `a` at `url` and the default profile on it."""
    return f"""
[server]
port = {{PORT}}
[providers.a]
base_url = "{url}/v1"
[profiles.default]
providers = ["a"]
"""

def anthropic(d, profile=None, stream=False, timeout=20):
    headers = {"x-coderouter-profile": profile} if profile else {}
    return httpx.post(d.url + "/v1/messages", json={"model": "m", "max_tokens": 5, "stream": stream,
                                                    "messages": USER}, headers=headers, timeout=timeout)


def openai(d, profile=None, stream=False, timeout=20):
    headers = {"x-coderouter-profile": profile} if profile else {}
    return httpx.post(d.url + "/v1/chat/completions", json={"model": "m", "stream": stream, "messages": USER},
                      headers=headers, timeout=timeout)


def admin(d) -> httpx.Client:
    sock = str(d.state_dir / "coderouterd.sock")
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://coderouterd", timeout=10)


# -- race losers ---------------------------------------------------------------------------------------------


def test_race_with_two_healthy_racers_records_no_fallback(tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_first_byte;delay=0.6") as a, \
            FakeServer("openai", name="b") as b:
        cfg = f"""
[server]
port = {{PORT}}
stream_hold_s = 0.2
[state]
flush_interval_s = 0.1
[providers.a]
base_url = "{a.url}/v1"
[providers.b]
base_url = "{b.url}/v1"
[profiles.default]
providers = ["a", "b"]
mode = "race"
race_width = 2
"""
        with running(cfg, tmp_path) as d:
            for stream in (False, True, False):
                r = anthropic(d, stream=stream)
                assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "b"
            assert wait_for(lambda: total(scrape(d), "coderouter_requests_total") == 3, 5)
            s = scrape(d)
            assert total(s, "coderouter_failovers_total") == 0
            assert total(s, "coderouter_attempts_total", provider="a", outcome="lost") == 3
        rows = journal_rows(d.state_dir / "state.db")
        assert len(rows) == 3
        for row in rows:
            assert row["fallback_count"] == 0, row
            assert "losers=a" in row["race_outcome"] and row["race_outcome"].startswith("winner=b"), row
        assert read_audit(d.state_dir, kind="fallback_used") == []


# -- pools ---------------------------------------------------------------------------------------------------


def test_reload_that_replaces_a_pool_lets_its_stream_finish_and_shutdown_closes_everything(tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_stream;chunk_delay=0.3") as a:
        cfg = one_provider(a.url)
        d = DaemonProcess(cfg, tmp_path).start()
        try:
            assert anthropic(d).status_code == 200
            result = {}
            t = threading.Thread(target=lambda: result.setdefault("r", anthropic(d, stream=True)))
            t.start()
            wait_for(lambda: a.active >= 1, 5, 0.01)
            # New pool settings for `a`: its pool is replaced while the stream still runs through it.
            with admin(d) as c:
                d.config_path.write_text(d.config_path.read_text().replace(
                    '[providers.a]\n', '[providers.a]\ntimeouts = { connect = 7 }\n'))
                assert c.post("/v1/reload").json()["ok"]
            t.join(30)
            r = result["r"]
            assert r.status_code == 200 and "message_stop" in r.text and "error" not in r.text
            assert anthropic(d, stream=True).status_code == 200  # the new pool serves
        finally:
            assert d.stop() == 0
        log = d.log()
        assert "Unclosed" not in log, log


# -- in-flight -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("http_version", ["1.1", "1.0"])
def test_a_client_that_leaves_frees_its_request_at_once(tmp_path, http_version):
    """The client hangs up while the upstream has not answered: the request is cancelled at once (our protocol's
    disconnect callback, no watcher task; without it this request would hang for good) and the journal says 499.
    HTTP/1.0 connections (close-delimited responses) get the same callback."""
    with FakeServer("openai", name="a", behaviour="hang") as a:
        d = DaemonProcess(one_provider(a.url), tmp_path).start()
        try:
            body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
            host, port = d.url.split("//")[1].split(":")
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/chat/completions HTTP/%s\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (http_version.encode(), len(body), body))
            assert wait_for(lambda: a.active >= 1, 5, 0.01)
            assert total(scrape(d), "coderouter_requests_in_flight") == 1
            s.close()
            assert wait_for(lambda: total(scrape(d), "coderouter_requests_in_flight") == 0, 3, 0.02)
        finally:
            assert d.stop() == 0
        rows = journal_rows(d.state_dir / "state.db")
        assert [(r["status"], r["error_class"]) for r in rows] == [(499, "client_disconnected")]


def test_in_flight_gauge_counts_requests_being_served(tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_first_byte;delay=1.5") as a:
        cfg = one_provider(a.url)
        with running(cfg, tmp_path) as d:
            threads = [threading.Thread(target=anthropic, args=(d,)), threading.Thread(target=openai, args=(d,))]
            for t in threads:
                t.start()
            assert wait_for(lambda: a.active >= 2, 5, 0.01)
            s = scrape(d)
            assert total(s, "coderouter_requests_in_flight", ingress="anthropic") == 1
            assert total(s, "coderouter_requests_in_flight", ingress="openai") == 1
            for t in threads:
                t.join(10)
            assert total(scrape(d), "coderouter_requests_in_flight") == 0


# -- health after a daemon restart ---------------------------------------------------------------------------


def test_managed_provider_health_restarts_from_its_readiness_not_a_saved_unhealthy(tmp_path):
    port = free_port()
    with FakeServer("openai", name="backup") as backup:
        # An hour between probe rounds: only a probe at readiness can judge the backend before the next tick.
        cfg = managed_config(port, backup.url, probe_interval_s=3600)
        d = DaemonProcess(cfg, tmp_path).start()
        try:
            assert wait_for(lambda: anthropic(d).headers.get("x-coderouter-provider") == "ollama-qwen3", 20)
            d.kill9()
            # What a crash can leave behind: the provider saved UNHEALTHY just before the daemon died.
            store = Store(d.state_dir / "state.db")
            store.open()
            store.set("health", "ollama-qwen3", "UNHEALTHY")
            store.close()
            with running(cfg, tmp_path, port=d.port) as d2:
                # A ceiling 60x below the hour between probe rounds: only the probe at readiness can pass it.
                assert wait_for(lambda: anthropic(d2).headers.get("x-coderouter-provider") == "ollama-qwen3", 60)
                with admin(d2) as c:
                    health = c.get("/v1/status").json()["health"]["ollama-qwen3"]
                assert health["state"] == "HEALTHY" and health["last_probe"]["ok"], health
        finally:
            d.stop()
            for pid in backend_pids(port):
                os.kill(pid, signal.SIGKILL)


# -- the four views agree ------------------------------------------------------------------------------------


def _consistency_config(port: int, flaky, backup, a, b) -> str:
    return daemon_config(
        state={"flush_interval_s": 0.1}, health={"probe_interval_s": 1, "recovery_backoff_s": [0.3, 0.6]},
        providers={"local": managed_ollama(port), "backup": backup.url, "flaky": flaky.url, "a": a.url, "b": b.url},
        profiles={"default": ["local", "backup"], "fo": {"providers": ["flaky", "backup"], "health_action": "warn"},
                  "race": {"providers": ["a", "b"], "mode": "race", "race_width": 2}})


def test_metrics_journal_audit_and_client_agree_after_traffic_and_faults(tmp_path):
    port = free_port()
    with FakeServer("openai", name="flaky") as flaky, FakeServer("openai", name="backup") as backup, \
            FakeServer("openai", name="a", behaviour="slow_first_byte;delay=0.2") as a, \
            FakeServer("openai", name="b") as b:
        d = DaemonProcess(_consistency_config(port, flaky, backup, a, b), tmp_path).start()
        answered = Counter()  # status -> responses the client got
        lock = threading.Lock()
        stop = threading.Event()
        kills = 0

        def counted(call, *args, **kw) -> httpx.Response:
            r = call(*args, **kw)
            with lock:
                answered[r.status_code] += 1
            return r

        def worker(i: int) -> None:
            calls = [(anthropic, None, False), (anthropic, None, True), (openai, "fo", False),
                     (openai, "race", True), (anthropic, "fo", True), (anthropic, "race", False)]
            n = i
            while not stop.is_set():
                call, profile, stream = calls[n % len(calls)]
                counted(call, d, profile, stream)
                n += 1

        def more_answered(n: int) -> None:
            with lock:
                seen = sum(answered.values())
            assert wait_for(lambda: sum(answered.values()) >= seen + n, step=0.02), answered

        try:
            assert wait_for(lambda: counted(anthropic, d).headers.get("x-coderouter-provider") == "local", 20)
            workers = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for t in workers:
                t.start()
            try:
                for _ in range(2):  # kill -9 of the managed child, then wait for it to serve again
                    more_answered(10)  # traffic before each fault (counted, not slept for)
                    [pid] = backend_pids(port)
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                    assert wait_for(lambda pid=pid: [p for p in backend_pids(port) if p != pid], 20)
                    with admin(d) as c:
                        assert wait_for(lambda c=c: c.get("/v1/status").json()["processes"]["local"]["state"]
                                        == "ready", 20)
                flaky.set_behaviour("500")  # an upstream 500 window: real failovers, a few of them
                failed_before = flaky.count("/v1/chat/completions")
                assert wait_for(lambda: flaky.count("/v1/chat/completions") >= failed_before + 2, step=0.02)
                flaky.set_behaviour("ok")
                with admin(d) as c:
                    assert c.post("/v1/profile/use", json={"name": "fo"}).status_code == 200
                    more_answered(5)
                    assert c.post("/v1/profile/use", json={"name": "default"}).status_code == 200
                more_answered(5)
            finally:
                stop.set()
                for t in workers:
                    t.join(30)
            client_total = sum(answered.values())
            assert answered[200] > 20, answered
            assert wait_for(lambda: total(scrape(d), "coderouter_requests_total") >= client_total, 10)
            time.sleep(0.3)
            s = scrape(d)
        finally:
            d.stop()
            for pid in backend_pids(port):
                os.kill(pid, signal.SIGKILL)

    rows = journal_rows(d.state_dir / "state.db")
    audit = read_audit(d.state_dir)
    # 1. requests: /metrics = journal = the client's count, status by status
    assert total(s, "coderouter_requests_total") == len(rows) == client_total, (answered, len(rows))
    for status, n in answered.items():
        assert total(s, "coderouter_requests_total", status=str(status)) == n
        assert sum(1 for r in rows if r["status"] == status) == n
    # 2. restarts: /metrics = restart records in the audit = the processes the test killed
    restarts = [r for r in audit if r["kind"] == "process" and r["event"] == "restarting" and r["primary"]]
    assert total(s, "coderouter_process_restarts_total", process="local") == len(restarts) == kills, restarts
    # 3. failovers: /metrics = journal rows with a real failed attempt = fallback_used records
    failed_rows = [r for r in rows if any(a["outcome"] == "failed" for a in r["attempts"]) and r["provider"]]
    fallback_used = [r for r in audit if r["kind"] == "fallback_used"]
    assert failed_rows, "the fault schedule produced no failover"
    assert total(s, "coderouter_failovers_total") == len(failed_rows) == len(fallback_used)
    assert sum(r["fallback_count"] for r in rows) == len(failed_rows)
    assert {r["request_id"] for r in fallback_used} == {r["request_id"] for r in failed_rows}
    # race rows had losers, none of them counted as a failover
    assert any("losers=" in (r["race_outcome"] or "") for r in rows)
    # 4. nothing stuck
    assert total(s, "coderouter_requests_in_flight") == 0
    assert "Unclosed" not in d.log()
