"""Prefix routing on a real llama-server's slots, measured from what the server reports it reused
(`timings.cache_n`) against the best any slot assignment could give, with the same workload sent straight at
an identical server (its own slot choice and RAM prompt cache) as the baseline, in the same run.
The workload and the measurement are bench/real_llama.py's, here at its smaller suite scale (the same lanes, slots
and restarts, a fraction of the tokens); the full-scale figures it prints are in bench/README.md."""

from __future__ import annotations

import pytest

from bench.real_llama import (
    THREE_NO_TOOLS_SUITE,
    THREE_SUITE,
    after_restarts,
    baseline,
    fresh,
    print_table,
    restart_bound,
    routed,
)
from bench.real_llama import TWICE_SUITE as TWICE
from bench.real_llama import WITHIN_SUITE as WITHIN
from tests.support.real_llama import paths

# A real model on two CPU cores: each test here takes tens of seconds when the machine is idle, and several times
# that when it is not. The suite-wide 120 s guard is for tests that should be instant.
pytestmark = pytest.mark.timeout(900)


def _show(rows: list[dict]) -> None:
    print()
    print_table(rows)


def test_lanes_within_slots_reuse_nearly_all_any_assignment_could_also_after_restarts(tmp_path):
    paths()
    base, prompts = baseline(WITHIN, tmp_path / "base")
    got = routed(WITHIN, tmp_path / "aff", prompts)
    again = after_restarts(WITHIN, tmp_path / "restart", prompts)
    best = sum(restart_bound(prompts))
    again["best_tokens"], again["of_best"] = best, round(again["reused_tokens"] / best, 4)
    _show([{"run": "straight", **base}, {"run": "coderouterd", **got},
           {"run": "coderouterd, server killed, then daemon restarted", **again}])
    assert got["of_best"] >= 0.95, got
    assert got["reused_tokens"] >= base["reused_tokens"], (got, base)
    # After the server died and after the daemon restarted on its persisted state: no prediction of a cache that
    # died with the process, and every turn after the first cold one is warm again.
    assert again["of_best"] >= 0.95, again


def test_twice_as_many_lanes_as_slots_with_save_restore(tmp_path):
    paths()
    base, prompts = baseline(TWICE, tmp_path / "base")
    got = routed(TWICE, tmp_path / "aff", prompts)
    _show([{"run": "straight", **base}, {"run": "coderouterd", **got}])
    assert got["of_best"] >= 0.80, got


def test_three_sessions_with_title_calls_with_and_without_tools(tmp_path):
    """Issue 33: three interleaved conversations, two title calls, 3 slots, a fresh server: at most 1.10x the
    tokens the best any cache could do would process, and the same when the turns carry no tools (lanes are
    chosen by prefix; by request shape, every turn of a session without tools shared one background lane)."""
    paths()
    rows = [{"run": sc.name, **fresh(sc, tmp_path / sc.name)} for sc in (THREE_SUITE, THREE_NO_TOOLS_SUITE)]
    _show(rows)
    for r in rows:
        assert r["processed_tokens"] <= 1.10 * r["ideal_processed"], r
