"""Every corectl table at 80, 100 and 120 columns: no line wider than the terminal, nothing cut with an
ellipsis, ids (providers, request ids, models) whole on one line; `top` keeps every pane in 80x24."""

from __future__ import annotations

import os
import time

import pytest
from rich.console import Console

from corectl import history, ops, render, top

NOW = time.time()
RID = "req_01JQ8Z4N6V2T3K5M7P9R1S3U5W"  # as long as the daemon's ids
PROVIDERS = [
    {"name": name, "kind": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": model, "paid": paid,
     "breaker": {"state": "half_open"}, "health": "DEGRADED", "key_problem": problem,
     "figures": {"median_s": 1.234, "samples": 1234, "probes": 3, "errors": 56},
     "budget": {"spent": 12.5, "cap": 50.0}, "process": "ollama-serve" if port == 11434 else None,
     "process_state": "ready"}
    for name, port, model, paid, problem in (
        ("ollama-qwen3-coder", 11434, "qwen3-coder:30b-a3b-q4_K_M", False, None),
        ("lmstudio", 1234, "qwen/qwen3-coder-30b", False, None),
        ("openrouter-free", 443, "qwen/qwen3-coder:free", False, "no key: $OPENROUTER_API_KEY is not set"),
        ("anthropic", 443, "", True, None))
]
PROFILES = [{"name": "default", "active": True, "mode": "fallback", "adaptive": True,
             "providers": [p["name"] for p in PROVIDERS], "effective_order": [p["name"] for p in PROVIDERS[:3]],
             "skips": [{"provider": "anthropic", "reason": "budget_exhausted"}]},
            {"name": "coding-fast", "active": False, "mode": "race", "providers": ["lmstudio", "ollama-qwen3-coder"],
             "effective_order": ["lmstudio", "ollama-qwen3-coder"], "skips": []}]
STATUS = {"version": "0.1.0", "pid": 4242, "uptime_s": 3725, "listen": {"url": "http://127.0.0.1:8088"},
          "config_path": "/home/user/.config/coderouter/config.toml", "admin_socket": "/run/s.sock",
          "active_profile": "default", "default_profile": "default", "stats_window_s": 300,
          "providers": PROVIDERS, "profiles": PROFILES, "state_dir": "/home/user/.local/state/coderouter",
          "budget": {"month": "2025-06", "global": {"spent": 12.5, "cap": 80.0, "ratio": 0.16}, "providers": {}},
          "processes": {"ollama-serve": {"providers": ["ollama-qwen3-coder"], "state": "ready", "pid": 31337,
                                         "uptime_s": 99999, "restarts_recent": 1, "restarts_total": 12,
                                         "rss_bytes": 21 * 1024**3, "cpu_percent": 250.0, "last_exit_code": 137,
                                         "next_probe_at": None}},
          "store": {"healthy": True}}
ROWS = [{"ts": NOW - i * 60, "request_id": f"{RID[:-2]}{i:02d}", "profile": "coding-fast",
         "provider": "ollama-qwen3-coder", "status": 200 if i % 3 else 502, "latency_ms": 12345.0, "ttfb_ms": 850.0,
         "input_tokens": 23456, "output_tokens": 1234, "cost_usd": 0.0123, "streaming": True,
         "attempts": [{"provider": "lmstudio", "outcome": "failed", "reason": "connect_error"},
                      {"provider": "ollama-qwen3-coder", "outcome": "ok"}]} for i in range(5)]


def _render(width: int, draw, height: int | None = None) -> list[str]:
    con = Console(width=width, height=height or 1000, record=True, file=open(os.devnull, "w"),  # noqa: SIM115
                  color_system=None)
    draw(con)
    text = con.export_text()
    con.file.close()
    return text.splitlines()


def _assert_fits(lines: list[str], width: int, must_show: list[str]) -> None:
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    assert "…" not in text, text
    for needle in must_show:
        assert needle in text, (needle, text)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_status_fits(width):
    lines = _render(width, lambda c: render.status(STATUS, c))
    _assert_fits(lines, width, [p["name"] for p in PROVIDERS] + ["coding-fast", "ollama-serve",
                                                                 "openrouter-free: no key: $OPENROUTER_API_KEY"])
    if width >= 120:
        assert "qwen3-coder:30b-a3b-q4_K_M" in "\n".join(lines)  # the model column is back with room


