"""/healthz and API calls while idle sockets fill the connection cap (issue 34, item 5): 600 connections that never
send a byte, and a client that keeps opening more, against the default cap (`max_connections = 512`).

    .venv/bin/python bench/healthz_flood.py [--probes 300]

Loopback only, bounded: a fixed number of probes per condition, each on a new connection (as a supervisor
probes), 10 ms apart. The flooders run in a child process (asyncio); the prober uses blocking sockets in this
one. The daemon is pinned to core 0, the fake upstream, the flooders and the prober to core 1.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, pct, pin, start_fake, stop, table, wait_healthz  # noqa: E402

IDLE = 600
RECONNECT_KEEP = 50  # the reconnecting client holds this many at a time, closing its oldest for each new one
API_BODY = b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'


def _flood(port: int, idle: int, reconnect: bool, ready, stop_evt) -> None:
    pin(os.getpid(), {1})

    async def main() -> None:
        held = []
        for _ in range(idle):
            try:
                held.append(await asyncio.open_connection("127.0.0.1", port))
            except OSError:
                pass
        ready.set()
        mine: list = []
        opened = 0
        while not stop_evt.is_set():
            if reconnect:
                try:
                    mine.append(await asyncio.open_connection("127.0.0.1", port))
                    opened += 1
                except OSError:
                    pass
                if len(mine) > RECONNECT_KEEP:
                    mine.pop(0)[1].close()
            await asyncio.sleep(0.001 if reconnect else 0.05)
        for _r, w in held + mine:
            w.close()

    asyncio.run(main())


def _request(port: int, raw: bytes) -> tuple[float, int]:
    """(seconds, status), status 0 for a reset or a close without an answer."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(raw)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return time.perf_counter() - t0, 0
    status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0
    return time.perf_counter() - t0, status


def _probe(port: int, n: int) -> tuple[list[float], list[int], list[int]]:
    healthz = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    api = (b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
           b"anthropic-version: 2023-06-01\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
           % (len(API_BODY), API_BODY))
    times, statuses, api_statuses = [], [], []
    for i in range(n):
        t, status = _request(port, healthz)
        times.append(t)
        statuses.append(status)
        if i % 10 == 0:
            api_statuses.append(_request(port, api)[1])
        time.sleep(0.01)
    return times, statuses, api_statuses


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", type=int, default=300)
    args = ap.parse_args()
    pin(os.getpid(), {1})
    tmp = Path(tempfile.mkdtemp(prefix="crbench-healthz-"))
    fake, fake_url = start_fake("openai", "ok", {1})
    cfg = tmp / "bench.toml"
    cfg.write_text(f"""
[server]
port = 0
[providers.local]
kind = "openai"
base_url = "{fake_url}/v1"
model = "bench-model"
[profiles.default]
providers = ["local"]
""")
    port = free_port()
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state")}
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg), "--port", str(port),
                          "--log-level", "warning"], cwd=ROOT, env=env)
    rows = []
    try:
        pin(d.pid, {0})
        wait_healthz(f"http://127.0.0.1:{port}", d)
        for label, idle, reconnect in (("quiet", 0, False), (f"{IDLE} idle sockets", IDLE, False),
                                       (f"{IDLE} idle + reconnecting client", IDLE, True)):
            ctx = mp.get_context("spawn")
            ready, stop_evt = ctx.Event(), ctx.Event()
            flood = ctx.Process(target=_flood, args=(port, idle, reconnect, ready, stop_evt))
            flood.start()
            try:
                ready.wait(60)
                time.sleep(0.5)
                times, statuses, api = _probe(port, args.probes)
            finally:
                stop_evt.set()
                flood.join(30)
            ok = [t for t, s in zip(times, statuses, strict=True) if s == 200]
            rows.append([label, str(len(times)), f"{len(ok)}", f"{statuses.count(0)}",
                         f"{pct(ok, 50) * 1000:.2f}" if ok else "–", f"{pct(ok, 99) * 1000:.2f}" if ok else "–",
                         f"{max(ok) * 1000:.2f}" if ok else "–",
                         f"{api.count(200)}/{len(api)} ({api.count(0)} reset, {api.count(503)} 503)"])
            time.sleep(1.0)
        print(table(rows, ["condition (max_connections = 512)", "/healthz probes", "200", "reset",
                           "p50 ms", "p99 ms", "max ms", "API calls 200"]))
        print(f"\neach probe on a new connection, 10 ms apart; an API call (POST /v1/messages) every 10th probe; "
              f"the reconnecting client opens a connection every ~1 ms and holds its last {RECONNECT_KEEP}")
    finally:
        stop(d)
        stop(fake)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
