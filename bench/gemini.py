"""Gemini ingress vs chat ingress: the same conversation sent to coderouterd as a Gemini generateContent body
(what Gemini CLI sends) and as its chat-completions equivalent, against the same fast fake upstreams.

    .venv/bin/python bench/gemini.py [--quick]

Loopback only. The daemon is pinned to core 0; the fake upstreams and this load generator share core 1 (the
same layout as bench/responses.py). Scenarios: a small body and a Gemini-CLI-sized one (~40 KB: a long system
instruction and Gemini CLI's kind of function declarations), each non-streaming and streaming (20 text chunks
upstream, `alt=sse`), against an OpenAI-compatible and an Anthropic upstream.
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

from bench.common import pct, pin, start_ingress_pair, stop, table  # noqa: E402
from bench.proxy import latency, ms  # noqa: E402
from coderouterd.translate.gemini_request import translate_request  # noqa: E402


def small_body() -> dict:
    return {"contents": [{"role": "user", "parts": [{"text": "hello"}]}], "generationConfig": {"maxOutputTokens": 16}}


def cli_body() -> dict:
    """Shaped like Gemini CLI 0.61.0's first turn: a long system instruction, a dozen function declarations in
    Gemini's schema (upper-case types), two user text parts, thinking config."""
    words = " ".join(f"rule{i} keep edits small and run the tests before answering." for i in range(420))

    def fn(name: str, props: int) -> dict:
        return {"name": name, "description": f"{name}: " + "does a thing. " * 40,
                "parametersJsonSchema": {"type": "object", "properties": {
                    f"p{i}": {"type": "string", "description": "a parameter " * 8} for i in range(props)},
                    "required": ["p0"]}}

    decls = [fn(n, 5) for n in ("read_file", "write_file", "replace", "glob", "grep_search", "list_directory",
                                "run_shell_command", "web_fetch", "save_memory", "write_todos", "read_many_files",
                                "google_web_search")]
    return {"contents": [{"role": "user", "parts": [{"text": "<session_context>cwd: /work</session_context>"},
                                                    {"text": "say hi"}]}],
            "systemInstruction": {"role": "user", "parts": [{"text": words}]},
            "tools": [{"functionDeclarations": decls}],
            "generationConfig": {"temperature": 1, "topP": 0.95, "thinkingConfig": {"includeThoughts": True}}}


def as_chat(body: dict, stream: bool) -> dict:
    """The same request as a chat-completions client would send it (the daemon's own translation)."""
    chat = translate_request(body, "bench-model", stream=stream, sse=True).chat
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return chat


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 200 if args.quick else 1500
    pin(os.getpid(), {1})
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="crbench-gemini-"))
    try:
        proxy, daemon = start_ingress_pair(tmp, procs)
        rows = []
        cells = [(label, make, up) for up in ("openai", "anthropic")
                 for label, make in (("small", small_body), ("Gemini-CLI-sized", cli_body))]
        for label, make, upstream in cells:
            for stream in (False, True):
                body = make()
                gem_raw = orjson.dumps(body)
                chat_raw = orjson.dumps(as_chat(body, stream))
                gem_path = "/v1beta/models/bench-model:" + \
                    ("streamGenerateContent?alt=sse" if stream else "generateContent")
                profile = ("stream" if stream else "default") if upstream == "openai" else \
                    ("anstream" if stream else "an")
                h = {"content-type": "application/json", "x-coderouter-profile": profile}
                results: dict[str, list[float]] = {}
                firsts: dict[str, list[float]] = {}
                cpu: dict[str, float] = {}
                # Interleave the two ingresses in short rounds, alternating which goes first, so that drift in
                # the machine's load (it is shared) hits both alike.
                pair = [("chat", "/v1/chat/completions", chat_raw), ("gemini", gem_path, gem_raw)]
                for r in range(10):
                    for name, path, raw in (pair if r % 2 == 0 else pair[::-1]):
                        c0 = sum(daemon.cpu_times()[:2])
                        t, f = asyncio.run(latency(proxy + path, raw, h, n // 10, stream))
                        firsts.setdefault(name, []).extend(f)
                        cpu[name] = cpu.get(name, 0.0) + sum(daemon.cpu_times()[:2]) - c0
                        results.setdefault(name, []).extend(t)
                sent = 10 * (n // 10 + max(20, n // 100))  # latency() warms up with max(20, n/10) first
                c50, g50 = pct(results["chat"], 50), pct(results["gemini"], 50)
                c95, g95 = pct(results["chat"], 95), pct(results["gemini"], 95)
                rows.append([upstream, f"{label} {len(gem_raw) // 1024 or '<1'} KB",
                             "stream" if stream else "non-stream",
                             ms(c50), ms(g50), f"{(g50 - c50) * 1000:+.3f}", ms(c95), ms(g95),
                             f"{cpu['chat'] / sent * 1e6:.0f}", f"{cpu['gemini'] / sent * 1e6:.0f}",
                             f"{ms(pct(firsts['chat'], 50))} / {ms(pct(firsts['gemini'], 50))}" if stream else "–"])
        print(table(rows, ["upstream", "body", "mode", "chat p50 ms", "gemini p50 ms", "Δ p50 ms", "chat p95 ms",
                           "gemini p95 ms", "chat CPU µs/req", "gemini CPU µs/req",
                           "TTFB p50 ms chat / gemini"]))
        print(f"\n{n} requests per cell (sequential, one connection), daemon on core 0, fakes + client on core 1")
    finally:
        for p in reversed(procs):
            stop(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
