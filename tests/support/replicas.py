"""Issue 44's replicas workload: conversations from concurrent clients through coderouterd to replicas of one
model (fake llama-servers in tests/e2e/test_balance.py, real ones in bench/real_llama.py --scenario replicas).

Each client runs its conversations interleaved (A1 B1 A2 B2 ...), as one person with two sessions open; the
clients run at once. Every request is streamed with the Anthropic wire and the session header, as Claude Code
sends it. What each answer says: the replica that served it (`x-coderouter-provider`), its prompt and cached
tokens, and the time to its first content block.

The best possible: each conversation's first turn processed in full, each later turn only what it adds to the
conversation's previous prompt. That is what a router loses nothing of by its choice of replica; a prefix shared
*between* conversations (the system prompt and tools) is issue 44 section 0's seeding, measured by its own
scenario, and counted here as each conversation's own.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import orjson

from .claude_sessions import TINY, Session, Shape


@dataclass
class Answer:
    client: int
    conversation: int
    turn: int
    provider: str
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    request_id: str = ""


def conversations(clients: int, per_client: int, shape: Shape = TINY) -> list[list[Session]]:
    return [[Session(c * per_client + i, shape=shape) for i in range(per_client)] for c in range(clients)]


def _stream(http: httpx.Client, s: Session, headers: dict[str, str]) -> tuple[str, dict, float, str]:
    body = {**s.main_body(), "stream": True}
    t0 = time.perf_counter()
    ttft: float | None = None
    usage: dict = {}
    with http.stream("POST", "/v1/messages", json=body, headers={**s.headers, **headers}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"request failed: {r.status_code} {r.read()[:300]!r}")
        provider = r.headers.get("x-coderouter-provider", "")
        rid = r.headers.get("x-request-id", "")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = orjson.loads(line[6:])
            t = ev.get("type")
            if ttft is None and t == "content_block_start":
                ttft = time.perf_counter() - t0
            if t == "message_start":
                usage.update(ev["message"].get("usage") or {})
            elif t == "message_delta":
                usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v is not None})
            elif t == "error":
                raise RuntimeError(f"stream failed: {ev}")
    return provider, usage, ttft or 0.0, rid


def drive(url: str, clients: list[list[Session]], turns: int,
          headers_for: Callable[[int], dict[str, str]] = lambda _i: {}) -> list[Answer]:
    """Every client's conversations, `turns` turns each, the clients at once. `headers_for(i)`: extra headers for
    the i-th request of the run, counted across clients (a round-robin picks its profile by it)."""
    out: list[Answer] = []
    lock = threading.Lock()
    counter = iter(range(1 << 30))
    errors: list[BaseException] = []

    def client(c: int, sessions: list[Session]) -> None:
        try:
            with httpx.Client(base_url=url, timeout=300, headers={"anthropic-version": "2023-06-01"}) as http:
                for t in range(turns):
                    for s in sessions:
                        with lock:
                            i = next(counter)
                        provider, usage, ttft, rid = _stream(http, s, headers_for(i))
                        cached = usage.get("cache_read_input_tokens") or 0
                        with lock:
                            out.append(Answer(c, s.n, t, provider, (usage.get("input_tokens") or 0) + cached,
                                              cached, ttft, rid))
                        s.advance()
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(e)

    threads = [threading.Thread(target=client, args=(c, ss)) for c, ss in enumerate(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return out


def best_processed(answers: list[Answer]) -> int:
    """Each conversation's first turn in full, then only what each turn adds to its previous prompt (at least
    one token: a server always evaluates one)."""
    by_conv: dict[int, list[Answer]] = {}
    for a in answers:
        by_conv.setdefault(a.conversation, []).append(a)
    best = 0
    for turns in by_conv.values():
        turns.sort(key=lambda a: a.turn)
        prev = 0
        for a in turns:
            best += max(1, a.prompt_tokens - prev)
            prev = a.prompt_tokens
    return best


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


def report(answers: list[Answer], processed: int | None = None) -> dict:
    """`processed`: the prompt tokens the replicas say they computed (their /metrics), when known; else what the
    answers report (prompt minus cached), which misses work a race's loser did."""
    prompt = sum(a.prompt_tokens for a in answers)
    done = processed if processed is not None else prompt - sum(a.cached_tokens for a in answers)
    best = best_processed(answers)
    per: dict[str, int] = {}
    for a in answers:
        per[a.provider] = per.get(a.provider, 0) + 1
    ttft = [a.ttft_s for a in answers]
    return {"requests": len(answers), "prompt_tokens": prompt, "processed_tokens": done, "best_processed": best,
            "of_best": round(done / best, 3) if best else None,
            "per_replica": dict(sorted(per.items())),
            "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
            "ttft_p95_s": round(_p95(ttft), 3) if ttft else None}
