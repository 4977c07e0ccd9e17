"""The pure parts of corectl's operating commands, in-process: time expressions, log following across rotation,
replay deltas, top's figures, and the status rendering of processes, spend and a failing store."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

import pytest
from rich.console import Console

from corectl import history, ops, render, top

NOW = 1_750_000_000.0


def test_parse_time_relative_iso_and_errors():
    assert history.parse_time("2h", NOW) == NOW - 7200
    assert history.parse_time("7d", NOW) == NOW - 7 * 86400
    assert history.parse_time("30m", NOW) == NOW - 1800
    assert history.parse_time("1w", NOW) == NOW - 7 * 86400
    assert history.parse_time("now", NOW) == NOW
    assert history.parse_time("2025-06-01T12:00:00Z") == datetime(2025, 6, 1, 12, tzinfo=UTC).timestamp()
    assert history.parse_time("2025-06-01T14:00:00+02:00") == datetime(2025, 6, 1, 12, tzinfo=UTC).timestamp()
    # No zone: the user's local clock.
    assert history.parse_time("2025-06-01") == datetime(2025, 6, 1).astimezone().timestamp()
    with pytest.raises(ValueError, match="not a time"):
        history.parse_time("last tuesday")


def test_parse_window():
    assert history.parse_window("14d..7d", NOW) == (NOW - 14 * 86400, NOW - 7 * 86400)
    assert history.parse_window("7d..", NOW) == (NOW - 7 * 86400, NOW)
    assert history.parse_window("2h..now", NOW) == (NOW - 7200, NOW)
    for bad, msg in (("7d", "START..END"), ("..7d", "no start"), ("1d..2d", "ends before")):
        with pytest.raises(ValueError, match=msg):
            history.parse_window(bad, NOW)


def test_tail_lines_reads_backwards_across_blocks(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert ops.tail_lines(str(p), 3, block=16) == ["line 997", "line 998", "line 999"]
    assert ops.tail_lines(str(p), 0) == []
    assert len(ops.tail_lines(str(p), 5000)) == 1000


def _collect(path, stop_after: int):
    got: list[str] = []
    done = threading.Event()

    def run():
        for line in ops.follow_file(str(path), poll_s=0.01, stop=done.is_set):
            got.append(line)
            if len(got) >= stop_after:
                done.set()
                return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return got, done, t


def test_follow_file_survives_copy_truncate_and_rename_rotation(tmp_path):
    p = tmp_path / "srv.log"
    p.write_text("old line\n")
    got, done, t = _collect(p, 4)
    time.sleep(0.1)
    with open(p, "a") as f:
        f.write("one\n")
    time.sleep(0.1)
    os.truncate(p, 0)  # the supervisor's copy-then-truncate rotation
    with open(p, "a") as f:
        f.write("two\n")
    time.sleep(0.1)
    os.replace(p, tmp_path / "srv.log.1")  # a rename rotation: a new file appears at the path
    p.write_text("three\nfour\n")
    t.join(3)
    done.set()
    assert got == ["one", "two", "three", "four"]  # never the line written before following began


def test_follow_file_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    p = tmp_path / "later.log"
    got, done, t = _collect(p, 1)
    time.sleep(0.05)
    p.write_text("hello\n")
    t.join(3)
    done.set()
    assert got == ["hello"]


@pytest.mark.parametrize("metric, rel, absolute, text, style", [
    ("p50_latency_ms", 25.0, 50.0, "+25%", "red"),
    ("p50_latency_ms", -10.0, -5.0, "-10%", "green"),
    ("error_rate", None, 0.02, "+2.0 pp", "red"),
    ("cache_hit_ratio", None, 0.1, "+10.0 pp", "green"),
    ("requests", 100.0, 10, "+100%", ""),
    ("avg_cost_usd", None, 0.5, "new", ""),
    ("avg_cost_usd", 0.0, 0.0, "+0%", "dim"),
    ("p95_ttfb_ms", None, None, "-", ""),
])
def test_metric_delta(metric, rel, absolute, text, style):
    assert history.metric_delta(metric, rel, absolute) == (text, style)


def test_top_figures_from_status_and_traces():
    status = {
        "version": "1", "uptime_s": 5, "active_profile": "default", "stats_window_s": 60,
        "providers": [{"name": "a", "breaker": {"state": "open", "retry_in_s": 4}, "health": "HEALTHY",
                       "figures": {"median_s": 0.2, "samples": 5, "probes": 1, "errors": 2}},
                      {"name": "b", "breaker": {"state": "closed"}, "health": "DEGRADED", "figures": {}}],
        "profiles": [{"name": "default", "active": True, "mode": "fallback", "effective_order": ["b"],
                      "skips": [{"provider": "a", "reason": "breaker_open"}]}],
        "budget": {"month": "2025-06", "global": {"spent": 1.5, "cap": 10.0, "ratio": 0.15}},
        "processes": {}, "store": {"healthy": True},
    }
    traces = [  # newest first, as GET /v1/requests returns them
        {"request_id": "r3", "ts": NOW - 1, "served_by": "b", "ttfb_ms": 30.0, "status": 200,
         "skips": [{"provider": "a", "reason": "breaker_open"}], "attempts": [{"provider": "b", "outcome": "ok"}]},
        {"request_id": "r2", "ts": NOW - 2, "served_by": "b", "ttfb_ms": 10.0, "status": 200, "attempts": []},
        {"request_id": "r1", "ts": NOW - 30, "served_by": "a", "ttfb_ms": 99.0, "status": 200, "attempts": []},
        {"request_id": "r0", "ts": NOW - 600, "served_by": "b", "ttfb_ms": 1000.0, "status": 200, "attempts": []},
    ]
    data = top.compute(status, traces, NOW, rate_window_s=10)
    assert data["requests_per_s"] == pytest.approx(0.2)
    a, b = data["providers"]
    assert (a["p50_latency_ms"], a["p50_ttfb_ms"], a["samples"], a["breaker"]) == (200.0, 99.0, 4, "open")
    assert (b["requests_per_s"], b["p50_ttfb_ms"]) == (pytest.approx(0.2), 20.0)  # r0 is outside the window
    assert data["recent"][0]["route"] == "a skipped:breaker_open > b ok"
    con = Console(width=160, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    con.print(top.view(data))
    text = con.export_text()
    con.file.close()
    for needle in ("open (4s)", "skipped: a", "$1.50 of $10.00 (15%)", "0.20 req/s", "r3"):
        assert needle in text, needle


def test_status_renders_processes_spend_and_store_warning():
    data = {
        "version": "1", "pid": 1, "uptime_s": 10, "listen": {"url": "http://127.0.0.1:8088"}, "config_path": "c",
        "active_profile": "default", "default_profile": "default", "providers": [], "profiles": [],
        "state_dir": "/tmp/s",
        "store": {"healthy": False, "problem": "state database: disk I/O error"},
        "budget": {"month": "2025-06", "global": {"spent": 9.0, "cap": 10.0, "ratio": 0.9},
                   "providers": {"claude": {"spent": 9.0, "cap": 5.0, "ratio": 1.8, "blocked": True},
                                 "local": {"spent": 0.0, "cap": 0.0}}},
        "processes": {"ollama": {"providers": ["ollama-qwen3"], "state": "fatal", "pid": None, "uptime_s": None,
                                 "restarts_recent": 2, "restarts_total": 7, "rss_bytes": None, "cpu_percent": None,
                                 "last_exit_code": 3, "next_probe_at": NOW + 42, "log": "/l/ollama.log",
                                 "fatal_reason": "pid 9 exited with code 3; 2 restarts within 60s"},
                      "lms": {"providers": ["lm"], "state": "ready", "pid": 77, "uptime_s": 3700,
                              "restarts_recent": 0, "restarts_total": 0, "rss_bytes": 3 * 1024**3,
                              "cpu_percent": 12.0, "last_exit_code": None, "next_probe_at": None}},
    }
    con = Console(width=150, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    render.status(data, con)
    text = con.export_text()
    con.file.close()
    for needle in ("WARNING: persistence is failing", "disk I/O error", "$9.00 of $10.00 (90%)",
                   "claude $9.00 of $5.00 (180%) blocked", "Managed processes", "fatal", "2/7", "3.0 GB", "12%",
                   "1h 01m", "corectl restart ollama once it is fixed", "/l/ollama.log"):
        assert needle in text, needle
    assert "local $" not in text  # nothing spent and no cap: not worth a mention
    assert render.next_probe(NOW + 42, NOW) == "in 42s" and render.next_probe(NOW - 1, NOW) == "due"


def test_models_list_shows_how_long_waiting_requests_are_held_to_save_a_swap():
    resident = {"memory_budget_mb": 1500, "memory_held_mb": 1000, "processes": {
        "coder": {"providers": ["coder"], "resident": True, "state": "ready", "memory_mb": 1000, "load_s": 0.3,
                  "waiting": 0},
        "small": {"providers": ["small"], "resident": False, "state": "stopped", "memory_mb": 1000, "load_s": 0.3,
                  "waiting": 2, "hold_s": 0.6, "held": "held to save a swap (~0.6 s: the load times learned)"}}}
    con = Console(width=200, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    con.print(ops.resident_table(resident, 200))
    text = con.export_text()
    con.file.close()
    assert "2 (held ≤ 0.6 s)" in text and "0.3 s" in text
    assert ops.waiting_cell({"waiting": 0, "hold_s": 5.0}) == "0"  # nothing waits: nothing is held
    assert ops.waiting_cell({"waiting": 3}) == "3"
