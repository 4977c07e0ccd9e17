"""Trends over the journal: latency and prefix-cache hit ratio per provider over time, bucketed, and the days
of a month.

The rows come from the journal reader (journal_reader.py: series_rows, daily_cost, cache_busts select only the
columns a trend needs and cap the rows they read, so a month of history costs one bounded query). The series are
pure functions over those rows; every figure in a bucket is replay.summarize's, the one definition corectl's
`replay` uses too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from coderouterd.state.replay import summarize

DAY_S = 86_400.0


def buckets(since: float, until: float, step: float) -> list[float]:
    """Bucket start times covering [since, until), aligned to `step` so a refresh keeps the same buckets."""
    first = math.floor(since / step) * step
    n = max(1, math.ceil((until - first) / step))
    return [first + i * step for i in range(n)]


def _volume(group: list[dict[str, Any]]) -> dict[str, float | None]:
    """Tokens in one bucket, and generation speed: output tokens over the time spent generating them (first
    byte to end), summed over the requests that streamed any."""
    out_tokens = gen_s = 0.0
    for r in group:
        o, lat, ttfb = r.get("output_tokens") or 0, r.get("latency_ms"), r.get("ttfb_ms")
        if o and lat is not None and ttfb is not None and lat > ttfb:
            out_tokens += o
            gen_s += (lat - ttfb) / 1000.0
    return {"input_tokens": sum(r.get("input_tokens") or 0 for r in group),
            "output_tokens": sum(r.get("output_tokens") or 0 for r in group),
            "cached_tokens": sum(r.get("cache_read_tokens") or 0 for r in group),
            "tokens_per_s": out_tokens / gen_s if gen_s > 0 else None}


def provider_series(rows: Iterable[dict[str, Any]], since: float, until: float, step: float) -> dict[str, Any]:
    """Per provider, one value per bucket (None where it served nothing): p50/p95 of time to first byte and of
    total time, the prefix-cache hit ratio, the request count, input/output/cached tokens and generation speed.
    Requests no provider served are counted apart (`unserved`), never as a provider. Columnar, as a time-series
    chart takes it."""
    t = buckets(since, until, step)
    first = t[0]
    grouped: dict[str, dict[int, list[dict[str, Any]]]] = {}
    unserved: list[int] = [0] * len(t)
    for r in rows:
        i = int((r["ts"] - first) // step)
        if 0 <= i < len(t):
            if not r.get("provider"):
                unserved[i] += 1
                continue
            grouped.setdefault(r["provider"], {}).setdefault(i, []).append(r)
    fields = {"ttft_p50": "p50_ttfb_ms", "ttft_p95": "p95_ttfb_ms", "total_p50": "p50_latency_ms",
              "total_p95": "p95_latency_ms", "cache_hit_ratio": "cache_hit_ratio", "requests": "requests"}
    volume = ("input_tokens", "output_tokens", "cached_tokens", "tokens_per_s")
    providers: dict[str, dict[str, list]] = {}
    for name in sorted(grouped):
        cols: dict[str, list] = {k: [None] * len(t) for k in (*fields, *volume)}
        for i, group in grouped[name].items():
            s = summarize(group)
            for k, src in fields.items():
                cols[k][i] = s[src]
            for k, v in _volume(group).items():
                cols[k][i] = v
        providers[name] = cols
    return {"t": t, "step_s": step, "providers": providers, "unserved": unserved}


def month_days(month_start: float, month_end: float) -> list[float]:
    return [month_start + i * DAY_S for i in range(round((month_end - month_start) / DAY_S))]
