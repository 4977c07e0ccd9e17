"""The daemon's CPU time per request (user + sys from /proc), for the same requests against source trees.

    .venv/bin/python bench/cpu_per_request.py [TREE] [N]
    .venv/bin/python bench/cpu_per_request.py TREE_A TREE_B [...] [-n N] [--rounds 3]
    .venv/bin/python bench/cpu_per_request.py . .+noaffinity .+nodrift .+nostate --rounds 3

A tree may carry configuration tweaks after a `+` (see TWEAKS): the same tree with a feature off, so the
difference is that feature's CPU per request, measured without a profiler.

TREE defaults to this checkout; give another (a `git worktree add --detach` of an older commit) to compare
before/after. With several trees, each round runs every tree once, alternating the order, and the table shows
the median over rounds: CPU time is far less sensitive to a busy machine than latency is, but a shared VM still
drifts. Loopback only; this tree's fake upstreams (OpenAI, Anthropic) and config; each daemon runs its own tree's
code (cwd and PYTHONPATH); state enabled, in a temporary directory."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.claude_body import claude_code_body  # noqa: E402
from bench.common import PY, ROOT, free_port, pin, start_fake, stop, table, wait_healthz  # noqa: E402

SMALL = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
AH = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


def cases() -> list[tuple[str, str, bytes, dict]]:
    claude = orjson.dumps(claude_code_body())
    return [
        ("openai", "/v1/chat/completions", orjson.dumps(SMALL), AH),
        ("anthropic_stream", "/v1/messages", orjson.dumps({**SMALL, "stream": True}), AH),
        (f"claude_{len(claude) // 1024}k_to_openai", "/v1/messages", claude, AH),
        (f"claude_{len(claude) // 1024}k_passthrough", "/v1/messages", claude, {**AH, "x-coderouter-profile": "pass"}),
    ]


TWEAKS = {
    "noaffinity": ("", "[affinity]\nenabled = false\n"),
    "nodrift": ('drift_action = "off"\n', ""),
    "nostate": ("", "[state]\nenabled = false\n"),
}


def config_text(oa_url: str, an_url: str, tweaks: list[str]) -> str:
    per_profile = "".join(TWEAKS[t][0] for t in tweaks)
    sections = "".join(TWEAKS[t][1] for t in tweaks)
    state = "" if "nostate" in tweaks else "[state]\nenabled = true\n"
    return (f'[server]\nport = 0\n{state}{sections}'
            f'[providers.f]\nkind = "openai"\nbase_url = "{oa_url}/v1"\nmodel = "bench-model"\n'
            f'[providers.an]\nkind = "anthropic"\nbase_url = "{an_url}/v1"\n'
            f'[profiles.default]\nproviders = ["f"]\n{per_profile}[profiles.pass]\nproviders = ["an"]\n{per_profile}')


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_tree(tree: Path, cfg: Path, tmp: Path, n: int) -> dict[str, float]:
    port = free_port()
    if not cfg.exists():
        raise RuntimeError(f"no config {cfg}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    state = Path(tempfile.mkdtemp(prefix="state-", dir=tmp))
    env.update(CODEROUTER_STATE_DIR=str(state), CODEROUTER_ADMIN__SOCKET=str(state / "admin.sock"),
               PYTHONPATH=str(tree))
    # cwd and PYTHONPATH = the tree: `python -m coderouterd` imports that tree's code.
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg), "--port", str(port), "--log-level",
                          "error"], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pin(d.pid, {0})
    url = f"http://127.0.0.1:{port}"
    out = {}
    try:
        wait_healthz(url, d)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
            for _name, path, raw, headers in cases():  # warm-up: imports, pools, caches
                for _ in range(200):
                    async with s.post(url + path, data=raw, headers=headers) as r:
                        await r.read()
            for name, path, raw, headers in cases():
                c0 = cpu_seconds(d.pid)
                for _ in range(n):
                    async with s.post(url + path, data=raw, headers=headers) as r:
                        if r.status != 200:
                            raise RuntimeError(f"{tree} {name}: HTTP {r.status} {(await r.read())[:200]!r}")
                        await r.read()
                out[name] = (cpu_seconds(d.pid) - c0) / n * 1e6
    finally:
        stop(d)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="*", help="source trees (default: this one); a trailing number is N")
    ap.add_argument("-n", type=int, default=2000, help="requests per case")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    trees = list(args.trees)
    n = args.n
    if trees and trees[-1].isdigit():  # the old form: cpu_per_request.py TREE N
        n = int(trees.pop())
    specs = trees or [str(ROOT)]
    paths = [Path(t.split("+")[0]).resolve() for t in specs]
    for t in specs:
        for tweak in t.split("+")[1:]:
            if tweak not in TWEAKS:
                ap.error(f"unknown tweak {tweak!r} (known: {', '.join(TWEAKS)})")
    pin(os.getpid(), {1})
    tmp = Path(tempfile.mkdtemp(prefix="crcpu-"))
    oa, oa_url = start_fake("openai", "ok", {1})
    an, an_url = start_fake("anthropic", "ok", {1})
    configs = {}
    for i, t in enumerate(specs):
        configs[t] = tmp / f"c{i}.toml"
        configs[t].write_text(config_text(oa_url, an_url, t.split("+")[1:]))
    results: dict[str, list[dict[str, float]]] = {t: [] for t in specs}
    try:
        for r in range(args.rounds):
            for t, p in list(zip(specs, paths, strict=True))[::1 if r % 2 == 0 else -1]:
                res = asyncio.run(one_tree(p, configs[t], tmp, n))
                results[t].append(res)
                print(t, " ".join(f"{k}={v:.0f}us" for k, v in res.items()), flush=True)
    finally:
        stop(oa)
        stop(an)
    if args.rounds > 1 or len(specs) > 1:
        names = [c[0] for c in cases()]
        rows = [[t] + [f"{statistics.median(x[k] for x in results[t]):.0f}" for k in names] for t in specs]
        print(f"\nDaemon CPU per request (µs, user+sys, median of {args.rounds} round(s) x {n} sequential requests;"
              f" load average {os.getloadavg()[0]:.2f})")
        print(table(rows, ["tree", *names]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
