"""CPU per request by stage: where a request's CPU goes inside coderouterd, for this tree and optionally another.

    .venv/bin/python bench/stages.py [--base OTHER_CHECKOUT] [-n 1500] [--rounds 1]
    .venv/bin/python bench/proxy.py --stages [--base OTHER_CHECKOUT]      (the same thing)

Nothing in the daemon is changed for this: the daemon runs under `bench/stages.py --daemon TREE`, a wrapper
that imports the tree's `coderouterd.__main__` and turns cProfile on and off on the loop thread at SIGUSR1 (so
an older checkout is measured the same way). For each scenario, sequential requests (c=1) are sent twice:
once without the profiler, reading the daemon's CPU time from /proc (whole process and loop thread), and once
under cProfile. The profile's self time is attributed to a stage by the module a function lives in; a function
outside the known modules (the standard library, builtins such as orjson.loads or hashlib) is charged to the
stages of its callers, in proportion to the time each caller spent in it. The stage rows are cProfile's self
time per request: the profiler inflates code that makes many small calls, and uvloop's own socket reads and
writes (C, called from C) are in no stage. So compare stages between trees, and read absolute CPU in the
unprofiled rows (the loop thread's and the whole process's CPU per request, from /proc).

Loopback only; the daemon on core 0, fakes and this load generator on core 1; state enabled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("edge (HTTP, ASGI, answer out)", "body parse + validation", "affinity (canonical, digests)",
          "request translation", "planning / routing", "upstream client (aiohttp)", "relay / answer translation",
          "finishing (journal, metrics, drift, trace)", "event loop / other")
EDGE, PARSE, AFF, XREQ, ROUTE, UP, RELAY, FINISH, OTHER = STAGES


# The strategies' modules, before strategies.py was split (issue 44) and after: either tree's land here.
RELAY_MODULES = frozenset({"providers/strategies.py", "providers/responses_strategies.py", "providers/strategy.py",
                           "providers/upstream_answer.py", "providers/anthropic_strategies.py",
                           "providers/openai_strategies.py", "providers/anthropic_as_chat.py",
                           "providers/through_chat.py", "providers/gemini_strategies.py"})


def _module_stage(path: str, func: str) -> str | None:
    """The stage a function's own time belongs to, from its file; None: charge it to its callers."""
    p = path.replace("\\", "/")
    if "/coderouterd/" in p:
        rel = p.rsplit("/coderouterd/", 1)[1]
        top = rel.split("/", 1)[0]
        name = rel.rsplit("/", 1)[-1]
        if top == "affinity":
            return AFF
        if top == "translate" or top == "protocol" or top == "wire":
            if "request" in name or "request" in func or name in ("images.py", "unsigned_thinking.py"):
                return XREQ
            return None  # a helper: whoever called it (request translation or the relay)
        if rel.startswith("ingress/validate") or rel in ("ingress/auth.py", "ingress/tokens.py"):
            return PARSE
        if top == "ingress" or rel == "app.py":
            return EDGE
        if top in ("routing", "guards") or rel in ("runtime.py", "providers/runtime.py"):
            if rel in ("routing/record.py", "routing/sink.py"):
                return FINISH
            return ROUTE
        if rel in RELAY_MODULES:
            return RELAY
        if top == "providers" or top == "servers":
            return UP
        if top in ("state", "observe", "quality", "ui") or rel in (
                "after_response.py", "telemetry.py", "metrics.py", "tasks.py", "persisted.py"):
            return FINISH
        return None
    for mod, stage in (("/uvicorn/", EDGE), ("/httptools/", EDGE), ("/h11/", EDGE), ("/aiohttp/", UP),
                       ("/yarl/", UP), ("/multidict/", UP), ("/aiohappyeyeballs/", UP), ("/aiosignal/", UP),
                       ("/frozenlist/", UP), ("/propcache/", UP)):
        if mod in p:
            return stage
    if func == "<built-in method orjson.loads>":
        return PARSE
    return None


