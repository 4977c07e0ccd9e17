"""Proxy overhead benchmark: the same requests direct to a fast fake upstream and through coderouterd.

    .venv/bin/python bench/proxy.py [--quick] [--no-state] [--rounds 3] [-n 1700]
    .venv/bin/python bench/proxy.py --memory 100000
    .venv/bin/python bench/proxy.py --stages [--base OTHER_CHECKOUT] [-n 1500] [--rounds 1]   (bench/stages.py)

Loopback only, bounded in time (about four minutes; --quick: half a minute). The daemon and the floors
(bench/floor.py) are pinned to core 0; the fake upstreams and the load generator (this process; wrk for
throughput when installed) share core 1. Every cell is measured direct, through the floor for its scenario
and through coderouterd, in interleaved rounds, and the table reports coderouterd over the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
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
    OPENAI_BODY,
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
    write_config,
)
from coderouterd.translate.anthropic_request_to_openai import request_to_openai  # noqa: E402


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


def wrk_rps(url: str, body: bytes, headers: dict, concurrency: int, seconds: float, tmp: Path) -> float | None:
    """req/s from wrk (C, one thread on the load-generator core), or None when wrk is not installed."""
    if shutil.which("wrk") is None:
        return None
    bpath = tmp / f"body-{len(body)}.json"
    bpath.write_bytes(body)
    lua = tmp / f"post-{len(body)}-{abs(hash(tuple(headers.items())))}.lua"
    hdrs = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    lua.write_text(f'wrk.method = "POST"\nlocal f = io.open("{bpath}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
                   + hdrs)
    cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "-s", str(lua), url]
    out = subprocess.run(["taskset", "-c", "1", *cmd] if shutil.which("taskset") else cmd, capture_output=True,
                         text=True, timeout=seconds + 30).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"wrk printed no rate: {out[-500:]!r}")


def rps(url, body, headers, concurrency, seconds, tmp) -> tuple[float, str]:
    r = wrk_rps(url, body, headers, concurrency, seconds, tmp)
    if r is not None:
        return r, "wrk"
    return asyncio.run(throughput(url, body, headers, concurrency, seconds)), "aiohttp"


def mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--no-state", action="store_true", help="run the daemon with journal/audit/store disabled")
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each throughput phase")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (direct, floor, proxy) per cell")
    ap.add_argument("-n", type=int, default=1700, help="sequential requests per cell per round (x rounds >= 5000)")
    ap.add_argument("--memory", type=int, default=0, metavar="N",
                    help="only the memory run: N requests at c=32 (issue 16: 100000), RSS along the way")
    ap.add_argument("--state-compare", action="store_true",
                    help="only compare journal+audit+store enabled vs disabled (issue: +0.1 ms p50, -5%% req/s)")
    ap.add_argument("--stages", action="store_true",
                    help="only CPU per request by stage (bench/stages.py), for this tree and --base if given")
    ap.add_argument("--base", help="with --stages: another checkout, measured the same way (column A)")
    args = ap.parse_args()
    if args.stages:
        from bench.stages import main as stages_main

        return stages_main([*(["--base", args.base] if args.base else []), "-n", str(200 if args.quick else
                                                                                   min(args.n, 1500)),
                            "--rounds", str(1 if args.quick else args.rounds)])
    if args.state_compare:
        return state_compare(300 if args.quick else 2000, 1.0 if args.quick else args.seconds)
    from bench.codex_body import as_chat, codex_body

    n = 200 if args.quick else args.n
    rounds = 1 if args.quick else args.rounds
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
        env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state"),
               "CODEROUTER_ADMIN__SOCKET": str(tmp / "admin" / "a.sock")}
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
        floor = f"http://127.0.0.1:{fport}"
        time.sleep(0.5)
        rss_idle = rss_mb(d.pid)
        proxy = f"http://127.0.0.1:{port}"
        if args.memory:
            return memory_run(proxy, d.pid, args.memory, tmp)
        jh = {"content-type": "application/json"}
        ah = {**jh, "anthropic-version": "2023-06-01", "x-api-key": "bench"}
        cc = claude_code_body()
        cc_raw = orjson.dumps(cc)
        cc_openai = orjson.dumps(request_to_openai(cc, "bench-model", stream=False)[0])
        cx = codex_body(stream=False)
        cx_raw = orjson.dumps(cx)
        cx_chat = orjson.dumps(as_chat(cx))
        oa_raw = orjson.dumps(OPENAI_BODY)
        oa_stream = orjson.dumps({**OPENAI_BODY, "stream": True})
        an_small = orjson.dumps({"model": "bench-model", "max_tokens": 16, "messages": OPENAI_BODY["messages"]})
        an_stream = orjson.dumps({"model": "bench-model", "max_tokens": 16, "stream": True,
                                  "messages": OPENAI_BODY["messages"]})
        oa_chat = f"{oa_url}/v1/chat/completions"
        # name, floor kind, (direct), (floor), (through coderouterd)
        scenarios = [
            ("a) OpenAI→OpenAI", "bare", (oa_chat, oa_raw, jh), (f"{floor}/v1/chat/completions", oa_raw, jh),
             (f"{proxy}/v1/chat/completions", oa_raw, jh)),
            (f"b) Anthropic→OpenAI {len(cc_raw) // 1024} KB", "parse", (oa_chat, cc_openai, jh),
             (f"{floor}/parse/v1/chat/completions", cc_openai, jh), (f"{proxy}/v1/messages", cc_raw, ah)),
            ("c) Anthropic passthrough", "bare", (f"{an_url}/v1/messages", an_small, ah),
             (f"{floor}/v1/messages", an_small, {**ah, "x-upstream": an_url}),
             (f"{proxy}/v1/messages", an_small, {**ah, "x-coderouter-profile": "pass"})),
            (f"d) Responses→OpenAI (Codex) {len(cx_raw) // 1024} KB", "parse", (oa_chat, cx_chat, jh),
             (f"{floor}/parse/v1/chat/completions", cx_chat, jh), (f"{proxy}/v1/responses", cx_raw, jh)),
        ]
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):  # interleaved, so drift on a shared machine hits all three alike
            for name, _kind, direct, fl_, through in scenarios:
                for who, target in (("direct", direct), ("floor", fl_), ("proxy", through)):
                    t, _ = asyncio.run(latency(*target, n))
                    samples.setdefault((name, who), []).extend(t)
        rows = []
        verdicts = []
        for name, kind, *_ in scenarios:
            d_, f_, p_ = samples[(name, "direct")], samples[(name, "floor")], samples[(name, "proxy")]
            f50, f99 = pct(f_, 50) - pct(d_, 50), pct(f_, 99) - pct(d_, 99)
            a50, a99 = pct(p_, 50) - pct(d_, 50), pct(p_, 99) - pct(d_, 99)
            rows.append([name, str(len(p_)), ms(pct(d_, 50)), ms(f50), ms(a50), ms(a50 - f50), ms(pct(d_, 99)),
                         ms(f99), ms(a99)])
            budget = 0.00015 if kind == "bare" else 0.0005
            verdicts.append([f"{name}: added p50 ≤ {kind} floor + {budget * 1000:g} ms", f"{(a50 - f50) * 1000:+.3f} ms",
                             mark(a50 - f50 <= budget)])
            if name[0] in "ab":
                verdicts.append([f"{name}: added p99 ≤ 1.5 ms", f"{a99 * 1000:.3f} ms", mark(a99 <= 0.0015)])
        print(f"\nAdded latency at concurrency 1 (ms; {rounds} interleaved rounds x {n} requests per cell)")
        print(table(rows, ["scenario", "samples", "direct p50", "floor added p50", "added p50", "over floor p50",
                           "direct p99", "floor added p99", "added p99"]))

        rows = []
        tool = "aiohttp"
        for name, body_d, body_p, hp, fpath in (
                ("a) OpenAI→OpenAI c=32", oa_raw, oa_raw, jh, "/v1/chat/completions"),
                ("b) Anthropic→OpenAI c=32", cc_openai, cc_raw, ah, "/parse/v1/chat/completions")):
            dr, tool = rps(oa_chat, body_d, jh, 32, secs, tmp)
            fr, _ = rps(f"{floor}{fpath}", body_d, jh, 32, secs, tmp)
            pr, _ = rps(f"{proxy}{'/v1/chat/completions' if name[0] == 'a' else '/v1/messages'}", body_p, hp, 32,
                        secs, tmp)
            rows.append([name, f"{dr:.0f}", f"{fr:.0f}", f"{pr:.0f}", f"{pr / fr:.2f}"])
            verdicts.append([f"{name}: req/s ≥ 85% of the floor's", f"{pr / fr * 100:.0f}%", mark(pr >= 0.85 * fr)])
        print(f"\nThroughput (req/s, {tool}, {secs:g} s per cell)")
        print(table(rows, ["scenario", "direct", "floor", "proxy", "proxy/floor"]))

        rows = []
        sn = max(200, n)
        oas_chat = f"{oas_url}/v1/chat/completions"
        for name, direct, fl_, through in [
            ("OpenAI→OpenAI 20 chunks", (oas_chat, oa_stream, jh),
             (f"{floor}/v1/chat/completions", oa_stream, {**jh, "x-upstream": oas_url}),
             (f"{proxy}/v1/chat/completions", oa_stream, {**jh, "x-coderouter-profile": "stream"})),
            ("Anthropic→OpenAI 20 chunks", (oas_chat, oa_stream, jh),
             (f"{floor}/v1/chat/completions", oa_stream, {**jh, "x-upstream": oas_url}),
             (f"{proxy}/v1/messages", an_stream, {**ah, "x-coderouter-profile": "stream"})),
            ("Anthropic passthrough", (f"{an_url}/v1/messages", an_stream, ah),
             (f"{floor}/v1/messages", an_stream, {**ah, "x-upstream": an_url}),
             (f"{proxy}/v1/messages", an_stream, {**ah, "x-coderouter-profile": "pass"})),
        ]:
            ttfb: dict[str, list[float]] = {}
            for _ in range(rounds):
                for who, target in (("direct", direct), ("floor", fl_), ("proxy", through)):
                    _t, f = asyncio.run(latency(*target, sn, stream=True))
                    ttfb.setdefault(who, []).extend(f)
            d_, f_, p_ = ttfb["direct"], ttfb["floor"], ttfb["proxy"]
            over = (pct(p_, 50) - pct(d_, 50)) - (pct(f_, 50) - pct(d_, 50))
            rows.append([name, ms(pct(d_, 50)), ms(pct(f_, 50) - pct(d_, 50)), ms(pct(p_, 50) - pct(d_, 50)),
                         ms(over), ms(pct(f_, 99) - pct(d_, 99)), ms(pct(p_, 99) - pct(d_, 99))])
            verdicts.append([f"{name}: TTFB ≤ streaming floor + 0.3 ms", f"{over * 1000:+.3f} ms",
                             mark(over <= 0.0003)])
        print(f"\nStreaming first byte (ms; {rounds} x {sn} requests per cell)")
        print(table(rows, ["scenario", "direct TTFB p50", "floor added p50", "added p50", "over floor p50",
                           "floor added p99", "added p99"]))
        rss_after = rss_mb(d.pid)
        print("\nDaemon")
        print(table([[f"{ready * 1000:.0f} ms (exec→/healthz {ready_exec * 1000:.0f} ms)", f"{rss_idle:.1f} MB",
                      f"{rss_after:.1f} MB", f"{(rss_after / rss_idle - 1) * 100:+.1f}%"]],
                    ["ready", "RSS idle", "RSS after", "growth"]))
        print("\nTargets (issue 16)")
        print(table(verdicts, ["target", "measured", ""]))
        print(f"\nconditions: {os.cpu_count()} cores, daemon and floor pinned to core 0, upstream fakes + load "
              f"generator on core 1, {rounds} interleaved rounds x {n} sequential requests per latency cell, "
              f"{secs:g} s per throughput cell, state {'disabled' if args.no_state else 'enabled (journal + audit + store)'}"
              f", load average before: {os.getloadavg()[0]:.2f}")
        return 0
    finally:
        for p in reversed(procs):
            stop(p)


def memory_run(proxy: str, pid: int, total: int, tmp: Path) -> int:
    """RSS over `total` requests at c=32, half small OpenAI bodies and half the 95 KB Claude Code body (issue 16:
    within 15 MB of the RSS after the first 10,000, and flat over the last 50,000)."""
    jh = {"content-type": "application/json"}
    ah = {**jh, "anthropic-version": "2023-06-01", "x-api-key": "bench"}
    small = orjson.dumps(OPENAI_BODY)
    big = orjson.dumps(claude_code_body())
    done = 0
    rows = []
    step = 10_000
    t0 = time.monotonic()

    async def burst(count: int) -> None:
        conn = aiohttp.TCPConnector(limit=32)
        left = count
        async with aiohttp.ClientSession(connector=conn) as s:
            async def worker(i: int) -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    if i % 2:
                        await one(s, f"{proxy}/v1/messages", big, ah, False)
                    else:
                        await one(s, f"{proxy}/v1/chat/completions", small, jh, False)

            await asyncio.gather(*(worker(i) for i in range(32)))

    while done < total:
        asyncio.run(burst(min(step, total - done)))
        done = min(total, done + step)
        rows.append([f"{done:,}", f"{rss_mb(pid):.1f}", f"{time.monotonic() - t0:.0f}"])
        print(f"  {done:,} requests: RSS {rows[-1][1]} MB", flush=True)
    print("\nMemory (RSS of coderouterd, c=32, half 95 KB Anthropic bodies)")
    print(table(rows, ["requests", "RSS MB", "elapsed s"]))
    first = float(rows[0][1])
    last = float(rows[-1][1])
    half = float(rows[len(rows) // 2 - 1][1]) if len(rows) >= 2 else first
    print(f"\nafter {rows[0][0]}: {first:.1f} MB; after {rows[-1][0]}: {last:.1f} MB ({last - first:+.1f} MB, target "
          f"≤ +15 MB: {mark(last - first <= 15)}); over the last half: {last - half:+.1f} MB")
    return 0


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
