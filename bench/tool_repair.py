"""Streaming overhead of tool-call repair, in process (the repair is pure CPU on the proxy's event loop).

    .venv/bin/python bench/tool_repair.py [--rounds N]

Measures, with and without repair (and with repair plus the answer figures drift detection gathers), through the real strategy classes (SSE events parsed -> client bytes):
- per-chunk cost on plain prose (word-sized deltas, a newline every ~70 characters), both upstream wires;
- added time to first byte for plain text: the cost of the first content chunk of an answer, from a fresh
  strategy (what a client waits for beyond the upstream's own first token);
- the cost of the repairer alone per chunk, and of a whole Hermes call streamed in 3-character pieces.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coderouterd.config.schema import ProviderConfig  # noqa: E402
from coderouterd.providers.strategies import AnthropicPassthrough, AnthropicToOpenAIUpstream  # noqa: E402
from coderouterd.translate.tool_repair import ToolCallRepairer, repair_tools_for  # noqa: E402

PROSE = ("The function reads the configuration file, validates every provider entry and returns the "
         "effective routing table.\nIt never blocks the event loop; file access happens in a worker thread.\n") * 8
WORDS = PROSE.replace("\n", " \n").split(" ")
DELTAS = [w + " " for w in WORDS if w]
TOOLS_BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}], "tools": [
    {"name": n, "input_schema": {"type": "object", "required": ["command"], "properties": {"command": {"type": "string"}}}}
    for n in ("Bash", "Read", "Write", "Edit", "Glob", "Grep", "TodoWrite", "WebFetch")]}
TOOLS = repair_tools_for(ProviderConfig(base_url="http://127.0.0.1:1"), TOOLS_BODY)
CALL = 'Running it.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la /tmp && echo done"}}\n</tool_call>'


def openai_events(deltas: list[str]) -> list[tuple[None, str]]:
    return [(None, orjson.dumps({"id": "c", "object": "chat.completion.chunk", "model": "q",
                                  "choices": [{"index": 0, "delta": {"content": d}, "finish_reason": None}]}).decode())
            for d in deltas]


def anthropic_events(deltas: list[str]) -> list[tuple[str, str]]:
    evs = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    evs += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}} for d in deltas]
    return [(e["type"], orjson.dumps(e).decode()) for e in evs]


def make(cls, repair: bool, observe: bool):
    return cls(model="q", skip_prologue=True, client_body=TOOLS_BODY, repair_tools=TOOLS if repair else None,
               observe=observe)


CONFIGS = {"off": (False, False), "repair": (True, False), "repair + drift figures": (True, True)}


def interleaved(cls, events, rounds: int) -> dict[str, tuple[float, float]]:
    """Per config: (median µs per chunk after the first, median µs of the first content chunk). Configs take
    turns inside every round, so a machine that slows down mid-run slows all of them alike."""
    per_chunk: dict[str, list[float]] = {k: [] for k in CONFIGS}
    first: dict[str, list[float]] = {k: [] for k in CONFIGS}
    for _ in range(rounds):
        for name, (repair, observe) in CONFIGS.items():
            st = make(cls, repair, observe)
            t0 = time.perf_counter_ns()
            out = st.events(events[:2])
            first[name].append((time.perf_counter_ns() - t0) / 1000)
            assert b"The" in out  # the first words went out with the first chunk: plain text is not held
            t0 = time.perf_counter_ns()
            for ev in events[2:]:
                st.events([ev])
            per_chunk[name].append((time.perf_counter_ns() - t0) / (len(events) - 2) / 1000)
    return {k: (p10(per_chunk[k]), p10(first[k])) for k in CONFIGS}


def p10(samples: list[float]) -> float:
    """The 10th percentile: on a shared, loaded machine the median measures the neighbours; the low end of
    the distribution is what the code itself costs."""
    return statistics.quantiles(samples, n=10)[0]


def repairer_only_us(deltas: list[str], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        r = ToolCallRepairer(TOOLS)
        t0 = time.perf_counter_ns()
        for d in deltas:
            r.feed(d)
        r.finish()
        samples.append((time.perf_counter_ns() - t0) / len(deltas) / 1000)
    return p10(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    n = ap.parse_args().rounds
    rows = []
    for label, cls, events in (("Anthropic client <- OpenAI upstream", AnthropicToOpenAIUpstream, openai_events(DELTAS)),
                               ("Anthropic passthrough", AnthropicPassthrough, anthropic_events(DELTAS))):
        got = interleaved(cls, events, n)
        off = got["off"]
        for name in ("repair", "repair + drift figures"):
            on = got[name]
            rows.append((f"{label}, {name}", off[0], on[0], on[0] - off[0], off[1], on[1], on[1] - off[1]))
    print(f"plain prose: {len(DELTAS)} word-sized chunks, {len(PROSE)} chars; {n} rounds, 10th percentiles; "
          f"{len(TOOLS)} tools offered\n")
    print("| path | per chunk, repair off (µs) | on (µs) | added per chunk (µs) "
          "| first chunk off (µs) | on (µs) | added TTFB (µs) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:+.2f} | {r[4]:.2f} | {r[5]:.2f} | {r[6]:+.2f} |")
    prose = repairer_only_us(DELTAS, n)
    call_pieces = [CALL[i:i + 3] for i in range(0, len(CALL), 3)]
    call = repairer_only_us(call_pieces, n)
    print(f"\nrepairer alone: {prose:.2f} µs per prose chunk; {call:.2f} µs per 3-char chunk of a streamed Hermes "
          f"call ({len(call_pieces)} chunks, parse and validation included)")


if __name__ == "__main__":
    main()