def attribute(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of profiled self time per stage."""
    raw = stats.stats  # type: ignore[attr-defined]
    memo: dict[tuple, dict[str, float]] = {}

    def dist(fn: tuple, seen: frozenset) -> dict[str, float]:
        if fn in memo:
            return memo[fn]
        stage = _module_stage(fn[0], fn[2])
        if stage is not None:
            out = {stage: 1.0}
        else:
            callers = raw.get(fn, (0, 0, 0, 0, {}))[4]
            weights = {c: v[2] + 1e-12 for c, v in callers.items() if c not in seen}
            total = sum(weights.values())
            if not total:
                out = {OTHER: 1.0}
            else:
                out = {}
                for c, w in weights.items():
                    for s, share in dist(c, seen | {fn}).items():
                        out[s] = out.get(s, 0.0) + share * w / total
        if not seen:
            memo[fn] = out
        return out

    totals = dict.fromkeys(STAGES, 0.0)
    for fn, (_cc, _nc, tt, _ct, _callers) in raw.items():
        for s, share in dist(fn, frozenset()).items():
            totals[s] += tt * share
    return totals


def top_functions(stats: pstats.Stats, k: int = 25) -> list[tuple[float, str]]:
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(((v[2], f"{Path(fn[0]).name}:{fn[1]}({fn[2]})") for fn, v in raw.items()), reverse=True)
    return rows[:k]


# ---------------------------------------------------------------------------------------------------- daemon side


def run_daemon(tree: str, out_dir: str, argv: list[str]) -> int:
    """The daemon of `tree`, with cProfile toggled on the loop thread by SIGUSR1 (each stop writes the next
    prof-K.out in out_dir and touches K.done)."""
    import cProfile
    import gc
    import json

    sys.path.insert(0, tree)
    state: dict = {"prof": None, "k": 0}
    gc_time = [0.0, 0, 0.0]  # seconds in collections, collections, start of the current one

    def on_gc(phase: str, _info: dict) -> None:
        if state["prof"] is None:
            return
        if phase == "start":
            gc_time[2] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_time[2]
            gc_time[1] += 1

    gc.callbacks.append(on_gc)

    def toggle(_sig, _frame) -> None:
        prof = state["prof"]
        if prof is None:
            gc_time[0], gc_time[1] = 0.0, 0
            state["prof"] = cProfile.Profile()
            state["prof"].enable()
            Path(out_dir, "on").touch()
        else:
            prof.disable()
            state["prof"] = None
            k = state["k"]
            state["k"] = k + 1
            prof.dump_stats(str(Path(out_dir, f"prof-{k}.out")))
            Path(out_dir, f"gc-{k}.json").write_text(json.dumps({"seconds": gc_time[0], "collections": gc_time[1]}))
            Path(out_dir, "on").unlink(missing_ok=True)
            Path(out_dir, f"{k}.done").touch()

    signal.signal(signal.SIGUSR1, toggle)
    from coderouterd.__main__ import main as daemon_main

    return daemon_main(argv)


# ------------------------------------------------------------------------------------------------- load generator


def _cpu(pid: int, tid: int | None = None) -> float:
    p = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(p).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_file(p: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not p.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not answer the profiler signal ({p.name})")
        time.sleep(0.01)


async def _requests(url: str, body: bytes, headers: dict, n: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for _ in range(n):
            async with s.post(url, data=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:300]!r}")
                await r.read()


def measure_tree(tree: Path, cfg: Path, scenarios: dict, n: int, tmp: Path, label: str) -> dict:
    """{scenario: {"cpu": us/request whole process, "loop": us on the loop thread, "stages": {stage: us}, "top": ...}}"""
    from bench.common import PY, free_port, pin, stop, wait_healthz

    port = free_port()
    state = tmp / f"state-{label}"
    prof_dir = tmp / f"prof-{label}"
    prof_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env.update(CODEROUTER_STATE_DIR=str(state), CODEROUTER_ADMIN__SOCKET=str(tmp / f"admin-{label}" / "a.sock"),
               PYTHONPATH=str(tree))
    d = subprocess.Popen([PY, str(Path(__file__).resolve()), "--daemon", str(tree), str(prof_dir), "--",
                          "--config", str(cfg), "--port", str(port), "--log-level", "warning"], cwd=tree, env=env,
                         stdout=subprocess.DEVNULL)
    out: dict = {}
    try:
        pin(d.pid, {0})
        wait_healthz(f"http://127.0.0.1:{port}", d)
        url = f"http://127.0.0.1:{port}"
        for path, body, headers in scenarios.values():  # warm-up: imports, pools, caches
            asyncio.run(_requests(url + path, body, headers, 300))
        for k, (scen, (path, body, headers)) in enumerate(scenarios.items()):
            c0, l0 = _cpu(d.pid), _cpu(d.pid, d.pid)
            asyncio.run(_requests(url + path, body, headers, n))
            cpu = (_cpu(d.pid) - c0) / n * 1e6
            loop = (_cpu(d.pid, d.pid) - l0) / n * 1e6
            d.send_signal(signal.SIGUSR1)
            _wait_file(prof_dir / "on")
            asyncio.run(_requests(url + path, body, headers, n))
            d.send_signal(signal.SIGUSR1)
            _wait_file(prof_dir / f"{k}.done")
            st = pstats.Stats(str(prof_dir / f"prof-{k}.out"))
            by_stage = attribute(st)
            gcs = json.loads((prof_dir / f"gc-{k}.json").read_text())
            out[scen] = {"gc": gcs["seconds"] / n * 1e6, "gc_n": gcs["collections"], "cpu": cpu, "loop": loop, "profiled": sum(by_stage.values()) / n * 1e6,
                         "stages": {s: v / n * 1e6 for s, v in by_stage.items()}, "top": top_functions(st)}
    finally:
        stop(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="another checkout, measured the same way (column A)")
    ap.add_argument("-n", type=int, default=1500, help="requests per scenario per phase")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the trees this many times; medians")
    ap.add_argument("--top", type=int, default=0, help="also print the N functions with most self time")
    args = ap.parse_args(argv)

    import orjson

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.claude_body import claude_code_body
    from bench.common import ROOT, edge_scenarios, pin, start_edge_fakes, stop, table

    pin(os.getpid(), {1})
    tmp = Path(tempfile.mkdtemp(prefix="crstages-"))
    procs = []
    try:
        started, cfg = start_edge_fakes(tmp)
        procs += started
        scenarios = edge_scenarios(orjson.dumps(claude_code_body()))
        trees = ([("A", Path(args.base).resolve())] if args.base else []) + [("B", ROOT)]
        runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else list(reversed(trees))
            for label, tree in order:
                runs[label].append(measure_tree(tree, cfg, scenarios, args.n, tmp, f"{label}{r}"))
            print(f"round {r + 1}/{args.rounds} done", flush=True)

        def med(label: str, scen: str, key: str, stage: str | None = None) -> float:
            vals = [run[scen][key][stage] if stage else run[scen][key] for run in runs[label]]
            return statistics.median(vals)

        for scen in scenarios:
            header = ["stage"] + [f"{label} µs/req" for label, _ in trees]
            if args.base:
                header.append("B-A")
            rows = []
            for stage in STAGES:
                vals = [med(label, scen, "stages", stage) for label, _ in trees]
                rows.append([stage, *(f"{v:.0f}" for v in vals)] + ([f"{vals[1] - vals[0]:+.0f}"] if args.base else []))
            for key, name in (("gc", "  garbage collector (inside the stages above)"),
                              ("profiled", "sum of the stages (under cProfile)"),
                              ("loop", "loop thread, no profiler"), ("cpu", "whole process, no profiler")):
                vals = [med(label, scen, key) for label, _ in trees]
                rows.append([name, *(f"{v:.0f}" for v in vals)] + ([f"{vals[1] - vals[0]:+.0f}"] if args.base else []))
            vals = [med(label, scen, "cpu") - med(label, scen, "loop") for label, _ in trees]
            rows.append(["  of which other threads (writer, bus)", *(f"{v:.0f}" for v in vals)]
                        + ([f"{vals[1] - vals[0]:+.0f}"] if args.base else []))
            print(f"\nCPU per request by stage: {scen} (µs; {args.n} sequential requests per phase, "
                  f"{args.rounds} round(s), medians)")
            print(table(rows, header))
            if args.top:
                for label, _ in trees:
                    print(f"\n  {label}: top self time under cProfile (ms over {args.n} requests, last round)")
                    for tt, name in runs[label][-1][scen]["top"][:args.top]:
                        print(f"    {tt * 1000:8.1f}  {name}")
        where = f"A = {Path(args.base).resolve()}, " if args.base else ""
        print(f"\nconditions: {where}B = {ROOT}; {os.cpu_count()} cores, daemon pinned to core 0, fakes + load "
              f"generator on core 1; stages = cProfile self time on the loop thread per request (the profiler "
              f"inflates Python calls; uvloop's own socket work in C is in no stage, only in the unprofiled "
              f"rows); state enabled; load average {os.getloadavg()[0]:.2f}")
        return 0
    finally:
        for p in procs:
            stop(p)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--daemon":
        sys.exit(run_daemon(sys.argv[2], sys.argv[3], sys.argv[5:]))
    sys.exit(main())
