"""Proxy overhead benchmark: the same requests direct to a fast fake upstream and through coderouterd.

    .venv/bin/python bench/proxy.py [--quick] [--no-state]

Loopback only, bounded in time (about a minute). The daemon is pinned to core 0; the fake upstreams and this
load generator share core 1, as in the issue's reference measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.claude_body import claude_code_body  # noqa: E402
from bench.common import (  # noqa: E402
    PY,
    ROOT,
    free_port,
    pct,
    pin,
    rss_mb,
    start_fake,
    stop,
    table,
    wait_healthz,
    wait_port,
)
from coderouterd.translate.anthropic_to_openai import request_to_openai  # noqa: E402

OPENAI_BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}


async def one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict, stream: bool):
    t0 = time.perf_counter()
    ttfb = None
    async with session.post(url, data=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:300]!r}")
        if stream:
            async for _chunk in r.content.iter_any():
                if ttfb is None:
                    ttfb = time.perf_counter() - t0
        else:
            await r.read()
    return time.perf_counter() - t0, ttfb


async def latency(url, body, headers, n, stream=False):
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as s:
        for _ in range(max(20, n // 10)):  # warm-up
            await one(s, url, body, headers, stream)
        totals, ttfbs = [], []
        for _ in range(n):
            t, f = await one(s, url, body, headers, stream)
            totals.append(t)
            if f is not None:
                ttfbs.append(f)
    return totals, ttfbs


async def throughput(url, body, headers, concurrency, seconds):
    conn = aiohttp.TCPConnector(limit=concurrency)
    done = 0
    async with aiohttp.ClientSession(connector=conn) as s:
        for _ in range(concurrency):
            await one(s, url, body, headers, False)
        stop_at = time.perf_counter() + seconds

        async def worker():
            nonlocal done
            while time.perf_counter() < stop_at:
                await one(s, url, body, headers, False)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def ms(x: float) -> str:
    return f"{x * 1000:.3f}"


def write_config(tmp: Path, oa_url: str, an_url: str, oa_stream_url: str, state: bool) -> Path:
    cfg = f"""
