"""An impostor on a managed server's port (issue 34, item 2): the real daemon refuses to adopt a listener that
is not its configured command, routes around it, and `corectl status` and `corectl doctor` name the port's
owner. The impostor is an in-process fake: the port's owner is this test's own process."""

from __future__ import annotations

import os

import httpx
import orjson

from tests.e2e.test_corectl_ops import corectl, sock_of
from tests.e2e.test_supervision import managed_ollama
from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config
from tests.support.daemon import DaemonProcess, admin_get
from tests.support.wait import wait_for


def test_impostor_is_refused_routed_around_and_named(tmp_path):
    with FakeServer("ollama", name="impostor") as impostor, FakeServer("openai", name="backup") as backup:
        cfg = daemon_config(providers={"llm": managed_ollama(impostor.port), "backup": backup.url},
                            profiles={"default": ["llm", "backup"]})
        d = DaemonProcess(cfg, tmp_path).start()
        sock = sock_of(d)
        try:
            def fatal() -> dict | None:
                snap = ((admin_get(sock) or {}).get("processes") or {}).get("llm") or {}
                return snap if snap.get("state") == "fatal" else None

            snap = wait_for(fatal, 20)
            assert snap, "the impostor's port was not refused"
            reason = snap["fatal_reason"]
            assert f"pid {os.getpid()}" in reason and "not the configured command" in reason, reason
            assert snap["external"] is False

            r = httpx.post(d.url + "/v1/chat/completions", timeout=10,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "backup"
            assert not [q for q in impostor.requests if "chat" in q.get("path", "")]

            # Self-healing does not take the impostor's answers for a recovery: it waits for the process to be
            # started again (recovering, no probe scheduled), and nothing says "rejoined" for llm.
            def waiting_for_a_start() -> bool:  # the self-healer hears of the fatal state through its callback
                llm = ((admin_get(sock) or {}).get("processes") or {}).get("llm") or {}
                return llm.get("recovering") is True and llm.get("next_probe_at") is None

            assert wait_for(waiting_for_a_start, 20), admin_get(sock)
            audit_file = d.state_dir / "audit.jsonl"

            def audited() -> str | None:  # the writer thread flushes in batches: the process's fatal event is in
                text = audit_file.read_text() if audit_file.is_file() else ""
                return text if '"fatal"' in text else None

            audit = wait_for(audited, 20)
            assert audit, "the fatal process event was never audited"
            rejoined = [ln for ln in audit.splitlines() if '"rejoined"' in ln and '"llm"' in ln]
            assert not rejoined, rejoined

            human = corectl("status", sock=sock)
            assert human.returncode == 0, human.stderr
            assert f"pid {os.getpid()}" in " ".join(human.stdout.split()), human.stdout

            doc = corectl("doctor", "llm", "--config", str(d.config_path), "--json", timeout=120)
            report = orjson.loads(doc.stdout)
            [check] = [c for c in report["providers"][0]["checks"] if c["name"] == "process"]
            assert check["status"] == "fail" and f"pid {os.getpid()}" in check["message"], check
            assert doc.returncode == 2
        finally:
            d.stop()
