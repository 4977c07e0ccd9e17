"""The cache-write-without-reads warning: once per route, only after an unbroken streak of writes."""

from __future__ import annotations

from coderouterd.config import parse_config_text
from coderouterd.observe.cache_watch import CACHE_WRITE_STREAK, CacheWatch

CFG = """
[state]
enabled = false
[providers.claude]
kind = "anthropic"
base_url = "http://127.0.0.1:1/v1"
cost = { input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }
[profiles.default]
providers = ["claude"]
"""


def make(_tmp_path):
    cfg = parse_config_text(CFG, "t")
    seen = []
    return CacheWatch(seen.append), cfg.providers["claude"].cost, seen


def write(n=1000):
    return {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": n, "cache_read_input_tokens": 0}


def test_streak_of_writes_warns_once(tmp_path):
    t, cost, seen = make(tmp_path)
    for _ in range(CACHE_WRITE_STREAK - 1):
        t.observe("claude", "default", write(), cost)
    assert seen == []
    t.observe("claude", "default", write(), cost)
    assert len(seen) == 1 and seen[0].kind == "cache_ineffective" and seen[0].writes == CACHE_WRITE_STREAK
    assert seen[0].extra_cost_usd == round(CACHE_WRITE_STREAK * 1000 * 0.75 / 1e6, 6)
    for _ in range(3 * CACHE_WRITE_STREAK):
        t.observe("claude", "default", write(), cost)
    assert len(seen) == 1


def test_a_read_resets_the_streak(tmp_path):
    t, cost, seen = make(tmp_path)
    for i in range(3 * CACHE_WRITE_STREAK):
        usage = write() if i % (CACHE_WRITE_STREAK - 1) else {**write(), "cache_read_input_tokens": 500}
        t.observe("claude", "default", usage, cost)
    assert seen == []
