"""Routing benchmarks: race vs fallback vs direct, the cost of failing over, adaptive demotion speed.

    .venv/bin/python bench/routing.py [--quick]

Loopback only; fake upstreams in this process, the daemon as a child process. About a minute."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, pct, start_fake, stop, table, wait_healthz  # noqa: E402
from tests.fakes.runner import FakeServer  # noqa: E402
from tests.support.ports import dead_port  # noqa: E402

BODY = {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def start_daemon(cfg: str) -> tuple[subprocess.Popen, str]:
    tmp = Path(tempfile.mkdtemp(prefix="crbench-"))
    port = free_port()
    (tmp / "c.toml").write_text(cfg.replace("{PORT}", str(port)))
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(tmp / "c.toml"), "--log-level", "warning"],
                         cwd=ROOT, env={**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state")})
    url = f"http://127.0.0.1:{port}"
    wait_healthz(url, d)
    return d, url


def ttfb(client: httpx.Client, url: str, headers: dict | None = None, body: dict = BODY) -> tuple[float, str]:
    t0 = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers or {}) as r:
        chunks = r.iter_raw()
        next(chunks, None)
        first = time.perf_counter() - t0
        for _ in chunks:
            pass
        return first, r.headers.get("x-coderouter-provider", "")


def race_bench(n: int) -> list[list[str]]:
    # Out-of-process fakes: an in-process server would share the GIL with the measuring client.
    slow_p, slow_url = start_fake("openai", "slow_first_byte;delay=0.05")
    fast_p, fast_url = start_fake("openai", "slow_first_byte;delay=0.02")
    slow, fast = _Url(slow_url), _Url(fast_url)
    try:
        cfg = f"""
[server]
port = {{PORT}}
default_profile = "fallback"
[providers.slow]
base_url = "{slow.url}/v1"
[providers.fast]
base_url = "{fast.url}/v1"
[profiles.fallback]
providers = ["slow", "fast"]
[profiles.race]
providers = ["slow", "fast"]
mode = "race"
"""
        d, url = start_daemon(cfg)
        try:
            res = {}
            with httpx.Client(timeout=10) as c:
                for name, target, h in [("fast upstream direct", f"{fast.url}/v1/chat/completions", {}),
                                        ("fallback [slow, fast]", f"{url}/v1/messages",
                                         {"x-coderouter-profile": "fallback"}),
                                        ("race [slow, fast]", f"{url}/v1/messages", {"x-coderouter-profile": "race"})]:
                    body = BODY if "direct" not in name else {**BODY, "max_tokens": 8}
                    for _ in range(3):
                        ttfb(c, target, h, body)
                    res[name] = sorted(ttfb(c, target, h, body)[0] for _ in range(n))
            direct = pct(res["fast upstream direct"], 50)
            rows = []
            for name, v in res.items():
                p50 = pct(v, 50)
                rows.append([name, f"{p50 * 1000:.2f}", f"{pct(v, 95) * 1000:.2f}",
                             f"{(p50 - direct) * 1000:+.2f}"])
            target = direct * 1.05 + 0.001
            rows.append(["target: race ≤ direct×1.05 + 1 ms", f"{target * 1000:.2f}", "",
                         "met" if pct(res["race [slow, fast]"], 50) <= target else "MISSED"])
            return rows
        finally:
            stop(d)
    finally:
        stop(slow_p)
        stop(fast_p)


class _Url:
    def __init__(self, url: str) -> None:
        self.url = url


def failover_bench(n: int) -> list[list[str]]:
    dead = dead_port()
    with FakeServer("openai", name="good", record=True) as good:
        cfg = f"""
