"""Side-by-side comparison of two sets of journal rows (providers, profiles or time windows).

Pure functions over the dicts `journal_rows` returns, so corectl, the admin API and tests share
one definition of every metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

SMALL_SAMPLE = 20

METRICS: tuple[str, ...] = (
    "requests",
    "avg_input_tokens",
    "avg_output_tokens",
    "p50_latency_ms",
    "p95_latency_ms",
    "p50_ttfb_ms",
    "p95_ttfb_ms",
    "error_rate",
    "fallback_rate",
    "avg_cost_usd",
    "total_cost_usd",
    "cache_hit_ratio",
    "streaming_ratio",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def is_error(row: dict[str, Any]) -> bool:
    status = row.get("status") or 0
    return status >= 400 or (status == 0 and bool(row.get("error_class")))


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    n = len(rows)

    def total(col: str) -> float:
        return sum(r.get(col) or 0 for r in rows)

    latencies = [float(r["latency_ms"]) for r in rows if r.get("latency_ms") is not None]
    ttfbs = [float(r["ttfb_ms"]) for r in rows if r.get("ttfb_ms") is not None]
    t_in, t_read, t_write = total("input_tokens"), total("cache_read_tokens"), total("cache_write_tokens")
    prompt = t_in + t_read + t_write
    cost = total("cost_usd")
    return {
        "requests": n,
        "avg_input_tokens": total("input_tokens") / n if n else None,
        "avg_output_tokens": total("output_tokens") / n if n else None,
        "p50_latency_ms": percentile(latencies, 50),
        "p95_latency_ms": percentile(latencies, 95),
        "p50_ttfb_ms": percentile(ttfbs, 50),
        "p95_ttfb_ms": percentile(ttfbs, 95),
        "error_rate": sum(1 for r in rows if is_error(r)) / n if n else None,
        "fallback_rate": sum(1 for r in rows if (r.get("fallback_count") or 0) > 0) / n if n else None,
        "avg_cost_usd": cost / n if n else None,
        "total_cost_usd": cost,
        "cache_hit_ratio": t_read / prompt if prompt else None,
        "streaming_ratio": sum(1 for r in rows if r.get("streaming")) / n if n else None,
    }


def relative_delta(a: float | None, b: float | None) -> float | None:
    """(b - a) / a in percent; 0 when both are 0; None when undefined."""
    if a is None or b is None:
        return None
    if a == 0:
        return 0.0 if b == 0 else None
    return (b - a) / abs(a) * 100.0


def _pct(x: float) -> str:
    return f"{x:.0f}%"


def _cost_clause(a: float | None, b: float | None, label_a: str) -> str | None:
    if a is None or b is None:
        return None
    if a == b:
        return "costs the same per request"
    if a == 0:
        return f"costs ${b:.4f} per request where {label_a} was free"
    if b < a:
        return f"is {_pct((a - b) / a * 100)} cheaper per request"
    return f"is {_pct((b - a) / a * 100)} more expensive per request"


def _latency_clause(a: float | None, b: float | None) -> str | None:
    if a is None or b is None:
        return None
    if a == b or a == 0:
        return "is equally fast at p50" if a == b else None
    if b < a:
        return f"is {_pct((a - b) / a * 100)} faster at p50"
    return f"is {_pct((b - a) / a * 100)} slower at p50"


def _error_clause(a: float | None, b: float | None) -> str | None:
    # Only a gap of at least one percentage point is worth a mention in one line.
    if a is None or b is None or abs(b - a) < 0.01:
        return None
    word = "more" if b > a else "fewer"
    return f"has {word} errors ({b * 100:.1f}% vs {a * 100:.1f}%)"


def verdict(a: dict[str, Any], b: dict[str, Any], label_a: str = "A", label_b: str = "B") -> str:
    if not a["requests"] or not b["requests"]:
        empty = [lbl for lbl, s in ((label_a, a), (label_b, b)) if not s["requests"]]
        return f"No requests for {' and '.join(empty)}: nothing to compare."
    clauses = [
        c
        for c in (
            _cost_clause(a["avg_cost_usd"], b["avg_cost_usd"], label_a),
            _latency_clause(a["p50_latency_ms"], b["p50_latency_ms"]),
            _error_clause(a["error_rate"], b["error_rate"]),
        )
        if c
    ]
    if not clauses:
        clauses = ["has no comparable cost or latency"]
    # "is 10% cheaper ... and is 5% slower" reads better with the repeated verb dropped.
    for i in range(1, len(clauses)):
        if clauses[i].startswith("is ") and clauses[i - 1].startswith("is "):
            clauses[i] = clauses[i][3:]
    joined = clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]
    body = f"{label_b} {joined}"
    if a["requests"] < SMALL_SAMPLE or b["requests"] < SMALL_SAMPLE:
        body += (
            f" (small sample: {a['requests']} vs {b['requests']} requests, fewer than {SMALL_SAMPLE}"
            " on one side; treat as a hint)"
        )
    return body


def compare(
    rows_a: Iterable[dict[str, Any]],
    rows_b: Iterable[dict[str, Any]],
    *,
    label_a: str = "A",
    label_b: str = "B",
) -> dict[str, Any]:
    """Metrics for both sides, per-metric deltas (relative % of B against A) and a verdict."""
    a = summarize(rows_a)
    b = summarize(rows_b)
    delta = {m: relative_delta(a[m], b[m]) for m in METRICS}
    delta_abs = {m: (b[m] - a[m]) if a[m] is not None and b[m] is not None else None for m in METRICS}
    return {
        "label_a": label_a,
        "label_b": label_b,
        "metrics": list(METRICS),
        "a": a,
        "b": b,
        "delta": delta,
        "delta_abs": delta_abs,
        "small_sample": a["requests"] < SMALL_SAMPLE or b["requests"] < SMALL_SAMPLE,
        "verdict": verdict(a, b, label_a, label_b),
    }
