"""Issue 43 acceptance: an on-demand model walked through its lifecycle, with `corectl status` (its JSON and the
table a human reads), /metrics, the dashboard's /ui/api/now and a client's error showing the same word at each
step: stopped on demand -> starting -> resident -> breaker open (a failing fake) -> half-open -> recovered ->
idle-stopped.

The model is a real child process (the fake server, managed by the daemon). Its behaviour survives a restart by
self-healing through a file its command reads at each start, and its first start is held on another file, so
"starting" lasts as long as the test needs it to. Each step is read from every surface between two reads of the
admin view that agree (a bracket), so a state that moves on while the surfaces are read is read again, never
compared half-old, half-new."""

from __future__ import annotations

import re
import shlex
import sys
import threading
from pathlib import Path

import httpx
import orjson

from tests.fakes.runner import free_port
from tests.support.cli import corectl
from tests.support.config import daemon_config, upstream
from tests.support.daemon import ROOT, admin_get, running
from tests.support.metrics import scrape, series
from tests.support.wait import wait_for

USER = [{"role": "user", "content": "hi"}]
RECOVERY_S = 6  # the breaker's time out: long enough to read every surface while it is open
IDLE_STOP_S = 20  # long enough to read half-open and the recovery before the idle stop


def _config(port: int, gate: Path, toggle: Path) -> str:
    fake = (f"exec {shlex.quote(sys.executable)} -m tests.fakes --kind openai --port {port} --models m "
            f"--start-when {shlex.quote(str(gate))} --behaviour \"$(cat {shlex.quote(str(toggle))})\"")
    proc = {"command": ["sh", "-c", fake], "cwd": str(ROOT), "ready_url": f"http://127.0.0.1:{port}/v1/models",
            "stop_timeout_s": 3, "startsecs": 0.2, "max_restarts": 10, "restart_window_s": 60,
            "start": "on_demand", "idle_stop_s": IDLE_STOP_S}
    return daemon_config(
        state={"flush_interval_s": 0.1}, server={"stream_hold_s": 0.1, "ping_interval_s": 0.2},
        breaker={"failures": 1, "recovery_s": RECOVERY_S},
        # Self-healing probes and retries once, right after its restart: never the half-open trial the test reads.
        health={"probe_interval_s": 600, "recovery_backoff_s": [600]},
        providers={"local": upstream(f"http://127.0.0.1:{port}", kind="openai", process=proc)},
        profiles={"default": {"providers": ["local"], "panic": False}})


def _ask(d, timeout: float = 60) -> httpx.Response:
    return httpx.post(d.url + "/v1/messages", timeout=timeout,
                      json={"model": "m", "max_tokens": 5, "messages": USER})


def _without_seconds(words: str) -> str:
    return re.sub(r", retry in (\d+ s|now)|\d+ s", "", words)


class Surfaces:
    def __init__(self, d) -> None:
        self.d = d
        self.sock = str(d.state_dir / "coderouterd.sock")
        self.env = {**d.env, "COLUMNS": "400"}

    def admin(self) -> dict:
        st = admin_get(self.sock) or {}
        return next((p for p in st.get("providers") or [] if p["name"] == "local"), {})

    def answer(self) -> tuple[str | None, str]:
        """The admin view's code and words (seconds left out): what a bracket compares."""
        a = self.admin().get("availability") or {}
        return a.get("code"), _without_seconds(str(a.get("why")))

    def read(self, code: str) -> dict | None:
        """Every surface's word for `local`, read while the admin view says `code` and the same words before and
        after; None when the state moved meanwhile (the caller reads again)."""
        before = self.answer()
        if before[0] != code:
            return None
        js = corectl(["--socket", self.sock, "status", "--json"], env=self.env)
        assert js.returncode == 0, js.stderr
        status = next(p for p in orjson.loads(js.stdout)["providers"] if p["name"] == "local")
        human = corectl(["--socket", self.sock, "status"], env=self.env)
        assert human.returncode == 0, human.stderr
        row = next((line for line in human.stdout.splitlines() if "│ local " in line), "")
        metric = {labels["reason"]: v for labels, v in series(scrape(self.d), "coderouter_provider_available",
                                                               provider="local")}
        now = httpx.get(self.d.url + "/ui/api/now", timeout=10).json()
        page = next(p for p in now["providers"] if p["name"] == "local")
        if self.answer() != before:
            return None
        return {"status": status, "row": row, "metric": metric, "page": page}

    def step(self, code: str, word: str, *, available: bool, ceiling_s: float = 60) -> dict:
        """Wait for `code`, then check that every surface says it, with the same word."""
        got = wait_for(lambda: self.read(code), ceiling_s)
        assert got, f"never read every surface while local was {code!r} (last: {self.admin().get('state')})"
        status, page = got["status"], got["page"]
        assert status["state"]["code"] == code and status["availability"]["code"] == code
        assert status["state"]["word"] == word, status["state"]
        assert page["state"] == status["state"], (page["state"], status["state"])  # the dashboard's word
        assert _without_seconds(page["availability"]["why"]) == _without_seconds(status["availability"]["why"])
        assert word in got["row"], got["row"]  # the table a human reads prints the same word
        assert got["metric"] == {code: 1.0 if available else 0.0}, got["metric"]  # /metrics labels it so
        return status