[server]
port = {{PORT}}
default_profile = "healthy"
[breaker]
failures = 1000
[providers.dead]
base_url = "http://127.0.0.1:{dead}/v1"
[providers.good]
base_url = "{good.url}/v1"
[profiles.healthy]
providers = ["good"]
[profiles.deadfirst]
providers = ["dead", "good"]
health_action = "warn"
"""
        d, url = start_daemon(cfg)
        rows = []
        try:
            with httpx.Client(timeout=10) as c:
                res = {}
                for prof in ("healthy", "deadfirst"):
                    for _ in range(20):
                        ttfb(c, f"{url}/v1/messages", {"x-coderouter-profile": prof})
                    res[prof] = sorted(ttfb(c, f"{url}/v1/messages", {"x-coderouter-profile": prof})[0]
                                       for _ in range(n))
            added = pct(res["deadfirst"], 50) - pct(res["healthy"], 50)
            rows.append(["healthy-only chain", f"{pct(res['healthy'], 50) * 1000:.2f}", "-", ""])
            rows.append(["dead first (connection refused), breaker never opens",
                         f"{pct(res['deadfirst'], 50) * 1000:.2f}", f"{added * 1000:+.2f}",
                         "met (≤ 2 ms)" if added <= 0.002 else "MISSED"])
        finally:
            stop(d)
        cfg2 = cfg.replace("failures = 1000", "failures = 3\nrecovery_s = 600")
        d, url = start_daemon(cfg2)
        try:
            with httpx.Client(timeout=10) as c:
                for _ in range(3):
                    ttfb(c, f"{url}/v1/messages", {"x-coderouter-profile": "deadfirst"})
                attempts_to_dead = 0
                lat = []
                for _ in range(n):
                    with c.stream("POST", f"{url}/v1/messages", json=BODY,
                                  headers={"x-coderouter-profile": "deadfirst"}) as r:
                        t0 = time.perf_counter()
                        r.read()
                        lat.append(time.perf_counter() - t0)
                        if "dead:connect_error" in r.headers["x-coderouter-attempts"]:
                            attempts_to_dead += 1
            rows.append([f"dead first, breaker open ({n} requests)", "", "",
                         f"{attempts_to_dead} attempts to the dead provider"])
        finally:
            stop(d)
        return rows


def adaptive_bench() -> list[list[str]]:
    with FakeServer("openai", name="p1", behaviour="slow_first_byte;delay=0.01", record=False) as p1, \
            FakeServer("openai", name="p2", behaviour="slow_first_byte;delay=0.01", record=False) as p2:
        cfg = f"""
[server]
port = {{PORT}}
[adaptive]
window_s = 10
debounce_s = 0
probe_interval_s = 1
max_probes_per_minute = 60
[providers.p1]
base_url = "{p1.url}/v1"
[providers.p2]
base_url = "{p2.url}/v1"
[profiles.default]
providers = ["p1", "p2"]
adaptive = true
"""
        d, url = start_daemon(cfg)
        try:
            with httpx.Client(timeout=10) as c:
                t_end = time.monotonic() + 3
                while time.monotonic() < t_end:  # warm up: real traffic to p1, probes to p2
                    ttfb(c, f"{url}/v1/messages")
                    time.sleep(0.05)
                p1.set_behaviour("slow_first_byte;delay=0.03")
                t0 = time.monotonic()
                n = 0
                while time.monotonic() - t0 < 60:
                    n += 1
                    _, prov = ttfb(c, f"{url}/v1/messages")
                    if prov == "p2":
                        break
                    time.sleep(0.05)
                secs = time.monotonic() - t0
            return [["p1 turns 3× slower (10 → 30 ms first byte)", str(n), f"{secs:.2f}"]]
        finally:
            stop(d)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    n = 40 if ap.parse_args().quick else 150
    print("\nRace: time to first byte (ms)")
    print(table(race_bench(n), ["setup", "p50", "p95", "vs faster direct"]))
    print("\nFailover cost (streaming TTFB, ms)")
    print(table(failover_bench(n), ["chain", "p50", "added p50", "verdict"]))
    print("\nAdaptive demotion (window 10 s, probes every 1 s, debounce 0, min 3 samples)")
    print(table(adaptive_bench(), ["event", "requests until demoted", "seconds"]))
    print(f"\nconditions: {os.cpu_count()} cores, loopback, fakes in the benchmark process, daemon as a child, "
          f"n={n} per cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
