"""The measurement bench/responses.py and bench/gemini.py share: one ingress against the chat ingress for the same
conversation, on the fakes and daemon of common.start_ingress_pair, in a table of latency, TTFB and daemon CPU per
request. Each script says only how its ingress is asked (its path and body, and the chat equivalent)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.common import pct, pin, start_ingress_pair, stop, table
from bench.proxy import latency, ms

# For one body size: stream -> (the ingress's path, its body, the chat-completions body), JSON-encoded.
Request = Callable[[bool], tuple[str, bytes, bytes]]


def compare_with_chat(ingress: str, bodies: Sequence[tuple[str, Request]]) -> int:
    """Run the comparison for `ingress` (its name in the table) over `bodies` ((label, request)), each against
    an OpenAI-compatible and an Anthropic upstream, non-streaming and streaming; `--quick` for fewer requests."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 200 if args.quick else 1500
    pin(os.getpid(), {1})
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix=f"crbench-{ingress}-"))
    try:
        proxy, daemon = start_ingress_pair(tmp, procs)
        rows = []
        cells = [(label, request, up) for up in ("openai", "anthropic") for label, request in bodies]
        for label, request, upstream in cells:
            for stream in (False, True):
                path, raw, chat_raw = request(stream)
                profile = ("stream" if stream else "default") if upstream == "openai" else \
                    ("anstream" if stream else "an")
                h = {"content-type": "application/json", "x-coderouter-profile": profile}
                results: dict[str, list[float]] = {}
                firsts: dict[str, list[float]] = {}
                cpu: dict[str, float] = {}
                # Interleave the two ingresses in short rounds, alternating which goes first, so that drift in
                # the machine's load (it is shared) hits both alike.
                pair = [("chat", "/v1/chat/completions", chat_raw), (ingress, path, raw)]
                for r in range(10):
                    for name, url_path, body in (pair if r % 2 == 0 else pair[::-1]):
                        c0 = sum(daemon.cpu_times()[:2])
                        t, f = asyncio.run(latency(proxy + url_path, body, h, n // 10, stream))
                        firsts.setdefault(name, []).extend(f)
                        cpu[name] = cpu.get(name, 0.0) + sum(daemon.cpu_times()[:2]) - c0
                        results.setdefault(name, []).extend(t)
                sent = 10 * (n // 10 + max(20, n // 100))  # latency() warms up with max(20, n/10) first
                c50, i50 = pct(results["chat"], 50), pct(results[ingress], 50)
                c95, i95 = pct(results["chat"], 95), pct(results[ingress], 95)
                rows.append([upstream, f"{label} {len(raw) // 1024 or '<1'} KB",
                             "stream" if stream else "non-stream",
                             ms(c50), ms(i50), f"{(i50 - c50) * 1000:+.3f}", ms(c95), ms(i95),
                             f"{cpu['chat'] / sent * 1e6:.0f}", f"{cpu[ingress] / sent * 1e6:.0f}",
                             f"{ms(pct(firsts['chat'], 50))} / {ms(pct(firsts[ingress], 50))}" if stream else "–"])
        print(table(rows, ["upstream", "body", "mode", "chat p50 ms", f"{ingress} p50 ms", "Δ p50 ms", "chat p95 ms",
                           f"{ingress} p95 ms", "chat CPU µs/req", f"{ingress} CPU µs/req",
                           f"TTFB p50 ms chat / {ingress}"]))
        print(f"\n{n} requests per cell (sequential, one connection), daemon on core 0, fakes + client on core 1")
    finally:
        for p in reversed(procs):
            stop(p)
    return 0
