"""Prefix routing on a real llama.cpp llama-server (SmolLM2-135M, built by `make real-llama`): Claude-Code-shaped
sessions (shared system prompt and tools, growing tool results, background calls) sent through coderouterd,
which manages the server, and the same workload sent straight at an identical server that picks its slots
itself (with its RAM prompt cache). Same run, same machine.

    .venv/bin/python bench/real_llama.py [--scenario within|twice|three|all|suite] [--restart]
    .venv/bin/python bench/real_llama.py --warm [--scenario three|three-suite|warm-suite]
    .venv/bin/python bench/real_llama.py --scenario agents [--head 6fe8061]
    .venv/bin/python bench/real_llama.py --scenario replicas [--modes balance,round-robin,fallback,race,adaptive]
    .venv/bin/python bench/real_llama.py --scenario shared [--head main]

Reuse is what the server reports it took from cache (`timings.cache_n`, relayed as cached tokens) against
the best any slot assignment could give: for each request, the longest token prefix it shares with any
earlier prompt (tokenised by the server itself with /apply-template and /tokenize). `--restart` also
measures after the managed server was killed and restarted by the supervisor, and after coderouterd itself
restarted on its persisted state: the first turn after a restart is cold for everyone, the rest must be warm.

`--scenario shared` (issue 44 §0): several conversations sharing a long system prompt and tools, each new one
seeded from a slot holding that prefix; processed tokens against the best any cache could do (the shared prefix
computed once), with seeding, without it (`clone_min_tokens` out of reach), and on the code of `--head` (a git
revision, default main, extracted with `git archive` and run as it is), all in the same run, with the time to
first token of the first turns and of all turns.

`--scenario agents` (issue 44 §2): an orchestrator and two sub-agents on one model, background calls on another,
sent concurrently, two on-demand servers with a budget for one, each load slowed by a start delay; on this tree's
code (its defaults, then `swap_hold_s` and `min_resident_s` 0) and on the code of `--head` (default 6fe8061, the
scheduler before "swaps only when they pay"), in the same run: requests, failures, changes of the demanded model,
starts, processed tokens against the best possible (per model), time to first token.

`--warm`: caches that survive (kvcache/). Three interleaved conversations with two title calls on three
slots, interrupted half-way by a restart of coderouterd or by kill -9 of its server (after a pause longer than
`save_idle_after_s`, as a person reading the answer makes), with the slot saves on and off; processed tokens
against the best any cache could do over the whole run (no restart forgives anything).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.claude_sessions import SMALL, TINY, Session, Shape, workload  # noqa: E402
from tests.support.daemon import ROOT, DaemonProcess, free_port  # noqa: E402
from tests.support.real_llama import LlamaServer, paths, server_argv  # noqa: E402

MODEL = "smollm2"


@dataclass(frozen=True)
class Scenario:
    name: str
    slots: int
    ctx: int  # tokens per slot
    sessions: int
    turns: int
    background_sessions: int  # how many sessions make a background call each turn
    shape: Shape = SMALL
    # The least shared prefix worth a slot copy (default 2,048 tokens), scaled down with the shape.
    clone_min_tokens: int | None = 128  # None: the default of the code that runs
    background_every: int = 1  # a background call every this many turns (100: only at the second turn)
    tools: bool = True  # False: the sessions' turns carry no tools (Claude Code run with --tools "")
    background_turns: int | None = None  # background calls only in the first turns (None: every turn)
    env: bool = False  # each session's system block ends in its own environment section, as Claude Code's does


# 3 lanes on 3 slots: session 0's main and background lanes, session 1's main lane.
WITHIN = Scenario("within", slots=3, ctx=2048, sessions=2, turns=4, background_sessions=1)
# 4 lanes on 2 slots: two sessions, each with its background lane; slots are saved and restored.
TWICE = Scenario("twice", slots=2, ctx=2048, sessions=2, turns=4, background_sessions=2)
# The same two at a fraction of the tokens the server must process, for the test suite (tests/real), where
# the real model's CPU time is most of the suite's: the lanes, slots and restarts are the same.
WITHIN_SUITE = Scenario("within-suite", slots=3, ctx=1024, sessions=2, turns=3, background_sessions=1,
                        shape=TINY, clone_min_tokens=64)
TWICE_SUITE = Scenario("twice-suite", slots=2, ctx=1024, sessions=2, turns=3, background_sessions=2,
                       shape=TINY, clone_min_tokens=64)
# Issue 33: three interleaved conversations on 3 slots, two title calls (sessions 0 and 1, after their first turn),
# and the same with turns that carry no tools: lanes are chosen by prefix, so both must come as close to the best.
THREE = Scenario("three", slots=3, ctx=4096, sessions=3, turns=6, background_sessions=2, background_turns=2)
THREE_NO_TOOLS = Scenario("three-no-tools", slots=3, ctx=4096, sessions=3, turns=6, background_sessions=2,
                          background_turns=2, tools=False)
THREE_SUITE = Scenario("three-suite", slots=3, ctx=1024, sessions=3, turns=3, background_sessions=2,
                       background_turns=2, shape=TINY, clone_min_tokens=64)
THREE_NO_TOOLS_SUITE = Scenario("three-no-tools-suite", slots=3, ctx=1024, sessions=3, turns=3,
                                background_sessions=2, background_turns=2, shape=TINY, clone_min_tokens=64,
                                tools=False)
# The restart/kill test's run (tests/real/test_real_warm.py): four turns, so each third of the run has turns to
# lose, with one title call per session at its second turn.
WARM_SUITE = Scenario("warm-suite", slots=3, ctx=1024, sessions=3, turns=4, background_sessions=2,
                      background_every=100, shape=TINY, clone_min_tokens=64)
WARM_NO_TOOLS_SUITE = Scenario("warm-no-tools-suite", slots=3, ctx=1024, sessions=3, turns=4, background_sessions=2,
                               background_every=100, shape=TINY, clone_min_tokens=64, tools=False)
SCENARIOS = {"within": [WITHIN], "twice": [TWICE], "three": [THREE, THREE_NO_TOOLS],
             "all": [WITHIN, TWICE, THREE, THREE_NO_TOOLS],
             "suite": [WITHIN_SUITE, TWICE_SUITE, THREE_SUITE, THREE_NO_TOOLS_SUITE],
             "three-suite": [THREE_SUITE, THREE_NO_TOOLS_SUITE], "warm-suite": [WARM_SUITE, WARM_NO_TOOLS_SUITE]}
# Two managed servers (a "coder" and a "small" model: here the same small model on two ports) and a memory budget
# that holds one: two conversations, one on each, alternate, so every turn after the first two swaps.
SWAP = Scenario("swap", slots=1, ctx=2048, sessions=2, turns=4, background_sessions=0)
SWAP_SUITE = Scenario("swap-suite", slots=1, ctx=1024, sessions=2, turns=3, background_sessions=0, shape=TINY)
SCENARIOS.update({"swap": [SWAP], "swap-suite": [SWAP_SUITE]})
# Issue 44's agents trace: an orchestrator and two sub-agents on one model, five background calls on another, sent
# concurrently, two servers with a budget for one, each load made slow (a start delay in the process command).
AGENTS = Scenario("agents", slots=4, ctx=1024, sessions=3, turns=4, background_sessions=0)
SCENARIOS["agents"] = [AGENTS]
# Issue 44 §0: new conversations start warm. Several conversations sharing a long system prompt and tools (SmolLM2's
# template renders no tools: the system prompt is what is shared, ~800 tokens here, ~350 at suite scale), few turns
# each, so that the first turns are most of the work; each conversation's first turn comes after the one before.
LONG = Shape(SMALL.tools, "Follow the instructions carefully and use the tools well. " * 70, SMALL.agents, 9, 4, 4)
LONG_SUITE = Shape(TINY.tools, "Follow the instructions carefully and use the tools well. " * 30, TINY.agents, 3, 2, 2)
# Each with the defaults of the code that runs (the head's least prefix worth a copy was 2,048 tokens).
SHARED = Scenario("shared", slots=4, ctx=2048, sessions=6, turns=3, background_sessions=0, shape=LONG,
                  clone_min_tokens=None)
SHARED_SUITE = Scenario("shared-suite", slots=4, ctx=1024, sessions=4, turns=2, background_sessions=0,
                        shape=LONG_SUITE, clone_min_tokens=None)
# The same with a static system block longer than the affinity digests' 4 KB pieces, each session's ending in its
# own environment section (working directory, date, branch), as Claude Code's main system block does: no two
# sessions share the whole block, only its static part.
LONG_ENV_SUITE = Shape(TINY.tools, "Follow the instructions carefully and use the tools well. " * 90, TINY.agents, 3,
                       2, 2)
SHARED_ENV_SUITE = Scenario("shared-env-suite", slots=4, ctx=2048, sessions=4, turns=2, background_sessions=0,
                            shape=LONG_ENV_SUITE, clone_min_tokens=None, env=True)
SCENARIOS.update({"shared": [SHARED], "shared-suite": [SHARED_SUITE], "shared-env-suite": [SHARED_ENV_SUITE]})
NO_SEEDING = 100_000_000  # clone_min_tokens out of reach: no slot is ever copied


# Issue 44 section 1: three replicas of one model (three llama-servers, 2 slots each), 6 conversations from 3 concurrent
# clients, 5 turns each (tests/support/replicas.py), under each way of spreading them (replicas_run below).
REPLICAS = Scenario("replicas", slots=2, ctx=2048, sessions=6, turns=5, background_sessions=0, shape=SMALL)
# The same at the test suite's scale (tests/real/test_real_balance.py): the tiny shape, balance only.
REPLICAS_SUITE = Scenario("replicas-suite", slots=2, ctx=1024, sessions=6, turns=5, background_sessions=0, shape=TINY)
SCENARIOS["replicas"] = [REPLICAS]


def order(sc: Scenario) -> list[tuple[Session, str]]:
    turns = workload(sc.sessions, sc.turns, background_every=sc.background_every, shape=sc.shape,
                     background_sessions=sc.background_sessions, tools=sc.tools, background_turns=sc.background_turns)
    if sc.env:
        for s in {id(s): s for s, _ in turns}.values():
            s.system_extra = (f"\n<env>\nWorking directory: /home/dev/project-{s.n}\nPlatform: linux\n"
                              f"Today's date: 2026-12-0{s.n % 9 + 1}\n</env>\ngitStatus: On branch feature-{s.n}")
    return turns


def openai_body(body: dict, *, stream: bool) -> dict:
    """The Anthropic body as coderouterd sends it to an OpenAI-wire server (billing header removed)."""
    from coderouterd.affinity.canonical import Canonicaliser
    from coderouterd.translate.anthropic_request_to_openai import request_to_openai

    oa, _ = request_to_openai(Canonicaliser().anthropic(body), MODEL, stream=stream)
    return oa


@dataclass
class Turn:
    session: int
    kind: str  # main | background
    first: bool  # the session's first turn of this kind (cold by nature)
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float


# -- the two drivers ---------------------------------------------------------------------------------------------


def _events(lines: Iterable[str]) -> Iterator[dict]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield orjson.loads(line[6:])


def _sse(resp: httpx.Response) -> Iterator[dict]:
    return _events(resp.iter_lines())


def _add_usage(usage: dict, ev: dict) -> None:
    """What a Messages stream event says of the usage: message_start's, then message_delta's non-null figures."""
    if ev.get("type") == "message_start":
        usage.update(ev["message"].get("usage") or {})
    elif ev.get("type") == "message_delta":
        usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v is not None})


def usage_of(text: str) -> dict:
    """The usage of a streamed Messages answer kept as text."""
    usage: dict = {}
    for ev in _events(text.splitlines()):
        _add_usage(usage, ev)
    return usage


def _anthropic_stream(resp: httpx.Response, t0: float) -> tuple[float | None, dict, list[dict]]:
    """A streamed Messages answer: (time to its first content block since t0, its usage, its error events)."""
    ttft = None
    usage: dict = {}
    errors: list[dict] = []
    for ev in _sse(resp):
        t = ev.get("type")
        if ttft is None and t == "content_block_start":
            ttft = time.perf_counter() - t0
        _add_usage(usage, ev)
        if t == "error":
            errors.append(ev)
    return ttft, usage, errors


def drive_straight(url: str, sc: Scenario) -> list[Turn]:
    """Straight at llama-server: it chooses the slot (longest prefix, else LRU, plus its RAM prompt cache)."""
    out: list[Turn] = []
    seen: set[tuple[int, str]] = set()
    # A fresh connection per request: llama-server closes each one after a streamed answer without saying so.
    with httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for s, kind in order(sc):
            body = openai_body(s.main_body() if kind == "main" else s.background_body(), stream=True)
            body["stream_options"] = {"include_usage": True}
            t0 = time.perf_counter()
            ttft = None
            timings = None
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"straight request failed: {r.status_code} {r.read()[:300]!r}")
                for ev in _sse(r):
                    if ttft is None and ev.get("choices"):
                        ttft = time.perf_counter() - t0
                    timings = ev.get("timings") or timings
            out.append(Turn(s.n, kind, (s.n, kind) not in seen, timings["cache_n"] + timings["prompt_n"],
                            timings["cache_n"], ttft or 0.0))
            seen.add((s.n, kind))
            if kind == "main":
                s.advance()
    return out


def drive_router(url: str, sc: Scenario, turns: list[tuple[Session, str]] | None = None) -> list[Turn]:
    """Through coderouterd, as Claude Code sends it (Anthropic Messages, streamed, session header)."""
    out: list[Turn] = []
    seen: set[tuple[int, str]] = set()
    with httpx.Client(base_url=url, timeout=300, headers={"anthropic-version": "2023-06-01"}) as http:
        for s, kind in turns if turns is not None else order(sc):
            body = {**(s.main_body() if kind == "main" else s.background_body()), "stream": True}
            t0 = time.perf_counter()
            with http.stream("POST", "/v1/messages", json=body, headers=s.headers) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"routed request failed: {r.status_code} {r.read()[:300]!r}")
                ttft, usage, failed = _anthropic_stream(r, t0)
                if failed:
                    raise RuntimeError(f"routed stream failed: {failed[0]}")
            cached = usage.get("cache_read_input_tokens") or 0
            out.append(Turn(s.n, kind, (s.n, kind) not in seen, (usage.get("input_tokens") or 0) + cached, cached,
                            ttft or 0.0))
            seen.add((s.n, kind))
            if kind == "main":
                s.advance()
    return out


# -- the best any assignment could do ----------------------------------------------------------------------------


def tokenise(url: str, bodies: Iterable[dict]) -> list[list[int]]:
    """Each Anthropic body's prompt as the server tokenises it (its own chat template), in the order given."""
    prompts = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for body in bodies:
            text = http.post("/apply-template", json=openai_body(body, stream=False)).json()["prompt"]
            prompts.append(http.post("/tokenize", json={"content": text, "add_special": True,
                                                        "parse_special": True}).json()["tokens"])
    return prompts