@pytest.mark.parametrize("width", [80, 100, 120])
def test_providers_models_and_journal_fit(width):
    _assert_fits(_render(width, lambda c: c.print(ops.providers_table(PROVIDERS, 300, c.width))), width,
                 [p["name"] for p in PROVIDERS])
    entries = [{"provider": "lmstudio", "backend": "lmstudio",
                "models": [{"id": "qwen/qwen3-coder-30b-a3b-instruct-mlx-4bit", "loaded": True,
                            "max_context_length": 262144}]}]
    _assert_fits(_render(width, lambda c: c.print(ops.models_table(entries, c.width))), width,
                 ["qwen/qwen3-coder-30b-a3b-instruct-mlx-4bit"])
    _assert_fits(_render(width, lambda c: c.print(history.journal_table(ROWS, c.width, now=NOW))), width,
                 [r["request_id"] for r in ROWS])  # every request id whole, on one line


def test_top_keeps_every_pane_at_80x24():
    traces = [{"request_id": r["request_id"], "ts": r["ts"], "served_by": r["provider"], "status": r["status"],
               "latency_ms": r["latency_ms"], "ttfb_ms": r["ttfb_ms"], "profile": r["profile"],
               "attempts": r["attempts"]} for r in ROWS * 3]
    data = top.compute(STATUS, traces, NOW)
    lines = _render(80, lambda c: c.print(top.view(data, width=80, height=24)))
    assert len(lines) <= 24, "\n".join(lines)
    _assert_fits(lines, 80, ["Providers", "Effective order", "Recent requests", "updated",
                             "ollama-qwen3-coder", "p50 latency", ROWS[0]["request_id"]])


def test_a_fatal_process_says_how_to_restart_it_instead_of_a_next_probe():
    procs = {"llama": {"providers": ["llama"], "state": "fatal", "pid": None, "restarts_recent": 5,
                       "restarts_total": 5, "next_probe_at": NOW + 22},
             "ollama": {"providers": ["ollama"], "state": "ready", "pid": 7, "restarts_recent": 0,
                        "restarts_total": 1, "next_probe_at": NOW + 22}}
    text = "\n".join(_render(200, lambda con: con.print(render.processes_table(procs, now=NOW))))
    fatal = next(line for line in text.splitlines() if line.strip("│ ").startswith("llama"))
    assert "corectl restart llama" in fatal and " in 2" not in fatal
    assert "Restarts recent/all" in text


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_top_with_many_providers_and_profiles_folds_them_and_keeps_every_pane(size):
    width, height = size
    quiet = {"breaker": {"state": "closed"}, "health": "HEALTHY", "key_problem": None,
             "figures": {"median_s": 0.5, "samples": 10, "probes": 0, "errors": 0}}
    many = [{**PROVIDERS[i % len(PROVIDERS)], **quiet, "name": f"provider-{i:02d}"} for i in range(40)]
    many[33] = {**many[33], "breaker": {"state": "open", "retry_in_s": 12}}  # trouble far down stays in view
    profiles = [{**STATUS["profiles"][0], "name": f"profile-{i:02d}", "active": i == 17} for i in range(12)]
    status = {**STATUS, "providers": many, "profiles": profiles, "active_profile": "profile-17"}
    traces = [{"request_id": r["request_id"], "ts": r["ts"], "served_by": r["provider"], "status": r["status"],
               "latency_ms": r["latency_ms"], "ttfb_ms": r["ttfb_ms"], "profile": r["profile"],
               "attempts": r["attempts"]} for r in ROWS * 3]
    data = top.compute(status, traces, NOW)
    lines = _render(width, lambda c: c.print(top.view(data, width=width, height=height)))
    text = "\n".join(lines)
    assert len(lines) <= height, text
    _assert_fits(lines, width, ["Providers", "Effective order", "Recent requests", "updated", "provider-33",
                                "profile-17", "more", "corectl providers", ROWS[0]["request_id"]])
