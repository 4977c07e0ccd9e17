"""A/B of the proxy's hot path: this tree's daemon against another tree's (e.g. the commit before the edge
guards), both running at once against the same fake upstreams, measured in alternating rounds so the
drift of a shared VM falls on both sides alike.

    .venv/bin/python bench/edge_ab.py --base /path/to/other/checkout [--rounds 6] [-n 300]
    .venv/bin/python bench/edge_ab.py --keys [--rounds 6] [-n 300]

--keys: both sides are this tree; side B has a team key (made with `corectl --json keys create`, so every request
must present it: x-api-key on the Anthropic routes, Bearer on the OpenAI one), side A none (issue 41).

Reports per scenario the median over rounds of each side's p50 / p99 latency and the c=8 throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.claude_body import claude_code_body  # noqa: E402
from bench.common import (  # noqa: E402
    PY,
    ROOT,
    edge_scenarios,
    free_port,
    pct,
    pin,
    start_edge_fakes,
    stop,
    table,
    wait_healthz,
)
from bench.proxy import latency, throughput  # noqa: E402


def start_daemon(tree: Path, cfg: Path, port: int, tmp: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["CODEROUTER_STATE_DIR"] = str(tmp)
    env["PYTHONPATH"] = str(tree)
    p = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg), "--port", str(port)], cwd=tree, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pin(p.pid, {0})
    wait_healthz(f"http://127.0.0.1:{port}", p)
    return p


def corectl(tree: Path, state_dir: Path, *args: str) -> dict:
    """corectl --json against the daemon whose state dir this is. Run on both sides with --keys: the first admin
    call loads the admin app (FastAPI) into the daemon, which both sides should carry alike."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["CODEROUTER_STATE_DIR"] = str(state_dir)
    env["PYTHONPATH"] = str(tree)
    r = subprocess.run([PY, "-m", "corectl", "--json", *args], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"corectl --json {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return dict(orjson.loads(r.stdout))


def with_key(headers: dict[str, str], key: str | None) -> dict[str, str]:
    if key is None:
        return headers
    if "anthropic-version" in headers:
        return {**headers, "x-api-key": key}
    return {**headers, "authorization": f"Bearer {key}"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="the other checkout (its coderouterd is side A)")
    ap.add_argument("--keys", action="store_true", help="this tree on both sides; side B requires a team key")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("-n", type=int, default=300, help="sequential requests per latency cell per round")
    ap.add_argument("--seconds", type=float, default=1.0, help="per throughput cell per round")
    args = ap.parse_args()
    if not args.keys and not args.base:
        ap.error("--base is required (or --keys)")
    base = ROOT if args.keys else Path(args.base).resolve()
    pin(os.getpid(), {1})
    tmp = Path(tempfile.mkdtemp(prefix="crab-"))
    procs: list[subprocess.Popen] = []
    try:
        started, cfg = start_edge_fakes(tmp)
        procs += started
        sides = {}
        keys: dict[str, str | None] = {}
        names = ("A (keys off)", "B (keys on)") if args.keys else ("A (base)", "B (this tree)")
        for name, tree in zip(names, (base, ROOT), strict=True):
            port = free_port()
            (tmp / name[0]).mkdir()
            procs.append(start_daemon(tree, cfg, port, tmp / name[0]))
            sides[name] = f"http://127.0.0.1:{port}"
            keys[name] = None
            if args.keys and name.startswith("B"):
                keys[name] = str(corectl(tree, tmp / name[0], "keys", "create", "bench")["key"])
            elif args.keys:
                corectl(tree, tmp / name[0], "status")
        scenarios = edge_scenarios(orjson.dumps(claude_code_body()))
        p50: dict = {}
        p99: dict = {}
        rps: dict = {}
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
            for scen, (path, body, headers) in scenarios.items():
                for side, url in order:
                    hs = with_key(headers, keys[side])
                    totals, _ = asyncio.run(latency(url + path, body, hs, args.n))
                    p50.setdefault((scen, side), []).append(pct(totals, 50))
                    p99.setdefault((scen, side), []).append(pct(totals, 99))
                    rps.setdefault((scen, side), []).append(
                        asyncio.run(throughput(url + path, body, hs, 8, args.seconds)))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        rows = []
        for scen in scenarios:
            a, b = (scen, names[0]), (scen, names[1])
            ma, mb = statistics.median(p50[a]), statistics.median(p50[b])
            rows.append([scen, f"{ma * 1000:.3f}", f"{mb * 1000:.3f}", f"{(mb - ma) * 1000:+.3f}",
                         f"{statistics.median(p99[a]) * 1000:.3f}", f"{statistics.median(p99[b]) * 1000:.3f}",
                         f"{statistics.median(rps[a]):.0f}", f"{statistics.median(rps[b]):.0f}"])
        print()
        print(table(rows, ["scenario", "A p50 ms", "B p50 ms", "B-A p50", "A p99 ms", "B p99 ms", "A req/s c=8",
                           "B req/s c=8"]))
        print(f"\nconditions: both daemons pinned to core 0 (alternating, never loaded together), fakes + load "
              f"generator on core 1; {args.rounds} rounds x {args.n} sequential requests per cell, "
              f"{args.seconds:g} s c=8 throughput per cell; medians over rounds; state enabled")
    finally:
        for p in procs:
            stop(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