[server]
port = 0
[state]
enabled = {"true" if state else "false"}
[providers.oa]
kind = "openai"
base_url = "{oa_url}/v1"
model = "bench-model"
[providers.oastream]
kind = "openai"
base_url = "{oa_stream_url}/v1"
model = "bench-model"
[providers.an]
kind = "anthropic"
base_url = "{an_url}/v1"
[profiles.default]
providers = ["oa"]
[profiles.stream]
providers = ["oastream"]
[profiles.pass]
providers = ["an"]
"""
    p = tmp / "bench.toml"
    p.write_text(cfg)
    return p


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--no-state", action="store_true", help="run the daemon with journal/audit/store disabled")
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each throughput phase")
    ap.add_argument("--state-compare", action="store_true",
                    help="only compare journal+audit+store enabled vs disabled (issue: +0.1 ms p50, -5%% req/s)")
    args = ap.parse_args()
    if args.state_compare:
        return state_compare(300 if args.quick else 2000, 1.0 if args.quick else args.seconds)
    n = 300 if args.quick else 2000
    secs = 1.0 if args.quick else args.seconds
    pin(os.getpid(), {1})
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="crbench-"))
    try:
        oa, oa_url = start_fake("openai", "ok", {1})
        oas, oas_url = start_fake("openai", "chunks;n=20", {1})
        an, an_url = start_fake("anthropic", "ok", {1})
        procs += [oa, oas, an]
        port = free_port()
        cfg = write_config(tmp, oa_url, an_url, oas_url, not args.no_state)
        env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state")}
        t0 = time.monotonic()
        d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg), "--port", str(port),
                              "--log-level", "warning"], cwd=ROOT, env=env)
        procs.append(d)
        pin(d.pid, {0})
        ready = wait_healthz(f"http://127.0.0.1:{port}", d)
        ready_exec = time.monotonic() - t0
        fport = free_port()
        fl = subprocess.Popen([PY, str(ROOT / "bench" / "floor.py"), oa_url, str(fport)], cwd=ROOT)
        procs.append(fl)
        pin(fl.pid, {0})
        wait_port(fport)
        floor_url = f"http://127.0.0.1:{fport}/v1/chat/completions"
        time.sleep(0.5)
        rss_idle = rss_mb(d.pid)
        proxy = f"http://127.0.0.1:{port}"
        jh = {"content-type": "application/json"}
        ah = {**jh, "anthropic-version": "2023-06-01", "x-api-key": "bench"}
        cc = claude_code_body()
        cc_raw = orjson.dumps(cc)
        cc_openai = orjson.dumps(request_to_openai(cc, "bench-model", stream=False)[0])
        oa_raw = orjson.dumps(OPENAI_BODY)
        oa_stream = orjson.dumps({**OPENAI_BODY, "stream": True})
        an_small = orjson.dumps({"model": "bench-model", "max_tokens": 16, "messages": OPENAI_BODY["messages"]})
        an_stream = orjson.dumps({"model": "bench-model", "max_tokens": 16, "stream": True,
                                  "messages": OPENAI_BODY["messages"]})
        scenarios = [
            ("a) OpenAI→OpenAI", (f"{oa_url}/v1/chat/completions", oa_raw, jh),
             (f"{proxy}/v1/chat/completions", oa_raw, jh)),
            (f"b) Anthropic→OpenAI {len(cc_raw) // 1024} KB", (f"{oa_url}/v1/chat/completions", cc_openai, jh),
             (f"{proxy}/v1/messages", cc_raw, ah)),
            ("c) Anthropic passthrough", (f"{an_url}/v1/messages", an_small, ah),
             (f"{proxy}/v1/messages", an_small, {**ah, "x-coderouter-profile": "pass"})),
        ]
        rows = []
        dt, _ = asyncio.run(latency(f"{oa_url}/v1/chat/completions", oa_raw, jh, n))
        ft, _ = asyncio.run(latency(floor_url, oa_raw, jh, n))
        rows.append(["floor: bare uvicorn+aiohttp forwarder, OpenAI body", ms(pct(dt, 50)), ms(pct(ft, 50)),
                     ms(pct(ft, 50) - pct(dt, 50)), ms(pct(dt, 99)), ms(pct(ft, 99)), ms(pct(ft, 99) - pct(dt, 99))])
        for name, direct, through in scenarios:
            dt, _ = asyncio.run(latency(*direct, n))
            tt, _ = asyncio.run(latency(*through, n))
            rows.append([name, ms(pct(dt, 50)), ms(pct(tt, 50)), ms(pct(tt, 50) - pct(dt, 50)),
                         ms(pct(dt, 99)), ms(pct(tt, 99)), ms(pct(tt, 99) - pct(dt, 99))])
        print("\nAdded latency at concurrency 1 (ms)")
        print(table(rows, ["scenario", "direct p50", "proxy p50", "added p50", "direct p99", "proxy p99",
                           "added p99"]))

        rows = []
        for conc in (1, 8, 32):
            dr = asyncio.run(throughput(f"{oa_url}/v1/chat/completions", oa_raw, jh, conc, secs))
            fr = asyncio.run(throughput(floor_url, oa_raw, jh, conc, secs))
            pr = asyncio.run(throughput(f"{proxy}/v1/chat/completions", oa_raw, jh, conc, secs))
            rows.append([f"a) OpenAI→OpenAI c={conc}", f"{dr:.0f}", f"{fr:.0f}", f"{pr:.0f}", f"{pr / dr:.2f}"])
        dr = asyncio.run(throughput(f"{oa_url}/v1/chat/completions", cc_openai, jh, 32, secs))
        pr = asyncio.run(throughput(f"{proxy}/v1/messages", cc_raw, ah, 32, secs))
        rows.append(["b) Anthropic→OpenAI c=32", f"{dr:.0f}", "", f"{pr:.0f}", f"{pr / dr:.2f}"])
        print("\nThroughput (req/s)")
        print(table(rows, ["scenario", "direct", "floor", "proxy", "proxy/direct"]))

        rows = []
        sn = max(200, n // 4)
        for name, direct, through in [
            ("OpenAI→OpenAI 20 chunks", (f"{oas_url}/v1/chat/completions", oa_stream, jh),
             (f"{proxy}/v1/chat/completions", oa_stream, {**jh, "x-coderouter-profile": "stream"})),
            ("Anthropic→OpenAI 20 chunks", (f"{oas_url}/v1/chat/completions", oa_stream, jh),
             (f"{proxy}/v1/messages", an_stream, {**ah, "x-coderouter-profile": "stream"})),
            ("Anthropic passthrough", (f"{an_url}/v1/messages", an_stream, ah),
             (f"{proxy}/v1/messages", an_stream, {**ah, "x-coderouter-profile": "pass"})),
        ]:
            dt, df = asyncio.run(latency(*direct, sn, stream=True))
            tt, tf = asyncio.run(latency(*through, sn, stream=True))
            rows.append([name, ms(pct(df, 50)), ms(pct(tf, 50)), ms(pct(tf, 50) - pct(df, 50)),
                         ms(pct(dt, 50)), ms(pct(tt, 50)), ms(pct(tt, 50) - pct(dt, 50))])
        print("\nStreaming (ms, p50)")
        print(table(rows, ["scenario", "direct TTFB", "proxy TTFB", "added TTFB", "direct total", "proxy total",
                           "added total"]))
        rss_after = rss_mb(d.pid)
        print("\nDaemon")
        print(table([[f"{ready * 1000:.0f} ms (exec→/healthz {ready_exec * 1000:.0f} ms)", f"{rss_idle:.1f} MB",
                      f"{rss_after:.1f} MB", f"{(rss_after / rss_idle - 1) * 100:+.1f}%"]],
                    ["ready", "RSS idle", "RSS after", "growth"]))
        print(f"\nconditions: {os.cpu_count()} cores, daemon pinned to core 0, upstream fakes + load generator on "
              f"core 1, n={n} sequential requests per latency cell, {secs:g} s per throughput cell, "
              f"state {'disabled' if args.no_state else 'enabled (journal + audit + store)'}")
        return 0
    finally:
        for p in reversed(procs):
            stop(p)


def _start_daemon(tmp: Path, cfg: Path, state: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    text = cfg.read_text().replace("enabled = true", f"enabled = {'true' if state else 'false'}")
    c = tmp / f"bench-{state}.toml"
    c.write_text(text)
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / f"state-{state}")}
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(c), "--port", str(port), "--log-level",
                          "warning"], cwd=ROOT, env=env)
    pin(d.pid, {0})
    wait_healthz(f"http://127.0.0.1:{port}", d)
    return d, f"http://127.0.0.1:{port}"


def state_compare(n: int, secs: float) -> int:
    """Same requests against two daemons, one with journal + audit + store and one without, interleaved in
    rounds so that drift on a shared machine hits both alike."""
    pin(os.getpid(), {1})
    tmp = Path(tempfile.mkdtemp(prefix="crbench-"))
    procs: list[subprocess.Popen] = []
    try:
        oa, oa_url = start_fake("openai", "ok", {1})
        procs.append(oa)
        cfg = write_config(tmp, oa_url, oa_url, oa_url, True)
        results: dict[bool, dict[str, list[float]]] = {True: {"p50": [], "rps": []}, False: {"p50": [], "rps": []}}
        jh = {"content-type": "application/json"}
        body = orjson.dumps(OPENAI_BODY)
        direct_p50 = []
        for _round in range(3):
            for state in (True, False):
                d, url = _start_daemon(tmp, cfg, state)
                procs.append(d)
                try:
                    dt, _ = asyncio.run(latency(f"{oa_url}/v1/chat/completions", body, jh, n // 3))
                    tt, _ = asyncio.run(latency(f"{url}/v1/chat/completions", body, jh, n // 3))
                    direct_p50.append(pct(dt, 50))
                    results[state]["p50"].append(pct(tt, 50) - pct(dt, 50))
                    results[state]["rps"].append(asyncio.run(throughput(f"{url}/v1/chat/completions", body, jh,
                                                                        32, secs)))
                finally:
                    stop(d)
                    procs.remove(d)
        on, off = results[True], results[False]
        p_on, p_off = pct(on["p50"], 50), pct(off["p50"], 50)
        r_on, r_off = pct(on["rps"], 50), pct(off["rps"], 50)
        print("\nJournal + audit + store: enabled vs disabled (a) OpenAI→OpenAI, median of 3 interleaved rounds")
        print(table([
            ["added latency p50 (ms), c=1", ms(p_off), ms(p_on), f"{(p_on - p_off) * 1000:+.3f} ms",
             "met (≤ +0.1 ms)" if p_on - p_off <= 0.0001 else "MISSED"],
            ["throughput (req/s), c=32", f"{r_off:.0f}", f"{r_on:.0f}", f"{(r_on / r_off - 1) * 100:+.1f}%",
             "met (≥ -5%)" if r_on >= 0.95 * r_off else "MISSED"],
        ], ["measure", "state disabled", "state enabled", "delta", "target"]))
        return 0
    finally:
        for p in reversed(procs):
            stop(p)


if __name__ == "__main__":
    sys.exit(main())
