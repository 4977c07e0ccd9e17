"""Request transformations grow linearly with the request (issue 23, item 5): each path fed bodies of 1x, 10x
and 100x a size, time per size and the ratio to the 1x time.

    .venv/bin/python bench/linear.py [--base 500] [--repeat 5]

No daemon, no sockets: the translation functions themselves, on bodies built to hit what used to grow faster
than the input (namespace tools sharing a name; runs of same-role messages merged for chat upstreams, which
count_tokens renders too). Linear: the 100x column near 100, far under 10,000. tests/unit/test_linear.py
asserts the same with generous bounds (the chunked-request trailers are bounded by the header limit instead:
tests/e2e/test_limits.py).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coderouterd.providers.adapters.openai import prompt_text  # noqa: E402
from coderouterd.translate.anthropic_request_to_openai import request_to_openai  # noqa: E402
from coderouterd.translate.responses_request import translate_request  # noqa: E402

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def responses_namespaces(n: int) -> dict:
    """n namespace tools of the same name, each with the same function, and n calls to it."""
    tools = [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]} for _ in range(n)]
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "f", "namespace": "ns", "arguments": "{}"}
             for i in range(n)]
    return {"model": "m", "input": [{"role": "user", "content": "hi"}, *calls], "tools": tools,
            "tool_choice": {"type": "function", "name": "f", "namespace": "ns"}}


def responses_assistant_run(n: int) -> dict:
    """n assistant text items, each after a reasoning item: one assistant message in chat."""
    items: list[dict] = [{"role": "user", "content": "hi"}]
    for i in range(n):
        items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": f"thought {i}"}]})
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                           "text": f"part {i} "}]})
    return {"model": "m", "input": items}


def anthropic_runs(n: int) -> dict:
    """n user messages in a row (text, one with an image), then n assistant messages in a row with tool calls."""
    messages: list[dict] = [{"role": "user", "content": f"line {i}"} for i in range(n)]
    messages[n // 2] = {"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}
    messages += [{"role": "assistant", "content": [
        {"type": "text", "text": f"step {i}"},
        {"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {"path": f"{i}.py"}}]} for i in range(n)]
    return {"model": "m", "max_tokens": 10, "messages": messages}


# name -> (body builder, the transformation timed)
PATHS: dict[str, tuple[Callable[[int], dict], Callable[[dict], object]]] = {
    "responses: namespace tools sharing a name": (responses_namespaces, translate_request),
    "responses: consecutive assistant items": (responses_assistant_run, translate_request),
    "anthropic->openai: same-role runs merged": (anthropic_runs,
                                                 lambda b: request_to_openai(b, "m", stream=False)),
    "count_tokens: prompt text of the same": (anthropic_runs, prompt_text),
}


def timed(build: Callable[[int], dict], fn: Callable[[dict], object], n: int, repeat: int,
          clock: Callable[[], float] = time.perf_counter) -> float:
    """Best of `repeat` runs (the least disturbed by whatever else the machine does), collector off. `clock`:
    wall time for the benchmark; tests/unit/test_linear.py passes the thread's CPU time, which other processes
    on a loaded machine cannot inflate."""
    body = build(n)
    best = float("inf")
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = clock()
            fn(body)
            best = min(best, clock() - t0)
    finally:
        gc.enable()
    return best


def growth(name: str, base: int, repeat: int, factors=(1, 10, 100), stop_ratio: float | None = None,
           clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds at each factor of `base`. With `stop_ratio`, stops after a size whose time exceeds stop_ratio x
    factor x the 1x time (a superlinear path would otherwise take minutes at 100x)."""
    build, fn = PATHS[name]
    out: list[float] = []
    for f in factors:
        out.append(timed(build, fn, base * f, repeat if f < 100 else max(1, repeat // 2), clock))
        if stop_ratio is not None and out[-1] > stop_ratio * f * out[0]:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=int, default=500, help="items at 1x")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'path':44} {'1x ms':>9} {'10x ms':>9} {'100x ms':>10} {'10x/1x':>7} {'100x/1x':>8}")
    for name in PATHS:
        t = growth(name, args.base, args.repeat, stop_ratio=30)
        cells = [f"{x * 1000:9.2f}" for x in t] + ["        -"] * (3 - len(t))
        ratios = [f"{x / t[0]:7.1f}" for x in t[1:]] + ["      -"] * (3 - len(t))
        print(f"{name:44} {cells[0]} {cells[1]} {cells[2]:>10} {ratios[0]} {ratios[1]:>8}")


if __name__ == "__main__":
    main()
