"""Slot files checked, not trusted, on the real llama-server (SmolLM2-135M) managed by coderouterd (issue 43).

Two conversations on two slots, each saved in the background when idle; then, on disk, one lane's file is cut
in half (its sidecar left as it was) and the other's is overwritten with the first one's contents (its sidecar
made to match: a lying file). The server is killed -9, the supervisor starts it again, and each lane's next
turn comes:

- the truncated file is refused before the server sees it: no restore is asked, the server stays up (same
  process, no restart: in the attack a truncated file crashed it on restore, a 502 and a restart), the turn is
  recomputed and served, and the refusal is recorded (cache bust in the audit log, `corectl explain`, status);
- the lying file is restored (the server says yes, and restores the other conversation's tokens), and the
  answer's cached tokens show the lane's prefix did not come back: recorded, counted, not a restore."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import httpx
import orjson
import pytest

from tests.support import cli
from tests.support.daemon import DaemonProcess, admin_get, free_port
from tests.support.metrics import scrape, total
from tests.support.real_llama import paths, server_argv
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(900)

CONFIG = """
[server]
port = {PORT}
[state]
flush_interval_s = 0.1
[providers.llama]
kind = "openai"
base_url = "http://127.0.0.1:@LP@/v1"
model = "smollm2"
timeouts = { connect = 5, first_byte = 120, idle = 60, total = 300 }
[providers.llama.process]
command = @ARGV@
ready_url = "http://127.0.0.1:@LP@/health"
start_timeout_s = 60
startsecs = 0.2
[profiles.default]
providers = ["llama"]
health_action = "warn"
[affinity]
clone_min_tokens = 100000
save_idle_after_s = 0.5
"""

# Two conversations with nothing in common past the chat template's first tokens.
ALPHA = "You are a fruit expert. " + " ".join(f"Apple variety {i} is crisp." for i in range(60))
BETA = "You are a ship captain. " + " ".join(f"Harbour {i} has deep water." for i in range(60))


def _body(system: str, question: str) -> dict:
    return {"model": "smollm2", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


class Env:
    def __init__(self, d: DaemonProcess) -> None:
        self.d = d
        self.sock = d.state_dir / "coderouterd.sock"
        self.slots = d.state_dir / "slots"

    def turn(self, body: dict) -> httpx.Response:
        r = httpx.post(self.d.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r

    def process(self) -> dict:
        procs = (admin_get(self.sock, "/v1/processes") or {}).get("processes") or {}
        return procs[0] if isinstance(procs, list) else next(iter(procs.values()))

    def bins(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.slots) if n.endswith(".bin"))
        except FileNotFoundError:
            return []

    def warm(self) -> dict:
        st = admin_get(self.sock)
        return next(p for p in st["providers"] if p["name"] == "llama")["cache"]["slots"]["warm"]

    def corectl(self, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
        env["COLUMNS"] = "200"
        return cli.corectl(["--socket", str(self.sock), *args], env=env, timeout=120)


def _wait(pred, what: str, timeout: float = 300.0):
    got = wait_for(pred, timeout)
    assert got, f"timed out waiting for {what}"
    return got


def _cached(r: httpx.Response) -> tuple[int, int]:
    t = r.json()["timings"]
    return t["cache_n"], t["cache_n"] + t["prompt_n"]


def test_a_truncated_slot_file_is_refused_and_a_lying_one_is_caught_on_the_real_server(tmp_path):
    from coderouterd.state import read_audit

    p = paths()
    port = free_port()
    argv = server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], port, slots=2, ctx_per_slot=2048)
    d = DaemonProcess(CONFIG.replace("@LP@", str(port)).replace("@ARGV@", json.dumps(argv)), tmp_path)
    d.start()
    try:
        e = Env(d)
        _wait(lambda: e.process().get("state") == "ready", "the managed llama-server")
        a1 = _body(ALPHA, "Which apple is best?")
        b1 = _body(BETA, "Which harbour is best?")
        r = e.turn(a1)
        alpha_file = _wait(lambda: (b := e.bins()) and len(b) == 1 and b[0], "alpha's background save")
        _wait(lambda: (e.slots / (alpha_file + ".json")).exists(), "its sidecar")
        a2 = {**a1, "messages": [*a1["messages"], r.json()["choices"][0]["message"],
                                 {"role": "user", "content": "And the second best?"}]}
        r = e.turn(b1)
        beta_file = _wait(lambda: (b := [n for n in e.bins() if n != alpha_file]) and b[0], "beta's background save")
        _wait(lambda: (e.slots / (beta_file + ".json")).exists(), "its sidecar")
        b2 = {**b1, "messages": [*b1["messages"], r.json()["choices"][0]["message"],
                                 {"role": "user", "content": "And the second best?"}]}
        _wait(lambda: e.warm().get("unsaved_lanes") == 0, "both lanes saved as they are")

        # The lie: beta's file holds alpha's KV cache, and its sidecar the size that goes with it.
        alpha = (e.slots / alpha_file).read_bytes()
        (e.slots / beta_file).write_bytes(alpha)
        side = e.slots / (beta_file + ".json")
        side.write_bytes(orjson.dumps({**orjson.loads(side.read_bytes()), "bytes": len(alpha)}))
        # The truncation: alpha's file cut in half, its sidecar untouched.
        (e.slots / alpha_file).write_bytes(alpha[: len(alpha) // 2])

        before = e.process()
        os.kill(before["pid"], signal.SIGKILL)
        server = _wait(lambda: (q := e.process()) and q.get("state") == "ready" and q["pid"] != before["pid"] and q,
                       "the supervisor's restart")

        # Alpha: refused before the server saw the file; recomputed and served by the same server.
        r = e.turn(a2)
        rid_alpha = r.headers["x-request-id"]
        cached, prompt = _cached(r)
        assert cached < 0.5 * prompt, (cached, prompt)  # recomputed: nothing came back from the file
        after = e.process()
        assert after["pid"] == server["pid"] and after["state"] == "ready"
        assert after["restarts_total"] == server["restarts_total"]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        warm = e.warm()
        assert warm["restores_refused"] == 1 and warm["restore_failures"] == 0, warm

        # Beta: the server restores the lying file and says so; the answer's cached tokens say otherwise.
        r = e.turn(b2)
        rid_beta = r.headers["x-request-id"]
        cached, prompt = _cached(r)
        assert cached < 0.5 * prompt, (cached, prompt)
        warm = e.warm()
        assert warm["restores_not_taken"] == 1 and warm["restores"] == 0, warm
        assert e.process()["pid"] == server["pid"]

        # Shown: explain, status, /metrics.
        aff = orjson.loads(e.corectl("explain", rid_alpha, "--json").stdout)["trace"]["affinity"]
        assert aff["slot_restore"]["outcome"] == "refused" and "truncated" in aff["slot_restore"]["problem"]
        assert aff["cache_bust"]["cause"] == "slot file"
        aff = orjson.loads(e.corectl("explain", rid_beta, "--json").stdout)["trace"]["affinity"]
        assert aff["slot_restore"]["outcome"] == "did not take" and aff["cache_bust"]["cause"] == "slot file"
        text = e.corectl("explain", rid_beta).stdout
        assert "slot restore" in text and "did not take" in text, text
        status = e.corectl("status").stdout
        assert "1 file(s) refused (truncated or gone)" in status and "1 restore(s) did not take" in status, status
        m = scrape(d)
        assert total(m, "coderouter_slot_restores_unproven_total", provider="llama", why="refused") == 1.0
        assert total(m, "coderouter_slot_restores_unproven_total", provider="llama", why="not_taken") == 1.0
        assert total(m, "coderouter_slot_restores_total", provider="llama") == 0.0
    finally:
        d.stop()
    # Journaled and audited: each turn's cache bust names the slot file.
    busts = {b["request_id"]: b for b in read_audit(d.state_dir) if b["kind"] == "cache_bust"}
    assert busts[rid_alpha]["cause"] == "slot file" and "refused (truncated" in busts[rid_alpha]["segment"]
    assert busts[rid_beta]["cause"] == "slot file" and "did not take" in busts[rid_beta]["segment"]