def test_an_on_demand_model_shows_one_word_everywhere_at_each_step_of_its_life(tmp_path):
    port = free_port()
    gate, toggle = tmp_path / "gate", tmp_path / "behaviour"
    toggle.write_text("ok")
    with running(_config(port, gate, toggle), tmp_path) as d:
        s = Surfaces(d)
        # 1. Stopped on demand: at rest, not an error; the next request starts it.
        stopped = s.step("on_demand", "stopped: starts on demand", available=False)
        assert stopped["state"]["kind"] == "idle" and stopped["state"]["problem"] is None
        # D6: its profile is not "none available", and its model is not an error.
        human = corectl(["--socket", s.sock, "status"], env=s.env).stdout
        profile_row = next(x for x in human.splitlines() if "│ default " in x)
        assert "local (stopped: a request starts it on demand)" in profile_row, profile_row
        assert "none available" not in profile_row
        models = corectl(["--socket", s.sock, "models", "list"], env=s.env)
        row = next(x for x in models.stdout.splitlines() if "│ local " in x)
        assert "stopped: starts on demand" in row and "error" not in row, models.stdout + models.stderr

        # 2. Starting: a request waits for it (held on the gate file, for as long as the test reads).
        served: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: served.append(_ask(d)), daemon=True)
        waiter.start()
        starting = s.step("starting", "process starting", available=False)
        assert starting["state"]["kind"] == "warn"
        gate.write_text("go")
        waiter.join(60)
        assert served and served[0].status_code == 200, served and served[0].text

        # 3. Resident: it takes traffic.
        resident = s.step("ok", "healthy", available=True)
        assert resident["state"]["takes_traffic"] is True
        models = corectl(["--socket", s.sock, "models", "list"], env=s.env)
        row = next(x for x in models.stdout.splitlines() if "│ local " in x and "│ m " in x)
        assert "resident" in row and "unknown" not in row, models.stdout + models.stderr  # D6: not "Loaded: unknown"

        # 4. Breaker open: the model fails a request (now, and after self-healing restarts it).
        toggle.write_text("500")
        assert httpx.post(f"http://127.0.0.1:{port}/_fake/behaviour", json={"behaviour": "500"},
                          timeout=10).status_code == 200
        failed = _ask(d)
        assert failed.status_code >= 500, failed.text
        opened = s.step("breaker_open", "down: breaker open", available=False)
        assert opened["state"]["problem"] == "down"
        # A client asking now is refused with the same words (the profile's panic is off).
        refused = _ask(d)
        assert refused.status_code >= 500, refused.text
        words = _without_seconds(opened["availability"]["why"]).split(" after ")[0]  # "breaker open"
        assert words in refused.json()["error"]["message"], refused.text

        # 5. Half-open: its next request is a trial; a warning, never "down" (E4).
        half = s.step("half_open", "half-open: next request is its trial", available=True, ceiling_s=4 * RECOVERY_S)
        assert half["state"]["kind"] == "warn" and half["state"]["problem"] is None

        # The trial succeeds: resident and taking traffic again.
        toggle.write_text("ok")
        assert httpx.post(f"http://127.0.0.1:{port}/_fake/behaviour", json={"behaviour": "ok"},
                          timeout=10).status_code == 200
        trial = _ask(d)
        assert trial.status_code == 200, trial.text
        s.step("ok", "healthy", available=True)

        # 6. Idle-stopped: back at rest, in the same words as before its first start.
        idle = s.step("on_demand", "stopped: starts on demand", available=False, ceiling_s=IDLE_STOP_S + 60)
        assert idle["state"]["kind"] == "idle"
        procs = (admin_get(s.sock) or {}).get("processes") or {}
        assert procs["local"]["last_stop_reason"] == "idle"
