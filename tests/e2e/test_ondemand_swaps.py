"""Swaps only when they pay (issue 44, section 2), with real child processes: two on-demand fake llama-servers
and a memory budget that holds one, under the agents trace that made the scheduler swap back and forth until
requests failed: an orchestrator and two sub-agents on model A, and five background calls routed to model B,
sent concurrently as Claude Code sends them. Every request is served (a 200 and a complete stream), and the
number of starts is checked as a count: at most one per change of the demanded model, and at most 22 (half of
the 44 the scheduler made before).

Each start is read from the process table at the very moment it happens (tests/support/exclusive.py), so the
test also proves the two never ran together."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_ondemand import status
from tests.fakes.runner import free_port
from tests.support.cli import corectl
from tests.support.config import daemon_config, upstream
from tests.support.daemon import ROOT, DaemonProcess
from tests.support.sse import event_names
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(600)

TOOLS = [{"name": "Bash", "description": "Run a shell command",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]


def llama_cmd(port: int, log: Path, ports: list[int], start_delay: float) -> list[str]:
    fake = [sys.executable, "-m", "tests.fakes", "--kind", "llamacpp", "--port", str(port), "--models", "m",
            "--behaviour", "ok;chunk_delay=0.05", "--start-delay", str(start_delay), "--no-record", "-np", "4"]
    return [sys.executable, "-m", "tests.support.exclusive", str(log), ",".join(map(str, ports)), "--", *fake]


def managed(port: int, cmd: list[str]) -> dict:
    proc = {"command": cmd, "cwd": str(ROOT), "ready_url": f"http://127.0.0.1:{port}/health", "start": "on_demand",
            "memory_mb": 1000, "stop_timeout_s": 5, "start_timeout_s": 60, "startsecs": 0.2, "max_restarts": 1,
            "restart_window_s": 60}
    return upstream(f"http://127.0.0.1:{port}", kind="openai", process=proc)


def agents_config(tmp: Path, *, start_delay: float = 1.5, models: dict | None = None) -> tuple[str, Path]:
    a, b = free_port(), free_port()
    log = tmp / "starts.log"
    providers = {"coder": managed(a, llama_cmd(a, log, [a, b], start_delay)),
                 "small": managed(b, llama_cmd(b, log, [a, b], start_delay))}
    cfg = daemon_config(state={"flush_interval_s": 0.1}, health={"probe_interval_s": 0.5},
                        server={"stream_hold_s": 0.1, "ping_interval_s": 0.2},
                        providers=providers, profiles={"default": ["coder"], "fast": ["small"]},
                        routes=[{"model": "*haiku*", "profile": "fast"}],
                        models={"memory_budget_mb": 1500, **(models or {})})
    return cfg, log


class Trace:
    """The agents trace: each agent runs its turns one after another (a turn waits for the previous answer, as a
    conversation does); background calls are fired without waiting, as Claude Code fires titles and summaries."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[tuple[float, str]] = []  # (when, model demanded), in sending order
        self.results: list[tuple[str, int, str]] = []  # (model, status, body)
        self.ttft: list[float] = []  # seconds to the first content of each request served
        # (when sent, body, status, answer) of each request: bench/real_llama.py counts its processed tokens
        self.calls: list[tuple[float, dict, int, str]] = []
        self._lock = threading.Lock()

    def call(self, who: str, turn: int, background: bool, on_b: bool | None = None) -> None:
        """One request: on model B (routed by its *haiku* model name) for a background call unless `on_b` says
        otherwise; a background call carries no tools."""
        on_b = background if on_b is None else on_b
        model = "claude-haiku-4-5" if on_b else "claude-sonnet-4-5"
        content = f"{who} {'title' if background else 'turn'} {turn}: " + "lorem ipsum " * 20
        body = {"model": model, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": content}]}
        if not background:
            body["tools"] = TOOLS
        with self._lock:
            self.sent.append((time.monotonic(), "B" if on_b else "A"))
        sent = time.monotonic()
        first: float | None = None  # the first content the client saw (bench/real_llama.py's time to first token)
        try:
            with httpx.stream("POST", self.url + "/v1/messages", json=body, timeout=300) as r:
                lines = []
                for line in r.iter_lines():
                    if first is None and '"content_block_delta"' in line:
                        first = time.monotonic() - sent
                    lines.append(line)
                got = (r.status_code, "\n".join(lines))
        except httpx.HTTPError as e:  # a client-side failure is a failed request too
            got = (0, repr(e))
        with self._lock:
            self.results.append(("B" if on_b else "A", *got))
            self.calls.append((sent, body, *got))
            if first is not None and got[0] == 200:
                self.ttft.append(first)

    def run(self) -> None:
        with ThreadPoolExecutor(10) as pool:
            background = []

            def agent(who: str, turns: int, titles_after: tuple[int, ...]) -> None:
                for i in range(turns):
                    self.call(who, i, False)
                    if i in titles_after:
                        background.append(pool.submit(self.call, who, i, True))

            agents = [pool.submit(agent, "orchestrator", 4, (0, 1, 2)),
                      pool.submit(agent, "sub-agent 1", 4, (1,)),
                      pool.submit(agent, "sub-agent 2", 4, (2,))]
            for f in agents:
                f.result()
            for f in background:
                f.result()

    def changes(self) -> int:
        """Changes of the demanded model, in the order the requests were sent."""
        order = [m for _, m in sorted(self.sent)]
        return sum(1 for x, y in zip(order, order[1:], strict=False) if x != y)

    def failures(self) -> list[tuple[str, int, str]]:
        return [(model, code, text[-300:]) for model, code, text in self.results if not self.served(code, text)]

    @staticmethod
    def served(code: int, text: str) -> bool:
        """A 200 and a complete stream, with no error event in it."""
        names = event_names(text) if code == 200 else []
        return bool(names) and names[-1] == "message_stop" and "error" not in names


def test_the_agents_trace_is_served_whole_with_a_swap_per_change_of_the_demanded_model_at_most(tmp_path):
    cfg, log = agents_config(tmp_path)
    d = DaemonProcess(cfg, tmp_path).start()
    try:
        assert wait_for(lambda: status(d).get("models") is not None, 20)
        trace = Trace(d.url)
        trace.run()
        starts = log.read_text().splitlines() if log.exists() else []
        changes = trace.changes()
        print(f"\nagents trace: {len(trace.results)} requests, {changes} changes of the demanded model, "
              f"{len(starts)} starts, {len(trace.failures())} failed")
        assert len(trace.results) == 17
        assert trace.failures() == []
        assert all(line.endswith("others_alive=[]") for line in starts), starts  # never both in memory
        # The first start fills an empty budget; every later one is a swap.
        assert len(starts) - 1 <= changes, (len(starts), changes)
        assert len(starts) <= 22
        st = status(d)
        assert st["models"]["swaps"] == len(starts) - 1 and st["models"]["waiting"] == 0
        # The load time each model showed, learned from its own starts: at least the start delay of the fake.
        assert st["processes"]["coder"]["load_s"] >= 1.5 and st["processes"]["small"]["load_s"] >= 1.5
        models = corectl(["--socket", str(d.state_dir / "coderouterd.sock"), "models", "list"],
                         env={**d.env, "COLUMNS": "200"})
        assert "Load" in models.stdout and "Waiting" in models.stdout, models.stdout + models.stderr
    finally:
        d.stop()


def test_conversations_a_user_waits_for_on_both_models_take_turns_and_are_all_served(tmp_path):
    # Both models wanted in the foreground at once (a sub-agent on B with tools): the busy one is kept while the
    # other's requests are held (swap_hold_s), then they are served together; no request fails, never both run.
    cfg, log = agents_config(tmp_path, models={"swap_hold_s": 1.0, "min_resident_s": 1.0})
    d = DaemonProcess(cfg, tmp_path).start()
    try:
        assert wait_for(lambda: status(d).get("models") is not None, 20)
        trace = Trace(d.url)
        with ThreadPoolExecutor(4) as pool:
            jobs = [pool.submit(lambda who=who, b=b, n=n: [trace.call(who, i, False, on_b=b) for i in range(n)])
                    for who, b, n in (("orchestrator", False, 10), ("sub-agent", False, 10), ("explorer", True, 3))]
            # The explorer sub-agent runs on model B with tools: a foreground request for the other model.
            for f in jobs:
                f.result()
        starts = log.read_text().splitlines() if log.exists() else []
        print(f"\nforeground on both: {len(trace.results)} requests, {trace.changes()} changes, {len(starts)} starts")
        assert trace.failures() == [] and len(trace.results) == 23
        assert len(starts) - 1 <= trace.changes(), (len(starts), trace.changes())
        assert all(line.endswith("others_alive=[]") for line in starts), starts
    finally:
        d.stop()