def token_prompts(url: str, sc: Scenario) -> list[list[int]]:
    """Each request's prompt as the server tokenises it, in workload order."""
    def bodies() -> Iterator[dict]:
        for s, kind in order(sc):
            yield s.main_body() if kind == "main" else s.background_body()
            if kind == "main":  # after the body was tokenised: a generator resumes when the next is asked
                s.advance()
    return tokenise(url, bodies())


def best_reuse(prompts: list[list[int]], models: list[str] | None = None) -> list[int]:
    """Per request: the longest prefix shared with any earlier prompt (on the same model, when `models` names
    each request's), with at least one token always evaluated: an upper bound for any slot assignment."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for j, q in enumerate(prompts[:i]):
            if models is not None and models[j] != models[i]:
                continue
            n = 0
            for a, b in zip(p, q, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        out.append(min(best, len(p) - 1))
    return out


def summary(turns: list[Turn], bound: list[int]) -> dict:
    reused = sum(t.cached_tokens for t in turns)
    best = sum(bound)
    prompt = sum(t.prompt_tokens for t in turns)
    warm = [t.ttft_s for t in turns if t.kind == "main" and not t.first]
    return {"requests": len(turns), "prompt_tokens": prompt, "reused_tokens": reused, "best_tokens": best,
            "processed_tokens": prompt - reused, "ideal_processed": prompt - best,
            "of_ideal": round((prompt - reused) / (prompt - best), 3) if prompt > best else None,
            "of_best": round(reused / best, 4) if best else 1.0,
            "warm_ttft_p50_s": round(statistics.median(warm), 3) if warm else None,
            "warm_ttft_p95_s": round(sorted(warm)[max(0, int(len(warm) * 0.95) - 1)], 3) if warm else None}


# -- running a scenario ------------------------------------------------------------------------------------------

CONFIG = """
[server]
port = {PORT}

