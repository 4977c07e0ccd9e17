"""Responses ingress vs chat ingress: the same conversation sent to coderouterd as a Responses body (what Codex
sends) and as its chat-completions equivalent, against the same fast fake OpenAI-compatible upstream.

    .venv/bin/python bench/responses.py [--quick]

Loopback only. The daemon is pinned to core 0; the fake upstreams and this load generator share core 1 (the
same layout as bench/proxy.py). Scenarios: a small body, a Codex-sized body (~40 KB: developer instructions and
Codex's tool list), each non-streaming and streaming (20 text chunks upstream).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.codex_body import as_chat, codex_body, small_body  # noqa: E402
from bench.common import pct, pin, start_ingress_pair, stop, table  # noqa: E402
from bench.proxy import latency, ms  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 200 if args.quick else 1500
    pin(os.getpid(), {1})
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="crbench-responses-"))
    try:
        proxy, daemon = start_ingress_pair(tmp, procs)
        rows = []
        cells = [(label, make, up) for up in ("openai", "anthropic")
                 for label, make in (("small", small_body), ("Codex-sized", codex_body))]
        for label, make, upstream in cells:
            for stream in (False, True):
                body = make(stream)
                resp_raw = orjson.dumps(body)
                chat_raw = orjson.dumps(as_chat(body))
                profile = ("stream" if stream else "default") if upstream == "openai" else \
                    ("anstream" if stream else "an")
                h = {"content-type": "application/json", "x-coderouter-profile": profile}
                results: dict[str, list[float]] = {}
                firsts: dict[str, list[float]] = {}
                cpu: dict[str, float] = {}
                # Interleave the two ingresses in short rounds, alternating which goes first, so that drift in
                # the machine's load (it is shared) hits both alike.
                pair = [("chat", "/v1/chat/completions", chat_raw), ("responses", "/v1/responses", resp_raw)]
                for r in range(10):
                    for name, path, raw in (pair if r % 2 == 0 else pair[::-1]):
                        c0 = sum(daemon.cpu_times()[:2])
                        t, f = asyncio.run(latency(proxy + path, raw, h, n // 10, stream))
                        firsts.setdefault(name, []).extend(f)
                        cpu[name] = cpu.get(name, 0.0) + sum(daemon.cpu_times()[:2]) - c0
                        results.setdefault(name, []).extend(t)
                sent = 10 * (n // 10 + max(20, n // 100))  # latency() warms up with max(20, n/10) first
                c50, r50 = pct(results["chat"], 50), pct(results["responses"], 50)
                c95, r95 = pct(results["chat"], 95), pct(results["responses"], 95)
                rows.append([upstream, f"{label} {len(resp_raw) // 1024 or '<1'} KB",
                             "stream" if stream else "non-stream",
                             ms(c50), ms(r50), f"{(r50 - c50) * 1000:+.3f}", ms(c95), ms(r95),
                             f"{cpu['chat'] / sent * 1e6:.0f}", f"{cpu['responses'] / sent * 1e6:.0f}",
                             f"{ms(pct(firsts['chat'], 50))} / {ms(pct(firsts['responses'], 50))}" if stream else "–"])
        print(table(rows, ["upstream", "body", "mode", "chat p50 ms", "responses p50 ms", "Δ p50 ms", "chat p95 ms",
                           "responses p95 ms", "chat CPU µs/req", "responses CPU µs/req",
                           "TTFB p50 ms chat / responses"]))
        print(f"\n{n} requests per cell (sequential, one connection), daemon on core 0, fakes + client on core 1")
    finally:
        for p in reversed(procs):
            stop(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
