"""Soak: mixed load on every ingress with a fault schedule, then check that the daemon stayed well and that its
figures agree with what happened.

    .venv/bin/python bench/soak.py [--minutes 10] [--rate 40] [--concurrency 8] [--json out.json]

Bounded: the load runs for --minutes (default 10), then the daemon is stopped and the report printed. Faults:
kill -9 of the managed child, windows of upstream 500s, valid and invalid config edits, profile switches, and
one kill -9 and restart of the daemon itself (at 30 %, so the second half is one warmed-up daemon). Every 10 s
it samples the daemon's RSS, fds, threads, children and in-flight gauge.

Mixed in, a hostile upstream of each wire (`hostile-oa`, `hostile-an`, each first in a profile with `backup`
behind it) whose behaviour changes every HOSTILE_EVERY_S seconds at random (seeded): redirects, answers without
bound, gzip bombs, endless error bodies, SSE with no line or event end, HTML passed off as a 200, streams cut
inside a block, hangs, 500s, and sometimes a good answer. Every request to them must end in a complete answer
(failover) or, when the stream was already committed, a well-formed error event. A prober asks /healthz every
HEALTHZ_EVERY_S on its own connection the whole time: its p99 must stay under HEALTHZ_P99_MS.

Add a kind of load by appending a `Load` to LOAD_MIX (a new ingress is one entry: path, body, how a complete
stream ends). Everything runs on loopback; upstreams are the test fakes, in their own processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, start_fake, stop, wait_healthz  # noqa: E402
from coderouterd.state.audit import read_audit  # noqa: E402
from coderouterd.state.journal_reader import journal_rows  # noqa: E402

SAMPLE_EVERY_S = 10.0
HEALTHZ_EVERY_S = 0.1
HEALTHZ_P99_MS = 50.0
HOSTILE_EVERY_S = 1.0
# (behaviour, weight): what the hostile upstreams do, one at a time. The heavy ones (tens of MB on loopback for
# each request) are rare so the machine measures the daemon, not the fakes.
HOSTILE = [("redirect;status=307;to=http://127.0.0.1:9/steal", 3), ("big_json;mb=20", 1), ("gzip_bomb;mb=40", 1),
           ("endless_error;status=500;mb=8", 2), ("sse_no_newline;mb=6", 2), ("sse_no_blank;mb=6", 2),
           ("raw;status=200;ctype=text/html;hex=3c68746d6c3e3c2f68746d6c3e", 3), ("raw;status=200;hex=6e756c6c", 2),
           ("cut_mid_block;end=chunked", 3), ("cut_mid_block;end=close", 3), ("disconnect_mid_stream", 2),
           ("error_mid_stream", 2), ("hang", 1), ("500", 2), ("ok", 4)]
REQUEST_TIMEOUT_S = 60.0  # a request without an answer by then counts as a hang
USER = [{"role": "user", "content": "Write one short sentence about soak tests."}]
TOOLS = [{"name": "Bash", "description": "run a command",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]


@dataclass(frozen=True)
class Load:
    """One kind of request in the mix. `done` is what a complete stream contains (None: not streamed)."""

    name: str
    path: str
    body: dict
    done: bytes | None = None
    profile: str | None = None  # sent as X-CodeRouter-Profile; None = the active profile or a route
    headers: dict = field(default_factory=dict)
    failed: bytes = b"event: error"  # what a stream that failed after its 200 contains


def _anthropic(stream: bool, **extra) -> dict:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream, "messages": USER, **extra}


def _openai(stream: bool) -> dict:
    return {"model": "gpt-4o-mini", "stream": stream, "messages": USER, "max_tokens": 64}


def _responses(stream: bool) -> dict:
    return {"model": "gpt-5-codex", "stream": stream, "input": USER[0]["content"], "max_output_tokens": 64}


ANTHROPIC_DONE, OPENAI_DONE, RESPONSES_DONE = b"event: message_stop", b"data: [DONE]", b"event: response.completed"
OPENAI_FAILED = b'data: {"error":'  # the error chunk of a chat stream that failed after its 200
LOAD_MIX: list[Load] = [
    Load("anthropic", "/v1/messages", _anthropic(False)),
    Load("anthropic-stream", "/v1/messages", _anthropic(True), ANTHROPIC_DONE),
    Load("anthropic-stream-tools", "/v1/messages", _anthropic(True, tools=TOOLS), ANTHROPIC_DONE),
    Load("anthropic-haiku", "/v1/messages", {**_anthropic(False), "model": "claude-haiku-4-5"}),
    Load("anthropic-cloud", "/v1/messages", _anthropic(True), ANTHROPIC_DONE, profile="cloud"),
    Load("anthropic-race", "/v1/messages", _anthropic(True), ANTHROPIC_DONE, profile="race"),
    Load("anthropic-failover", "/v1/messages", _anthropic(False), profile="fo"),
    Load("openai", "/v1/chat/completions", _openai(False)),
    Load("openai-stream", "/v1/chat/completions", _openai(True), OPENAI_DONE),
    Load("openai-failover", "/v1/chat/completions", _openai(True), OPENAI_DONE, profile="fo"),
    Load("responses", "/v1/responses", _responses(False)),
    Load("responses-stream", "/v1/responses", _responses(True), RESPONSES_DONE, failed=b"event: response.failed"),
    Load("hostile-an-stream", "/v1/messages", _anthropic(True), ANTHROPIC_DONE, profile="hostile-an"),
    Load("hostile-an", "/v1/messages", _anthropic(False), profile="hostile-an"),
    Load("hostile-oa-stream", "/v1/chat/completions", _openai(True), OPENAI_DONE, profile="hostile-oa",
         failed=OPENAI_FAILED),
    Load("hostile-oa", "/v1/chat/completions", _openai(False), profile="hostile-oa"),
]


def config_text(port: int, child_port: int, fakes: dict[str, str], connect: int = 5) -> str:
    cmd = [PY, "-m", "tests.fakes", "--kind", "ollama", "--port", str(child_port), "--models", "qwen3",
           "--no-record"]
    return f"""