[providers.llama]
kind = "openai"
base_url = "http://127.0.0.1:@LP@/v1"
model = "@MODEL@"
affinity = @AFFINITY@
timeouts = { connect = 5, first_byte = 300, idle = 120, total = 600 }

[providers.llama.process]
command = @ARGV@
ready_url = "http://127.0.0.1:@LP@/health"
start_timeout_s = 60
startsecs = 0.2

[profiles.default]
providers = ["llama"]
health_action = "warn"

[affinity]
# The shared system prompt and tools here are ~100-240 tokens, scaled down 60-150x from Claude Code's ~15k to fit
# this small model; the least shared prefix worth a slot copy (default 2,048 tokens) scales down with them.
clone_min_tokens = @CLONE_MIN@
"""
# Saves off: neither before a stop nor when a lane is idle (what coderouterd did before kvcache/).
NO_SAVES = "save_idle_after_s = 0\nsave_before_stop_s = 0\n"
IDLE_SAVE_S = 1.0  # the bench's pause between rounds is longer than this; the default is 10 s


def daemon_config(sc: Scenario, port: int, *, affinity: bool = True, extra: str = "",
                  clone_min_tokens: int | None = None) -> str:
    p = paths()
    argv = server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], port, slots=sc.slots, ctx_per_slot=sc.ctx)
    clone = sc.clone_min_tokens if clone_min_tokens is None else clone_min_tokens
    text = CONFIG if clone is not None else CONFIG.replace("clone_min_tokens = @CLONE_MIN@", "")
    return (text.replace("@LP@", str(port)).replace("@ARGV@", json.dumps(argv)).replace("@MODEL@", MODEL)
            .replace("@AFFINITY@", "true" if affinity else "false").replace("@CLONE_MIN@", str(clone))
            + extra)


def wait_model(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


def baseline(sc: Scenario, tmp: Path) -> tuple[dict, list[list[int]]]:
    with LlamaServer(tmp, slots=sc.slots, ctx_per_slot=sc.ctx, save=False) as server:
        prompts = token_prompts(server.url, sc)
        turns = drive_straight(server.url, sc)
    return summary(turns, best_reuse(prompts)), prompts


def routed(sc: Scenario, tmp: Path, prompts: list[list[int]], *, affinity: bool = True) -> dict:
    port = free_port()
    d = DaemonProcess(daemon_config(sc, port, affinity=affinity), tmp)
    d.start()
    try:
        wait_model(f"http://127.0.0.1:{port}")
        return summary(drive_router(d.url, sc), best_reuse(prompts))
    finally:
        d.stop()


def fresh(sc: Scenario, tmp: Path) -> dict:
    """Through coderouterd on a fresh server, against the best any cache could do, tokenised by that same server
    (/apply-template and /tokenize use no slot) before the workload runs: no straight baseline to pay for."""
    port = free_port()
    d = DaemonProcess(daemon_config(sc, port), tmp)
    d.start()
    try:
        wait_model(f"http://127.0.0.1:{port}")
        prompts = token_prompts(f"http://127.0.0.1:{port}", sc)
        return summary(drive_router(d.url, sc), best_reuse(prompts))
    finally:
        d.stop()


def shared(sc: Scenario, tmp: Path, *, seeding: bool = True, root: Path = ROOT,
           clone_min_tokens: int | None = None) -> dict:
    """The shared scenario through coderouterd on a fresh server (from the source tree `root`): processed tokens
    against the best any cache could do, tokenised by that server before the workload runs; the time to first
    token of each conversation's first turn and of every turn; how many new lanes were seeded (from the trace of
    each request, `corectl explain`'s source)."""
    port = free_port()
    d = DaemonProcess(daemon_config(sc, port, clone_min_tokens=clone_min_tokens if seeding else NO_SEEDING), tmp,
                      root=root)
    d.start()
    try:
        wait_model(f"http://127.0.0.1:{port}")
        prompts = token_prompts(f"http://127.0.0.1:{port}", sc)
        turns = drive_router(d.url, sc)
        recent = _admin(d, "/v1/requests?limit=200") if root == ROOT else {}
        copies = _warm_status(d).get("copies") if root == ROOT else None
    finally:
        d.stop()
    out = summary(turns, best_reuse(prompts))
    out["of_ideal"] = round(out["processed_tokens"] / out["ideal_processed"], 3) if out["ideal_processed"] else None
    for label, xs in (("first", [t.ttft_s for t in turns if t.first]), ("all", [t.ttft_s for t in turns])):
        out[f"{label}_ttft_p50_s"], out[f"{label}_ttft_p95_s"] = p50_p95(xs)
    # The head's traces may not say (it names no seed): not counted there.
    out["seeded"] = sum(1 for r in _rows(recent) if "seeded from" in str(r)) if root == ROOT else None
    out["copies"] = copies
    return out


