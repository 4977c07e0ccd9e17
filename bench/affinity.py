"""Prefix affinity: what it costs per request, and what it buys.

    .venv/bin/python bench/affinity.py [--quick]

1. The router's added cost of canonicalising and hashing a 200 KB Claude Code body (session key, billing
   header removed, chained segment digests, plus serialising the canonical body once), p50/p99 over many
   runs, in this process on one core.
2. Hit ratios: Claude-Code-shaped sessions (shared system prompt and tools, growing tool results, background
   calls with the same session id) straight at a fake llama-server with slots (the server choosing slots
   itself, the baseline) and through coderouterd, in the same run: lanes <= slots, and twice as many
   sessions as slots with slot save/restore.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import pct, table  # noqa: E402


def body_of_size(target: int) -> tuple[dict, dict]:
    import orjson

    from tests.support.claude_sessions import Session

    s = Session(0)
    while len(orjson.dumps(s.main_body())) < target:
        s.advance()
    return s.main_body(), s.headers


def cost(n: int) -> list[list[str]]:
    import orjson

    from coderouterd.affinity.service import Affinity
    from coderouterd.config.schema import ConfigModel
    from coderouterd.routing.request import ClientRequest

    cfg = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://127.0.0.1:1/v1"}},
                                      "profiles": {"default": {"providers": ["p"]}}})
    aff = Affinity(cfg)

    class _P:  # the provider as body_for sees it: local, so the canonical body goes upstream
        cfg = None


    rows = []
    for target in (200_000, 100_000):
        body, headers = body_of_size(target)
        raw = orjson.dumps(body)
        for kind in ("openai", "anthropic", "slots"):
            _P.cfg = cfg.providers["p"].model_copy(update={"kind": "openai" if kind == "slots" else kind})
            wall, cpu = [], []
            gc.collect()
            for _ in range(n):
                req = ClientRequest(ingress="anthropic", body=body, raw=raw, headers=headers, stream=False,
                                    model=body["model"], request_id="b")
                c0, t0 = time.thread_time(), time.perf_counter()
                t = aff.ticket(req)
                aff.body_for(t, _P, req)
                if kind == "slots":
                    t.lane  # noqa: B018 (a backend with slots: the prompt's digests and its lane, by prefix)
                wall.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.thread_time() - c0) * 1000)
            rows.append([f"{len(raw) / 1000:.0f} KB, {len(t.prompt.digests)} segments",
                         "openai upstream with slots: + digests and lane" if kind == "slots" else f"{kind} upstream",
                         f"{pct(wall, 50):.3f}", f"{pct(wall, 99):.3f}", f"{pct(cpu, 50):.3f}", f"{pct(cpu, 99):.3f}"])
    return rows


def ratios(turns_scale: float) -> list[list[str]]:
    from tests.fakes.runner import FakeServer
    from tests.support.claude_sessions import drive_router, drive_straight, reuse_report
    from tests.support.daemon import DaemonProcess

    cfg = """
[server]
port = {PORT}
[providers.llama]
kind = "openai"
base_url = "%s/v1"
model = "local-model"
[profiles.default]
providers = ["llama"]
"""
    rows = []
    for label, slots, save, sessions, turns in (("2 sessions (4 lanes), 4 slots, no save path", 4, False, 2, 16),
                                                ("4 sessions (8 lanes), 2 slots, save/restore", 2, True, 4, 10)):
        turns = max(4, int(turns * turns_scale))
        with FakeServer("llamacpp", name="base", n_slots=slots, slot_save=save) as fake:
            drive_straight(fake.url, sessions, turns)
            base = reuse_report(fake.fake.log)
        with tempfile.TemporaryDirectory() as tmp, \
                FakeServer("llamacpp", name="routed", n_slots=slots, slot_save=save) as fake:
            d = DaemonProcess(cfg % fake.url, Path(tmp)).start()
            try:
                drive_router(d.url, sessions, turns)
            finally:
                d.stop()
            got = reuse_report(fake.fake.log)
        for who, r in (("straight (server picks slots)", base), ("through coderouterd", got)):
            rows.append([label, who, str(r["requests"]), f"{r['prompt_tokens']:,}", f"{r['reused_tokens']:,}",
                         f"{r['best_tokens']:,}", f"{r['hit_ratio'] * 100:.1f}%", f"{r['of_best'] * 100:.1f}%"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 300 if args.quick else 2000
    print("Canonicalise + hash per request (ms, in-process, one core)")
    print(table(cost(n), ["body", "upstream", "wall p50", "wall p99", "CPU p50", "CPU p99"]))
    print("\nPrefix reuse on a fake llama-server (tokens)")
    print(table(ratios(0.5 if args.quick else 1.0),
                ["workload", "path", "requests", "prompt", "reused", "best possible", "hit ratio", "of best"]))
    print(f"\nconditions: {n} runs per body size and upstream kind (the anthropic row also serialises the canonical "
          "body, which only an Anthropic passthrough sends); CPU = thread time, without preemption by other load; hit ratios from the fake's own slot accounting (4 bytes per token), "
          "'best possible' = for each request the longest prefix shared with any earlier prompt")


if __name__ == "__main__":
    main()