[server]
port = {port}
stream_hold_s = 0.5
[state]
flush_interval_s = 1.0
[health]
probe_interval_s = 30
recovery_backoff_s = [0.5, 1, 2]
[providers.local]
base_url = "http://127.0.0.1:{child_port}/v1"
[providers.local.process]
command = {cmd!r}
cwd = "{ROOT}"
ready_url = "http://127.0.0.1:{child_port}/api/tags"
startsecs = 0.2
stop_timeout_s = 3
[providers.backup]
base_url = "{fakes['backup']}/v1"
timeouts = {{ connect = {connect} }}
[providers.flaky]
base_url = "{fakes['flaky']}/v1"
[providers.a]
base_url = "{fakes['a']}/v1"
[providers.b]
base_url = "{fakes['b']}/v1"
[providers.cloud]
kind = "anthropic"
base_url = "{fakes['cloud']}/v1"
[providers.hostile-an]
kind = "anthropic"
base_url = "{fakes['hostile-an']}/v1"
timeouts = {{ first_byte = 2, idle = 2, total = 20 }}
[providers.hostile-oa]
base_url = "{fakes['hostile-oa']}/v1"
timeouts = {{ first_byte = 2, idle = 2, total = 20 }}
[profiles.hostile-an]
providers = ["hostile-an", "backup"]
[profiles.hostile-oa]
providers = ["hostile-oa", "backup"]
[profiles.default]
providers = ["local", "backup"]
[profiles.alt]
providers = ["backup", "local"]
[profiles.fo]
providers = ["flaky", "backup"]
health_action = "warn"
[profiles.race]
providers = ["a", "b"]
mode = "race"
race_width = 2
[profiles.cloud]
providers = ["cloud", "backup"]
[profiles.haiku]
providers = ["backup"]
[[routes]]
model = "claude-haiku-*"
profile = "haiku"
""".replace("'", '"')


class Soak:
    def __init__(self, args) -> None:
        self.args = args
        self.duration = args.minutes * 60
        self.tmp = Path(tempfile.mkdtemp(prefix="coderouter-soak-"))
        self.state_dir = self.tmp / "state"
        self.port = free_port()
        self.child_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fakes: dict[str, subprocess.Popen] = {}
        self.fake_urls: dict[str, str] = {}
        self.daemon: subprocess.Popen | None = None
        self.log_path = self.tmp / "daemon.log"
        self.outcomes: Counter = Counter()  # (expected|unexpected|ok, detail)
        self.by_load: Counter = Counter()
        self.latencies: list[float] = []
        self.answered: list[tuple[float, int]] = []  # (wall time sent, status): every HTTP answer
        self.down: list[list[float]] = []  # [start, end] wall times when the daemon was being killed/restarted
        self.samples: list[dict] = []
        self.events: list[str] = []
        self.child_recovery: list[float] = []
        self.child_kills_after_restart = 0
        self.daemon_restart: dict[str, float] = {}
        self.connect = 5
        self.edits = Counter()
        self.start_wall = 0.0
        self.load_start: tuple = ()
        self.idle_breakdown: dict = {}
        self.unexpected: list[tuple[float, str, str, str]] = []  # (s into the run, load, detail, request id)
        self.healthz: list[tuple[float, float]] = []  # (wall time, ms) of every /healthz answer
        self.healthz_failures = 0
        self.hostile_seen: Counter = Counter()
        self.rng = random.Random(args.seed)

    # -- processes ------------------------------------------------------------------------------------------

    def start_upstreams(self) -> None:
        for name, kind, behaviour in (("backup", "openai", "ok"), ("flaky", "openai", "ok"),
                                      ("a", "openai", "slow_first_byte;delay=0.05"), ("b", "openai", "ok"),
                                      ("cloud", "anthropic", "ok"), ("hostile-an", "anthropic", "ok"),
                                      ("hostile-oa", "openai", "ok")):
            self.fakes[name], self.fake_urls[name] = start_fake(kind, behaviour)

    def write_config(self, text: str | None = None) -> None:
        path = self.tmp / "config.toml"
        tmp = path.with_suffix(".new")
        tmp.write_text(text or config_text(self.port, self.child_port, self.fake_urls, self.connect))
        os.replace(tmp, path)  # the way editors save: a new file renamed over the old one

    def start_daemon(self) -> float:
        log = open(self.log_path, "ab")
        self.daemon = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(self.tmp / "config.toml")],
                                       cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, "CODEROUTER_STATE_DIR": str(self.state_dir)})
        log.close()
        return wait_healthz(self.url, self.daemon, timeout=30)

    def child_pids(self) -> list[int]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "tests.fakes" in cmd and str(self.child_port) in cmd:
                out.append(p.pid)
        return out

    # -- load -----------------------------------------------------------------------------------------------

    def _expected(self, t0: float, t1: float) -> bool:
        return any(a - 0.5 <= t1 and t0 <= b + 1.0 for a, b in self.down)

    async def worker(self, session: aiohttp.ClientSession, i: int, end: float) -> None:
        interval = self.args.concurrency / self.args.rate
        n = i
        next_at = time.monotonic()
        while time.monotonic() < end:
            load = LOAD_MIX[n % len(LOAD_MIX)]
            n += 1
            await self.one(session, load)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def one(self, session: aiohttp.ClientSession, load: Load) -> None:
        headers = {"content-type": "application/json", **load.headers}
        if load.profile:
            headers["x-coderouter-profile"] = load.profile
        if load.path == "/v1/messages":
            headers["anthropic-version"] = "2023-06-01"
        t0, m0 = time.time(), time.monotonic()
        status, detail, rid = None, "", ""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                async with session.post(self.url + load.path, data=orjson.dumps(load.body), headers=headers) as r:
                    status = r.status
                    body = await r.read()
            self.answered.append((t0, status))
            if status != 200:
                detail = f"HTTP {status}"
            elif load.done is not None and (load.done not in body or load.failed in body):
                detail = "error event in stream" if load.failed in body else "stream ended without its end marker"
            rid = r.headers.get("x-request-id", "")
        except TimeoutError:
            detail = "hang"
        except (aiohttp.ClientError, OSError) as e:
            detail = type(e).__name__
        self.latencies.append(time.monotonic() - m0)
        if not detail:
            self.outcomes[("ok", "200")] += 1
        elif detail == "error event in stream" and load.name.startswith("hostile"):
            # Committed to the client (past the stream hold) before the upstream went bad: an error event is the
            # right answer; what matters is that it is well-formed and at once (the request did not hang).
            self.outcomes[("expected", "error event (hostile upstream, after commit)")] += 1
        elif detail != "hang" and self._expected(t0, time.time()):
            self.outcomes[("expected", f"{detail} (daemon killed)")] += 1
        else:
            self.outcomes[("unexpected", detail)] += 1
            self.by_load[(load.name, detail)] += 1
            self.unexpected.append((t0 - self.start_wall, load.name, detail, rid))

    # -- faults ---------------------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        d = self.duration
        plan = [(0.30 * d, "kill_daemon")]
        every = max(60.0, d / 8)
        t = every * 0.5
        while t < d * 0.93:
            if abs(t - 0.30 * d) > 20:
                plan.append((t, "kill_child"))
            t += every
        plan += [(d * (k + 0.5) / 10, "upstream_500") for k in range(10)]
        plan += [(d * (k + 0.35) / 12, "valid_edit") for k in range(12)]
        plan += [(d * (k + 0.8) / 12, "invalid_edit") for k in range(12)]
        plan += [(d * (k + 0.6) / 6, "profile_switch") for k in range(6)]
        return sorted(plan)

    async def faults(self, admin: aiohttp.ClientSession, http: aiohttp.ClientSession) -> None:
        start = time.monotonic()
        tasks = []
        switches = 0
        for at, action in self.schedule():
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            self.events.append(f"{at:6.1f}s {action}")
            if action == "kill_child":
                tasks.append(asyncio.create_task(self.kill_child(admin)))
            elif action == "upstream_500":
                tasks.append(asyncio.create_task(self.window_500(http)))
            elif action == "valid_edit":
                self.connect = 6 if self.connect == 5 else 5  # new pool settings for `backup`: its pool is replaced
                self.write_config()
                self.edits["valid"] += 1
            elif action == "invalid_edit":
                self.write_config("[server\nport = nonsense\n")
                self.edits["invalid"] += 1
                await asyncio.sleep(4.0)  # the watcher's debounce, then the daemon's rejection
                self.write_config()
            elif action == "profile_switch":
                switches += 1
                try:
                    r = await admin.post("http://coderouterd/v1/profile/use",
                                         json={"name": "alt" if switches % 2 else "default"})
                    r.release()
                    self.edits["profile_switch"] += 1
                except aiohttp.ClientError as e:
                    self.events.append(f"profile switch failed: {e}")
            elif action == "kill_daemon":
                await self.kill_daemon()
        await asyncio.gather(*tasks)

    async def hostile(self, http: aiohttp.ClientSession, end: float) -> None:
        names, weights = zip(*HOSTILE, strict=True)
        while time.monotonic() < end:
            behaviour = self.rng.choices(names, weights)[0]
            self.hostile_seen[behaviour.split(";")[0]] += 1
            for which in ("hostile-an", "hostile-oa"):
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    (await http.post(self.fake_urls[which] + "/_fake/behaviour", json={"behaviour": behaviour})).release()
            await asyncio.sleep(HOSTILE_EVERY_S)
        for which in ("hostile-an", "hostile-oa"):
            (await http.post(self.fake_urls[which] + "/_fake/behaviour", json={"behaviour": "ok"})).release()

    async def healthz_prober(self, end: float) -> None:
        """/healthz on a connection of its own, every HEALTHZ_EVERY_S: what a supervisor or load balancer sees."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            while time.monotonic() < end:
                t0, m0 = time.time(), time.monotonic()
                try:
                    async with s.get(self.url + "/healthz") as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, OSError, TimeoutError):
                    ok = False
                ms = (time.monotonic() - m0) * 1000
                if ok:
                    self.healthz.append((t0, ms))
                elif not self._expected(t0, time.time()):
                    self.healthz_failures += 1
                await asyncio.sleep(max(0.0, HEALTHZ_EVERY_S - ms / 1000))

    async def window_500(self, http: aiohttp.ClientSession) -> None:
        url = self.fake_urls["flaky"] + "/_fake/behaviour"
        (await http.post(url, json={"behaviour": "500"})).release()
        await asyncio.sleep(5.0)
        (await http.post(url, json={"behaviour": "ok"})).release()

    async def kill_child(self, admin: aiohttp.ClientSession) -> None:
        pids = self.child_pids()
        if len(pids) != 1:
            self.events.append(f"kill_child: expected one child, found {pids}")
            return
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)
        if self.daemon_restart:
            self.child_kills_after_restart += 1
        while time.monotonic() - t0 < 60:
            await asyncio.sleep(0.1)
            try:
                async with admin.get("http://coderouterd/v1/status") as r:
                    procs = (await r.json()).get("processes", {})
            except (aiohttp.ClientError, OSError):
                continue
            if procs.get("local", {}).get("state") == "ready" and procs["local"].get("pid") != pids[0]:
                self.child_recovery.append(time.monotonic() - t0)
                return
        self.events.append("kill_child: the child did not come back within 60 s")

    async def kill_daemon(self) -> None:
        t_kill = time.time()
        self.down.append([t_kill, t_kill + 3600])
        self.daemon.kill()
        self.daemon.wait()
        m0 = time.monotonic()
        start_s = await asyncio.to_thread(self.start_daemon)
        self.down[-1][1] = time.time()
        self.daemon_restart = {"t_kill": t_kill, "healthz_s": time.monotonic() - m0, "start_s": start_s}
        async with aiohttp.ClientSession() as s:
            while time.monotonic() - m0 < 60:
                try:
                    t0 = time.time()
                    # The profile named: the active one may be `alt` (backup first) at this point of the run.
                    async with s.post(self.url + "/v1/messages", data=orjson.dumps(_anthropic(False)),
                                      headers={"content-type": "application/json",
                                               "x-coderouter-profile": "default"}) as r:
                        self.answered.append((t0, r.status))  # served and journaled like any other
                        if r.status == 200 and r.headers.get("x-coderouter-provider") == "local":
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        self.daemon_restart["local_serving_s"] = time.monotonic() - m0

    # -- sampling -------------------------------------------------------------------------------------------

    async def sampler(self, http: aiohttp.ClientSession, end: float) -> None:
        while True:
            await self.sample(http)
            if time.monotonic() + SAMPLE_EVERY_S > end:
                return
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def sample(self, http: aiohttp.ClientSession) -> dict | None:
        try:
            p = psutil.Process(self.daemon.pid)
            s = {"t": time.time() - self.start_wall, "pid": p.pid, "rss_mb": p.memory_info().rss / 2**20,
                 "fds": p.num_fds(), "threads": p.num_threads(), "children": len(p.children(recursive=True)),
                 "managed": len(self.child_pids())}
            async with http.get(self.url + "/metrics") as r:
                text = await r.text()
            s["in_flight"] = sum(float(v) for v in re.findall(r"^coderouter_requests_in_flight\{[^}]*\} (\S+)$",
                                                              text, re.M))
        except (psutil.Error, aiohttp.ClientError, OSError):
            return None
        self.samples.append(s)
        return s

    # -- the run --------------------------------------------------------------------------------------------

    async def run(self) -> dict:
        self.start_upstreams()
        self.write_config()
        self.start_daemon()
        async with aiohttp.ClientSession() as http:
            while True:  # the managed child is ready and serving
                async with http.post(self.url + "/v1/messages", data=orjson.dumps(_anthropic(False)),
                                     headers={"content-type": "application/json"}) as r:
                    if r.headers.get("x-coderouter-provider") == "local":
                        break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2)
            idle = await self.sample(http)
            self.idle_breakdown = self.fd_breakdown()
            self.samples.clear()
            self.start_wall = time.time()
            self.load_start = tuple(round(x, 2) for x in os.getloadavg())
            end = time.monotonic() + self.duration
            conn = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=None)
            admin = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(self.state_dir / "coderouterd.sock")))
            async with aiohttp.ClientSession(connector=conn, timeout=timeout) as load, admin:
                await asyncio.gather(self.faults(admin, http), self.sampler(http, end), self.hostile(http, end),
                                     self.healthz_prober(end),
                                     *(self.worker(load, i, end) for i in range(self.args.concurrency)))
            # Settle past the upstream pools' keep-alive (60 s, swept every 60 s), so the last sample is an idle
            # daemon again.
            await asyncio.sleep(self.args.settle)
            final = await self.sample(http)
            final["fd_breakdown"] = self.fd_breakdown()
            idle["fd_breakdown"] = self.idle_breakdown
            async with http.get(self.url + "/metrics") as r:
                metrics = parse_metrics(await r.text())
        code = await asyncio.to_thread(self._stop_daemon)
        return {"idle": idle, "final": final, "metrics": metrics, "exit_code": code}

    def fd_breakdown(self) -> dict[str, int]:
        """What the daemon's fds are: upstream connections by fake, client-side sockets, files, the rest."""
        p = psutil.Process(self.daemon.pid)
        names = {int(u.rsplit(":", 1)[1]): n for n, u in self.fake_urls.items()}
        names[self.child_port] = "local"
        out: Counter = Counter()
        for c in p.net_connections(kind="all"):
            if c.raddr and isinstance(c.raddr, tuple):
                out[f"tcp to {names.get(c.raddr[1], 'client' if c.laddr[1] == self.port else c.raddr[1])}"] += 1
            elif c.status == psutil.CONN_LISTEN:
                out["listening"] += 1
            else:
                out["unix/other socket"] += 1
        out["files"] = len(p.open_files())
        out["other (pipes, epoll, eventfd...)"] = p.num_fds() - sum(out.values())
        return dict(out)

    def _stop_daemon(self) -> int | None:
        stop(self.daemon)
        return self.daemon.returncode

    def cleanup(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            stop(self.daemon)
        for pid in self.child_pids():
            os.kill(pid, signal.SIGKILL)
        for p in self.fakes.values():
            stop(p)


def parse_metrics(text: str) -> dict[str, float]:
    out: Counter = Counter()
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        out[name.split("{", 1)[0]] += float(value)
    return dict(out)


def consistency(soak: Soak, metrics: dict) -> list[tuple[str, float, float, float, bool]]:
    """The four views over the restarted daemon's lifetime (a kill -9 forgets its counters, by design)."""
    t2 = soak.daemon_restart["t_kill"]
    rows = [r for r in journal_rows(soak.state_dir / "state.db") if r["ts"] >= t2]
    audit = read_audit(soak.state_dir, since=datetime.fromtimestamp(t2, UTC))
    client = sum(1 for t, _ in soak.answered if t >= t2)
    restarts = [r for r in audit if r["kind"] == "process" and r["event"] == "restarting" and r.get("primary", True)]
    failed = [r for r in rows if r["provider"] and any(a["outcome"] == "failed" for a in r["attempts"])]
    fallback_used = [r for r in audit if r["kind"] == "fallback_used"]
    moved = sum(r["fallback_count"] for r in rows)
    checks = [
        ("requests: /metrics = journal = client", metrics.get("coderouter_requests_total", 0), len(rows), client),
        ("restarts: /metrics = audit = kills", metrics.get("coderouter_process_restarts_total", 0), len(restarts),
         soak.child_kills_after_restart),
        ("failovers: /metrics = journal = fallback_used", metrics.get("coderouter_failovers_total", 0),
         len(failed), len(fallback_used)),
        ("failovers: journal rows with fallback_count > 0 = Σ fallback_count = rows with a failed attempt",
         sum(1 for r in rows if r["fallback_count"]), moved, len(failed)),
        ("in-flight at the end (= 0)", metrics.get("coderouter_requests_in_flight", 0), 0, 0),
    ]
    return [(name, a, b, c, a == b == c) for name, a, b, c in checks]


def not_pooled(breakdown: dict) -> int:
    """fds other than TCP connections: what must return exactly to its idle level (connections come and go
    with the pools' keep-alive)."""
    return sum(n for k, n in breakdown.items() if not k.startswith("tcp to "))


def integrity(state_dir: Path) -> str:
    conn = sqlite3.connect(state_dir / "state.db")
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def report(soak: Soak, res: dict) -> dict:
    total = sum(soak.outcomes.values())
    secs = soak.duration
    print(f"\nmachine: {os.cpu_count()} cores, load average at start {soak.load_start}, at end "
          f"{tuple(round(x, 2) for x in os.getloadavg())}")
    print(f"soak: {soak.args.minutes:g} min, {total} requests, {total / secs:.1f} req/s achieved "
          f"(target {soak.args.rate:g} req/s over {soak.args.concurrency} workers), mix of {len(LOAD_MIX)} kinds")
    print("\nrequests by outcome:")
    for (cls, detail), n in sorted(soak.outcomes.items()):
        print(f"  {cls:<10} {detail:<40} {n}")
    for (name, detail), n in sorted(soak.by_load.items()):
        print(f"    unexpected on {name}: {detail} x{n}")
    for t, name, detail, rid in soak.unexpected[:20]:
        print(f"    at {t:6.1f}s {name}: {detail} {rid}")
    lat = sorted(soak.latencies)
    print(f"latency p50 {statistics.median(lat) * 1000:.1f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms, "
          f"max {lat[-1] * 1000:.0f} ms")
    print(f"hostile upstreams: behaviour changed {sum(soak.hostile_seen.values())} times: "
          + ", ".join(f"{k} x{n}" for k, n in sorted(soak.hostile_seen.items())))
    hz = [ms for t, ms in soak.healthz if not soak._expected(t, t)]
    hz_p99 = sorted(hz)[int(len(hz) * 0.99)] if hz else float("nan")
    print(f"/healthz every {HEALTHZ_EVERY_S:g} s: {len(hz)} answers outside the daemon's restart, p50 "
          f"{statistics.median(hz):.1f} ms, p99 {hz_p99:.1f} ms, max {max(hz):.0f} ms; failures {soak.healthz_failures}"
          if hz else "/healthz: no answers")
    windows = {}
    for t, ms in soak.healthz:
        windows.setdefault(int((t - soak.start_wall) // 60), []).append(ms)
    print("  per minute p99 ms: " + " ".join(f"{sorted(v)[int(len(v) * 0.99)]:.0f}" for _, v in sorted(windows.items())))
    second = [s for s in soak.samples if s["t"] >= secs / 2]
    growth = second[-1]["rss_mb"] - second[0]["rss_mb"] if len(second) >= 2 else float("nan")
    print("\nsamples (every 10 s): t, daemon pid, RSS MB, fds, threads, children (own), managed child alive, "
          "in-flight")
    for s in soak.samples:
        print(f"  {s['t']:6.0f}s pid {s['pid']:<7} {s['rss_mb']:6.1f} {s['fds']:4d} {s['threads']:3d} "
              f"{s['children']:2d} {s['managed']:2d} {s['in_flight']:4.0f}")
    idle, final = res["idle"], res["final"]
    print(f"\nRSS growth over the second half: {growth:+.2f} MB ({second[0]['rss_mb']:.1f} -> "
          f"{second[-1]['rss_mb']:.1f})" if second else "no samples in the second half")
    print(f"fds: idle before load {idle['fds']} (first daemon), after load + {soak.args.settle:g} s idle "
          f"{final['fds']} (restarted daemon); "
          f"max under load {max(s['fds'] for s in soak.samples)}")
    print(f"  idle fds:  {idle['fd_breakdown']}\n  final fds: {final['fd_breakdown']}")
    print(f"  fds other than TCP connections: idle {not_pooled(idle['fd_breakdown'])} -> final "
          f"{not_pooled(final['fd_breakdown'])}")
    print(f"threads idle {idle['threads']} -> end {final['threads']}; own children {idle['children']} -> "
          f"{final['children']} (an adopted child is not the daemon's own child); managed child "
          f"alive {idle['managed']} -> {final['managed']}")
    rec = soak.child_recovery
    print(f"\nmanaged child kill -9 x{len(rec)}: back to ready in p50 {statistics.median(rec):.2f} s, "
          f"max {max(rec):.2f} s" if rec else "\nno child kill recovered")
    dr = soak.daemon_restart
    print(f"daemon kill -9 + restart: healthz after {dr['healthz_s']:.2f} s, the adopted child serving after "
          f"{dr['local_serving_s']:.2f} s")
    print(f"config edits: {soak.edits['valid']} valid, {soak.edits['invalid']} invalid; "
          f"{soak.edits['profile_switch']} profile switches")
    checks = consistency(soak, res["metrics"])
    print("\nconsistency over the restarted daemon's lifetime:")
    for name, a, b, c, ok in checks:
        print(f"  {'ok ' if ok else 'BAD'} {name}: {a:g} / {b:g} / {c:g}")
    log = soak.log_path.read_text(errors="replace")
    unclosed = log.count("Unclosed")
    tracebacks = log.count("Traceback")
    ic = integrity(soak.state_dir)
    orphans = soak.child_pids()
    print(f"\nintegrity_check: {ic}; 'Unclosed' in the log: {unclosed}; tracebacks: {tracebacks}; "
          f"exit code {res['exit_code']}; children left after SIGTERM: {len(orphans)}")
    unexpected = sum(n for (cls, _), n in soak.outcomes.items() if cls == "unexpected")
    verdict = (unexpected == 0 and all(c[-1] for c in checks) and ic == "ok" and unclosed == 0 and not orphans
               and (growth <= 2.0 if second else False) and hz_p99 < HEALTHZ_P99_MS and soak.healthz_failures == 0)
    print(f"\nverdict: {'PASS' if verdict else 'FAIL'}  (state dir {soak.state_dir})")
    return {"requests": total, "rate": total / secs, "outcomes": {f"{c}:{d}": n for (c, d), n in soak.outcomes.items()},
            "rss_growth_second_half_mb": growth, "samples": soak.samples, "child_recovery_s": rec,
            "daemon_restart": dr, "consistency": checks, "integrity": ic, "unclosed": unclosed, "pass": verdict,
            "events": soak.events, "healthz_p99_ms": hz_p99, "healthz_failures": soak.healthz_failures,
            "hostile": dict(soak.hostile_seen)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=40.0, help="target requests per second over all workers")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--settle", type=float, default=130.0,
                    help="idle seconds after the load before the last sample (aiohttp closes a keep-alive "
                         "connection 60-120 s after its last use)")
    ap.add_argument("--seed", type=int, default=23, help="the hostile upstreams' choices")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    soak = Soak(args)
    try:
        res = asyncio.run(soak.run())
        out = report(soak, res)
    finally:
        soak.cleanup()
    if args.json:
        args.json.write_text(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