def p50_p95(xs: list[float]) -> tuple[float | None, float | None]:
    """The median and the 95th percentile (nearest rank), rounded to the millisecond."""
    xs = sorted(xs)
    if not xs:
        return None, None
    return round(statistics.median(xs), 3), round(xs[max(0, int(len(xs) * 0.95 + 0.5) - 1)], 3)


def _rows(recent: dict) -> list:
    rows = recent.get("requests") if isinstance(recent, dict) else None
    return rows if isinstance(rows, list) else []


def head_tree(ref: str, tmp: Path) -> Path:
    """The source of revision `ref` of this repository, extracted (no worktree, no checkout) under `tmp`."""
    import subprocess

    out = tmp / f"head-{ref.replace('/', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


# The revision the agents trace is compared with by default: the parent of 4754966 ("On-demand swaps only when they
# pay"), the last code with the scheduler issue 44 measured (next request first, least recently used out). `main`
# already has the new one, so comparing with it would measure nothing.
AGENTS_HEAD = "6fe8061"


def run_agents(sc: Scenario, head: str | None) -> list[dict]:
    """The agents trace on this tree's code (its defaults, then no hold and no minimum residency) and on `head`'s
    (its own code and defaults, extracted by `head_tree`), in the same run: the same trace and start delay."""
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"cragents-{sc.name}-") as t:
        tmp = Path(t)
        runs: list[tuple[str, dict]] = [("this tree, its defaults", {}),
                                         ("this tree, swap_hold_s 0, min_resident_s 0",
                                          {"hold_s": 0.0, "min_resident_s": 0.0})]
        if head:
            runs.append((f"{head}: its code, its defaults", {"root": head_tree(head, tmp)}))
        for i, (label, kw) in enumerate(runs):
            t0 = time.monotonic()
            r = agents(sc, tmp / f"run{i}", **kw)
            rows.append({"scenario": sc.name, "run": label, **r})
            print(f"# {sc.name} {label}: {time.monotonic() - t0:.0f} s {r}", file=sys.stderr)
    return rows


def print_agents_table(rows: list[dict]) -> None:
    cols = ["run", "requests", "failed", "changes", "starts", "starts_with_other_alive", "processed_tokens",
            "ideal_processed", "of_ideal", "agents_processed_tokens", "agents_ideal_processed", "agents_of_ideal",
            "ttft_p50_s", "ttft_p95_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(len(r[c]) if isinstance(r.get(c), list) else r.get(c, "")) for c in cols) + " |")


def run_shared(scenarios: list[Scenario], head: str | None) -> list[dict]:
    rows = []
    for sc in scenarios:
        with tempfile.TemporaryDirectory(prefix=f"crshared-{sc.name}-") as t:
            tmp = Path(t)
            t0 = time.monotonic()
            rows.append({"scenario": sc.name, "run": "seeding (this tree)", **shared(sc, tmp / "seed")})
            rows.append({"scenario": sc.name, "run": "no seeding (this tree)",
                         **shared(sc, tmp / "noseed", seeding=False)})
            if head:
                tree = head_tree(head, tmp)
                rows.append({"scenario": sc.name, "run": f"{head}: its code, its defaults",
                             **shared(sc, tmp / "head", root=tree)})
                rows.append({"scenario": sc.name, "run": f"{head}: its code, clone_min_tokens = 256",
                             **shared(sc, tmp / "head256", root=tree, clone_min_tokens=256)})
            print(f"# {sc.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return rows


def print_shared_table(rows: list[dict]) -> None:
    cols = ["scenario", "run", "requests", "prompt_tokens", "processed_tokens", "ideal_processed", "of_ideal",
            "seeded", "first_ttft_p50_s", "first_ttft_p95_s", "all_ttft_p50_s", "all_ttft_p95_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


def after_restarts(sc: Scenario, tmp: Path, prompts: list[list[int]]) -> dict:
    """The workload in three parts: fresh; after kill -9 of the managed server (the supervisor restarts it);
    after coderouterd itself restarted on its persisted state (its server too). Reuse over the whole run."""
    port = free_port()
    d = DaemonProcess(daemon_config(sc, port), tmp)
    turns_order = order(sc)
    third = len(turns_order) // 3
    parts = [turns_order[:third], turns_order[third:2 * third], turns_order[2 * third:]]
    got: list[Turn] = []
    d.start()
    try:
        wait_model(f"http://127.0.0.1:{port}")
        got += drive_router(d.url, sc, parts[0])
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.state_dir / "coderouterd.sock")),
                          base_url="http://coderouterd", timeout=10) as a:
            procs = a.get("/v1/processes").json()["processes"]
        proc = procs[0] if isinstance(procs, list) else next(iter(procs.values()))
        os.kill(proc["pid"], signal.SIGKILL)
        time.sleep(0.3)
        got += drive_router(d.url, sc, parts[1])  # the first of these waits for the restart
        d.stop()
        d.start()
        wait_model(f"http://127.0.0.1:{port}")
        got += drive_router(d.url, sc, parts[2])
    finally:
        d.stop()
    return summary(got, best_reuse(prompts))


SWAP_CONFIG = """
[server]
port = {PORT}

[models]
memory_budget_mb = @BUDGET@

[providers.coder]
kind = "openai"
base_url = "http://127.0.0.1:@PA@/v1"
model = "@MODEL@"
timeouts = { connect = 5, first_byte = 300, idle = 120, total = 600 }
process = { command = @ARGV_A@, ready_url = "http://127.0.0.1:@PA@/health", start = "on_demand", start_timeout_s = 60, startsecs = 0.2, idle_stop_s = @IDLE@ }

[providers.small]
kind = "openai"
base_url = "http://127.0.0.1:@PB@/v1"
model = "@MODEL@"
timeouts = { connect = 5, first_byte = 300, idle = 120, total = 600 }
process = { command = @ARGV_B@, ready_url = "http://127.0.0.1:@PB@/health", start = "on_demand", start_timeout_s = 60, startsecs = 0.2, idle_stop_s = @IDLE@ }

[profiles.default]
providers = ["coder"]
health_action = "warn"

[profiles.fast]
providers = ["small"]
health_action = "warn"
"""


def swap_config(sc: Scenario, ports: tuple[int, int], starts_log: Path, state: Path, *,
                idle_stop_s: float = 0) -> str:
    """Both servers on demand, each started through tests/support/exclusive.py, which notes which of the two is
    alive at the moment each one starts; the budget is 1.5x one server's estimate (model file + KV cache). The
    wrapper hides llama-server from coderouterd's own --slot-save-path, so the command names the daemon's slot
    directory itself (under `state`), where its slots are saved before each stop."""
    from coderouterd.kvcache.disk import slot_dir
    from coderouterd.supervise.memory import estimate_mb

    p = paths()
    # Two different models in real use: here one model file, so the second server gets 128 more tokens of context,
    # which keys its slot files apart (saved slots are keyed by model file, context and server version: two
    # identical servers would share file names).
    argvs = [server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], port, slots=sc.slots, ctx_per_slot=sc.ctx + 128 * i,
                         save_dir=slot_dir(state)) for i, port in enumerate(ports)]
    budget = round(estimate_mb(argvs[1]) * 1.5, 1)  # the bigger of the two
    wrap = [sys.executable, "-m", "tests.support.exclusive", str(starts_log), ",".join(map(str, ports)), "--"]
    return (SWAP_CONFIG.replace("@PA@", str(ports[0])).replace("@PB@", str(ports[1]))
            .replace("@ARGV_A@", json.dumps(wrap + argvs[0])).replace("@ARGV_B@", json.dumps(wrap + argvs[1]))
            .replace("@MODEL@", MODEL).replace("@BUDGET@", str(budget)).replace("@IDLE@", str(idle_stop_s)))


AGENTS_CONFIG = """
[server]
port = {PORT}
ping_interval_s = 1

[models]
memory_budget_mb = @BUDGET@
swap_hold_s = @swap_hold_s@
min_resident_s = @min_resident_s@

[providers.coder]
kind = "openai"
base_url = "http://127.0.0.1:@PA@/v1"
model = "@MODEL@"
process = { command = @ARGV_A@, ready_url = "http://127.0.0.1:@PA@/health", start = "on_demand", start_timeout_s = 120 }

[providers.small]
kind = "openai"
base_url = "http://127.0.0.1:@PB@/v1"
model = "@MODEL@"
process = { command = @ARGV_B@, ready_url = "http://127.0.0.1:@PB@/health", start = "on_demand", start_timeout_s = 120 }

[profiles.default]
providers = ["coder"]

[profiles.fast]
providers = ["small"]

[[routes]]
model = "*haiku*"
profile = "fast"
"""


def agents(sc: Scenario, tmp: Path, *, hold_s: float | None = None, min_resident_s: float | None = None,
           start_delay_s: float = 2.0, root: Path = ROOT) -> dict:
    """The agents trace (tests/e2e/test_ondemand_swaps.py's Trace) on two real servers with a budget for one, each
    start held `start_delay_s` before the server runs, through coderouterd from the source tree `root` (None for
    hold_s and min_resident_s: that code's defaults, or a revision that has no such keys). Counts requests,
    failures, starts (each read from the process table as it happens: tests/support/exclusive.py), changes of the
    demanded model, processed tokens against the best possible, and time to first token."""
    from coderouterd.supervise.memory import estimate_mb
    from tests.e2e.test_ondemand_swaps import Trace

    p = paths()
    ports = (free_port(), free_port())
    log = tmp / "starts.log"
    tmp.mkdir(parents=True, exist_ok=True)
    argvs = [server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], port, slots=sc.slots, ctx_per_slot=sc.ctx + 128 * i)
             for i, port in enumerate(ports)]
    budget = round(estimate_mb(argvs[1]) * 1.5, 1)
    slow = ["sh", "-c", f'sleep {start_delay_s:g}; exec "$0" "$@"']
    wrap = [sys.executable, "-m", "tests.support.exclusive", str(log), ",".join(map(str, ports)), "--", *slow]
    cfg = (AGENTS_CONFIG.replace("@PA@", str(ports[0])).replace("@PB@", str(ports[1]))
           .replace("@ARGV_A@", json.dumps(wrap + argvs[0])).replace("@ARGV_B@", json.dumps(wrap + argvs[1]))
           .replace("@MODEL@", MODEL).replace("@BUDGET@", str(budget)))
    for key, value in (("swap_hold_s", hold_s), ("min_resident_s", min_resident_s)):
        cfg = cfg.replace(f"{key} = @{key}@\n", "" if value is None else f"{key} = {value:g}\n")
    d = DaemonProcess(cfg, tmp, root=root).start()
    try:
        trace = Trace(d.url)
        trace.run()
    finally:
        d.stop()
    starts = log.read_text().splitlines() if log.exists() else []
    ttft_p50, ttft_p95 = p50_p95(trace.ttft)
    return {"requests": len(trace.results), "failed": len(trace.failures()), "changes": trace.changes(),
            "starts": len(starts), "starts_with_other_alive": [s for s in starts if not s.endswith("=[]")],
            **trace_tokens(trace.calls, tmp / "tokenise", sc.ctx, Trace.served),
            "ttft_p50_s": ttft_p50, "ttft_p95_s": ttft_p95}


def trace_tokens(calls: list[tuple[float, dict, int, str]], tmp: Path, ctx: int,
                 served: Callable[[int, str], bool]) -> dict:
    """Processed tokens of the requests served (what each answer's usage says was not read from cache) against the
    best possible: each prompt less its longest prefix shared with an earlier-sent prompt on the same model,
    tokenised by the server (`best_reuse`, as every scenario's ideal). All of them, then the agents' turns (the
    requests with tools) alone. A failed request counts in no sum, but its prompt stays one a later one may share."""
    calls = sorted(calls, key=lambda c: c[0])
    bound = best_reuse(tokenise_offline([body for _, body, _, _ in calls], tmp, ctx),
                       [body["model"] for _, body, _, _ in calls])
    out: dict = {}
    for label, pick in (("", lambda body: True), ("agents_", lambda body: "tools" in body)):
        turns, best = [], []
        for (_, body, code, text), b in zip(calls, bound, strict=True):
            if pick(body) and served(code, text):
                usage = usage_of(text)
                cached = usage.get("cache_read_input_tokens") or 0
                turns.append(Turn(0, "main" if "tools" in body else "background", False,
                                  (usage.get("input_tokens") or 0) + cached, cached, 0.0))
                best.append(b)
        got = summary(turns, best)
        out.update({f"{label}processed_tokens": got["processed_tokens"],
                    f"{label}ideal_processed": got["ideal_processed"], f"{label}of_ideal": got["of_ideal"]})
    return out


def _ready_times(audit: Path) -> dict[str, list[float]]:
    """process -> wall-clock times it became ready, from the audit log's process events."""
    from datetime import datetime

    out: dict[str, list[float]] = {}
    for line in audit.read_text().splitlines() if audit.exists() else []:
        ev = orjson.loads(line)
        if ev.get("kind") == "process" and ev.get("event") == "ready" and ev.get("primary", True):
            ts = datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()
            out.setdefault(ev["process"], []).append(ts)
    return out


def swap(sc: Scenario, tmp: Path, *, budget: bool = True) -> dict:
    """Alternating conversations on two models with a budget for one. Each turn after the first two swaps: the
    other server is stopped (its slots saved first, where slot saving before a stop is on) and this one started.
    Reports what each returning turn processed against its new tokens, the starts that found the other server
    alive (must be none), and errors (must be none)."""
    ports = (free_port(), free_port())
    log = tmp / "starts.log"
    cfg = swap_config(sc, ports, log, tmp / "state")  # DaemonProcess's state directory
    if not budget:  # the baseline: both servers stay up, no turn ever swaps
        cfg = cfg.replace("[models]\nmemory_budget_mb = ", "[models]\nmemory_budget_mb = 0 # ")
    d = DaemonProcess(cfg, tmp)  # its cwd is the repository: the wrapper imports from it
    first_token_at: list[tuple[str, float, float]] = []  # (process, wall time of the first token, request start)
    turns: list[Turn] = []
    errors: list[str] = []
    returning: list[tuple[int, int]] = []  # (processed, new tokens) of each turn after a swap away and back
    last_prompt: dict[int, int] = {}
    ready_ttft: list[float] = []
    d.start()
    try:
        with httpx.Client(base_url=d.url, timeout=300, headers={"anthropic-version": "2023-06-01"}) as http:
            for s, _kind in order(sc):
                profile = "default" if s.n % 2 == 0 else "fast"
                body = {**s.main_body(), "stream": True}
                t0 = time.perf_counter()
                w0 = time.time()
                with http.stream("POST", "/v1/messages", json=body,
                                 headers={**s.headers, "x-coderouter-profile": profile}) as r:
                    if r.status_code != 200:
                        errors.append(f"{r.status_code} {r.read()[:200]!r}")
                        s.advance()
                        continue
                    ttft, usage, failed = _anthropic_stream(r, t0)
                    errors.extend(str(ev) for ev in failed)
                cached = usage.get("cache_read_input_tokens") or 0
                prompt = (usage.get("input_tokens") or 0) + cached
                turn = Turn(s.n, "main", s.n not in last_prompt, prompt, cached, ttft or 0.0)
                turns.append(turn)
                if s.n in last_prompt:
                    returning.append((prompt - cached, prompt - last_prompt[s.n]))
                    ready_ttft.append(turn.ttft_s)
                    first_token_at.append(("coder" if profile == "default" else "small", w0 + turn.ttft_s, w0))
                last_prompt[s.n] = prompt
                s.advance()
    finally:
        d.stop()
    starts = log.read_text().splitlines() if log.exists() else []
    # Time to first token counted from the moment the returning turn's server was ready (its start is not the
    # turn's cost): the last ready of that process after the request was sent; none (it never swapped): from
    # the request.
    readies = _ready_times(d.state_dir / "audit.jsonl")
    from_ready = []
    for proc, first, sent in first_token_at:
        ready = [t for t in readies.get(proc, []) if sent <= t <= first]
        from_ready.append(first - (ready[-1] if ready else sent))
    processed = sum(p for p, _ in returning)
    new = sum(n for _, n in returning)
    return {"requests": len(turns) + len(errors), "errors": errors, "starts": len(starts),
            "starts_with_other_alive": [ln for ln in starts if not ln.endswith("others_alive=[]")],
            "prompt_tokens": sum(t.prompt_tokens for t in turns),
            "processed_tokens": sum(t.prompt_tokens - t.cached_tokens for t in turns),
            "returning_processed": processed, "returning_new": new,
            "returning_ratio": round(processed / new, 3) if new else None,
            "returning_turns": returning,
            "warm_ttft_p50_s": round(statistics.median(ready_ttft), 3) if ready_ttft else None,
            "ttft_from_ready_p50_s": round(statistics.median(from_ready), 3) if from_ready else None}


def _admin(d: DaemonProcess, path: str) -> dict:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.state_dir / "coderouterd.sock")),
                      base_url="http://coderouterd", timeout=10) as a:
        return a.get(path).json()


def _warm_status(d: DaemonProcess) -> dict:
    p = next(p for p in _admin(d, "/v1/status")["providers"] if p["name"] == "llama")
    return ((p.get("cache") or {}).get("slots") or {}).get("warm") or {}


def wait_saved(d: DaemonProcess, timeout: float = 120) -> None:
    """The pause a person takes to read an answer: every lane idle past save_idle_after_s is on disk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _warm_status(d).get("unsaved_lanes") == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("lanes not saved in the background in time")


def interrupted(sc: Scenario, tmp: Path, how: str | tuple[str, ...], *, saves: bool = True) -> dict:
    """The workload cut in equal parts by a restart of coderouterd ("restart") or kill -9 of its server
    ("kill"), in the order given; processed tokens against the best any cache could do over the whole run, and
    per part after each interruption (`after_restart`, `after_kill`: processed / ideal of that part's requests)."""
    hows = (how,) if isinstance(how, str) else how
    port = free_port()
    d = DaemonProcess(daemon_config(sc, port, extra=f"save_idle_after_s = {IDLE_SAVE_S}\n" if saves else NO_SAVES),
                      tmp)
    turns_order = order(sc)
    cut = [len(turns_order) * k // (len(hows) + 1) for k in range(len(hows) + 2)]
    got: list[Turn] = []
    d.start()
    try:
        wait_model(f"http://127.0.0.1:{port}")
        got += drive_router(d.url, sc, turns_order[:cut[1]])
        for k, what in enumerate(hows, start=1):
            if what == "restart":
                d.stop()
                d.start()
            else:
                if saves:
                    wait_saved(d)
                else:
                    time.sleep(IDLE_SAVE_S * 2)  # the same pause
                procs = _admin(d, "/v1/processes")["processes"]
                proc = procs[0] if isinstance(procs, list) else next(iter(procs.values()))
                os.kill(proc["pid"], signal.SIGKILL)
                time.sleep(0.3)
            wait_model(f"http://127.0.0.1:{port}")
            got += drive_router(d.url, sc, turns_order[cut[k]:cut[k + 1]])  # the first may wait for the restart
        warm = _warm_status(d)
        prompts = token_prompts(f"http://127.0.0.1:{port}", sc)
    finally:
        d.stop()
    bound = best_reuse(prompts)
    out = summary(got, bound)
    out["of_ideal"] = round(out["processed_tokens"] / out["ideal_processed"], 3) if out["ideal_processed"] else None
    for k, what in enumerate(hows, start=1):
        part = range(cut[k], cut[k + 1])
        processed = sum(got[i].prompt_tokens - got[i].cached_tokens for i in part)
        ideal = sum(got[i].prompt_tokens - bound[i] for i in part)
        out[f"after_{what}"] = round(processed / ideal, 3) if ideal else None
    out["saves"], out["save_mb"], out["save_s"] = warm.get("saves"), round((warm.get("save_bytes") or 0) / 2**20, 1), \
        warm.get("save_s")
    out["restores"], out["restore_s"] = warm.get("restores"), warm.get("restore_s")
    return out


def run_warm(scenarios: list[Scenario]) -> list[dict]:
    rows = []
    for sc in scenarios:
        with tempfile.TemporaryDirectory(prefix=f"crwarm-{sc.name}-") as t:
            tmp = Path(t)
            t0 = time.monotonic()
            fresh = routed(sc, tmp / "fresh", token_prompts_of(sc, tmp / "tok"))
            fresh["of_ideal"] = round(fresh["processed_tokens"] / fresh["ideal_processed"], 3)
            rows.append({"scenario": sc.name, "run": "fresh", **fresh})
            for how in ("restart", "kill"):
                for saves in (True, False):
                    r = interrupted(sc, tmp / f"{how}-{saves}", how, saves=saves)
                    rows.append({"scenario": sc.name, "run": f"{how}, saves {'on' if saves else 'off'}", **r})
            print(f"# {sc.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return rows


def token_prompts_of(sc: Scenario, tmp: Path) -> list[list[int]]:
    with LlamaServer(tmp, slots=1, ctx_per_slot=sc.ctx, save=False) as server:
        return token_prompts(server.url, sc)


def tokenise_offline(bodies: list[dict], tmp: Path, ctx: int) -> list[list[int]]:
    """`tokenise` on a server of its own (/apply-template and /tokenize use no slot), for a run whose servers
    are gone or were never asked."""
    with LlamaServer(tmp, slots=1, ctx_per_slot=ctx, save=False) as server:
        return tokenise(server.url, bodies)


def print_warm_table(rows: list[dict]) -> None:
    cols = ["scenario", "run", "requests", "prompt_tokens", "processed_tokens", "ideal_processed", "of_ideal",
            "after_restart", "after_kill", "warm_ttft_p50_s", "warm_ttft_p95_s", "saves", "save_mb", "save_s", "restores", "restore_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


def restart_bound(prompts: list[list[int]]) -> list[int]:
    """The best any assignment could give when the server's cache is emptied twice (at each third)."""
    third = len(prompts) // 3
    out = []
    for i in range(len(prompts)):
        start = 0 if i < third else third if i < 2 * third else 2 * third
        out.append(best_reuse(prompts[start:i + 1])[-1])
    return out


def run(scenarios: list[Scenario], restart: bool) -> list[dict]:
    rows = []
    for sc in scenarios:
        with tempfile.TemporaryDirectory(prefix=f"crreal-{sc.name}-") as t:
            tmp = Path(t)
            t0 = time.monotonic()
            if sc.name.startswith("swap"):
                base = swap(sc, tmp / "both", budget=False)
                rows.append({"scenario": sc.name, "run": "both resident (no budget): never swaps", **base})
                r = swap(sc, tmp / "swap")
                rows.append({"scenario": sc.name, "run": "budget for one: every turn swaps", **r})
                print(f"# {sc.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
                continue
            base, prompts = baseline(sc, tmp / "base")
            rows.append({"scenario": sc.name, "run": "straight (server's choice)", **base})
            rows.append({"scenario": sc.name, "run": "coderouterd, affinity", **routed(sc, tmp / "aff", prompts)})
            rows.append({"scenario": sc.name, "run": "coderouterd, affinity off",
                         **routed(sc, tmp / "noaff", prompts, affinity=False)})
            if restart:
                r = after_restarts(sc, tmp / "restart", prompts)
                # Against the best any assignment could give with the server's cache emptied at each restart.
                # Saved slot files outlive the process, so with save/restore this can exceed 1; the last column
                # compares with the best of a run that never restarted, which it cannot.
                best = sum(restart_bound(prompts))
                r["best_tokens"] = best
                r["of_best"] = round(r["reused_tokens"] / best, 4) if best else 1.0
                rows.append({"scenario": sc.name, "run": "coderouterd, server killed + daemon restarted", **r})
            for row in rows:
                if row["scenario"] == sc.name:
                    row["of_best_without_restarts"] = round(row["reused_tokens"] / base["best_tokens"], 4)
            print(f"# {sc.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return rows


def print_table(rows: list[dict]) -> None:
    cols = ["scenario", "run", "requests", "prompt_tokens", "processed_tokens", "ideal_processed", "of_ideal",
            "reused_tokens",
            "best_tokens", "of_best", "of_best_without_restarts", "warm_ttft_p50_s", "warm_ttft_p95_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


# -- replicas (issue 44 section 1) ---------------------------------------------------------------------------------

REPLICA_NAMES = ("gpu1", "gpu2", "gpu3")
# How each run spreads the turns: a profile of the three replicas in one of today's modes, balance, or a
# round-robin (each request to the next replica's one-provider profile, by the X-CodeRouter-Profile header: what a
# plain load balancer in front of the servers does, with coderouterd's slot affinity still on each replica).
REPLICA_MODES = {
    "balance": 'mode = "balance"',
    "round-robin": None,
    "fallback": 'mode = "fallback"',
    "race": 'mode = "race"\nrace_width = 3',
    "adaptive": 'mode = "fallback"\nadaptive = true',
}


def replicas_config(ports: list[int], profile: str | None) -> str:
    out = ["[server]\nport = {PORT}\n"]
    for name, port in zip(REPLICA_NAMES, ports, strict=True):
        out.append(f'[providers.{name}]\nkind = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                   f'model = "{MODEL}"\ntimeouts = {{ connect = 5, first_byte = 300, idle = 120, total = 600 }}\n')
    names = json.dumps(list(REPLICA_NAMES))
    out.append(f'[profiles.default]\nproviders = {names}\nhealth_action = "warn"\n{profile or ""}\n')
    for i, name in enumerate(REPLICA_NAMES):
        out.append(f'[profiles.r{i}]\nproviders = ["{name}"]\nhealth_action = "warn"\n')
    return "\n".join(out)


def prompt_tokens_processed(url: str) -> int:
    """What a llama-server says it computed (its /metrics, on with --metrics): the truth a race's loser adds to."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total"):
            return int(float(line.split()[-1]))
    raise RuntimeError(f"{url}/metrics has no llamacpp:prompt_tokens_total")


def replicas_run(sc: Scenario, tmp: Path, mode: str) -> dict:
    """One run on three fresh servers (unmanaged: started here, as on other machines) behind one coderouterd."""
    from tests.support import replicas

    servers = [LlamaServer(tmp / name, slots=sc.slots, ctx_per_slot=sc.ctx, save=False) for name in REPLICA_NAMES]
    try:
        for srv in servers:
            srv.spawn()
        for srv in servers:
            srv.wait_ready()
        d = DaemonProcess(replicas_config([srv.port for srv in servers], REPLICA_MODES[mode]), tmp / "daemon")
        d.start()
        try:
            clients = replicas.conversations(3, sc.sessions // 3, sc.shape)
            rr = (lambda i: {"x-coderouter-profile": f"r{i % 3}"}) if mode == "round-robin" else (lambda _i: {})
            answers = replicas.drive(d.url, clients, sc.turns, rr)
        finally:
            d.stop()
        return replicas.report(answers, sum(prompt_tokens_processed(srv.url) for srv in servers))
    finally:
        for srv in servers:
            srv.stop()


def run_replicas(sc: Scenario, modes: list[str]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"crreal-{sc.name}-") as t:
        for mode in modes:
            t0 = time.monotonic()
            r = replicas_run(sc, Path(t) / mode, mode)
            rows.append({"scenario": sc.name, "run": mode, **r})
            print(f"# {sc.name} {mode}: {time.monotonic() - t0:.0f} s {r}", file=sys.stderr)
    return rows


def print_replicas_table(rows: list[dict]) -> None:
    cols = ["run", "requests", "prompt_tokens", "processed_tokens", "best_processed", "of_best", "ttft_p50_s",
            "ttft_p95_s", "per_replica"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        per = r.get("per_replica") or {}
        r = {**r, "per_replica": " / ".join(str(per.get(n, 0)) for n in REPLICA_NAMES)}
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="all",
                    help="suite: both at the test suite's smaller scale")
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--warm", action="store_true", help="restart and kill -9 half-way, slot saves on and off")
    ap.add_argument("--modes", default=",".join(REPLICA_MODES),
                    help="replicas: the runs to make, of " + ", ".join(REPLICA_MODES))
    ap.add_argument("--head", default=None,
                    help="the revision whose code runs the same workload in the same run ('' for none): for "
                         "--scenario shared, default main; for --scenario agents, default "
                         f"{AGENTS_HEAD}, the parent of the commit that brought the new swap scheduler (main "
                         "already has it)")
    args = ap.parse_args()
    if args.scenario == "agents":
        print_agents_table(run_agents(AGENTS, AGENTS_HEAD if args.head is None else args.head or None))
        return
    if args.scenario == "replicas":
        print_replicas_table(run_replicas(REPLICAS, [m for m in args.modes.split(",") if m]))
        return
    if args.scenario.startswith("shared"):
        print_shared_table(run_shared(SCENARIOS[args.scenario], "main" if args.head is None else args.head or None))
        return
    if args.warm:
        print_warm_table(run_warm(SCENARIOS[args.scenario if args.scenario.startswith(("three", "warm")) else "three"]))
        return
    rows = run(SCENARIOS[args.scenario], args.restart)
    if args.scenario.startswith("swap"):
        cols = ["scenario", "run", "requests", "errors", "starts", "starts_with_other_alive", "prompt_tokens",
                "processed_tokens", "returning_processed", "returning_new", "returning_ratio", "warm_ttft_p50_s",
                "ttft_from_ready_p50_s"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(len(r[c]) if isinstance(r.get(c), list) else r.get(c, "")) for c in cols)
                  + " |")
        return
    print_table(rows)


if __name__ == "__main__":
    main()
