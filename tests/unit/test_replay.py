import pytest

from coderouterd.state.replay import METRICS, compare, percentile, relative_delta


def _rows(n, *, latency, ttfb=None, cost=0.0, input_tokens=1000, output_tokens=100, cache_read=0, cache_write=0,
          errors=0, fallbacks=0, streaming=0):
    rows = []
    for i in range(n):
        rows.append(
            {
                "latency_ms": latency(i),
                "ttfb_ms": ttfb(i) if ttfb else None,
                "cost_usd": cost,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cache_read_tokens": cache_read,
                "cache_write_tokens": cache_write,
                "status": 500 if i < errors else 200,
                "error_class": "upstream_5xx" if i < errors else None,
                "fallback_count": 1 if i < fallbacks else 0,
                "streaming": i < streaming,
            }
        )
    return rows


def test_percentile_interpolates():
    assert percentile(list(range(1, 101)), 50) == pytest.approx(50.5)
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None


def test_relative_delta_edges():
    assert relative_delta(100, 135) == pytest.approx(35.0)
    assert relative_delta(0.01, 0.0) == pytest.approx(-100.0)
    assert relative_delta(0, 0) == 0.0
    assert relative_delta(0, 5) is None
    assert relative_delta(None, 5) is None


def test_compare_known_answers():
    a = _rows(100, latency=lambda i: 100.0 + i, ttfb=lambda i: 10.0 + i, cost=0.01, cache_read=1000,
              cache_write=0, errors=5, fallbacks=10, streaming=50)
    b = _rows(40, latency=lambda i: 135.0 + i * (99 / 39), cost=0.0, input_tokens=2000, output_tokens=50,
              cache_read=0, cache_write=0, errors=0, fallbacks=0, streaming=40)
    out = compare(a, b, label_a="anthropic", label_b="ollama")
    sa, sb = out["a"], out["b"]
    assert sa["requests"] == 100 and sb["requests"] == 40
    assert sa["avg_input_tokens"] == 1000 and sb["avg_input_tokens"] == 2000
    assert sa["avg_output_tokens"] == 100 and sb["avg_output_tokens"] == 50
    assert sa["p50_latency_ms"] == pytest.approx(149.5)
    assert sa["p95_latency_ms"] == pytest.approx(194.05)
    assert sa["p50_ttfb_ms"] == pytest.approx(59.5)
    assert sb["p50_ttfb_ms"] is None and sb["p95_ttfb_ms"] is None
    assert sa["error_rate"] == pytest.approx(0.05) and sb["error_rate"] == 0
    assert sa["fallback_rate"] == pytest.approx(0.10)
    assert sa["avg_cost_usd"] == pytest.approx(0.01) and sa["total_cost_usd"] == pytest.approx(1.0)
    assert sa["cache_hit_ratio"] == pytest.approx(0.5) and sb["cache_hit_ratio"] == 0
    assert sa["streaming_ratio"] == 0.5 and sb["streaming_ratio"] == 1.0

    d = out["delta"]
    assert set(d) == set(METRICS)
    assert d["requests"] == pytest.approx(-60.0)
    assert d["avg_input_tokens"] == pytest.approx(100.0)
    assert d["avg_cost_usd"] == pytest.approx(-100.0)
    assert d["p50_ttfb_ms"] is None
    assert d["streaming_ratio"] == pytest.approx(100.0)
    assert out["delta_abs"]["error_rate"] == pytest.approx(-0.05)

    assert sb["p50_latency_ms"] == pytest.approx(184.5)  # 35 ms (23%) slower than A's 149.5
    assert out["small_sample"] is False
    assert out["verdict"] == (
        "ollama is 100% cheaper per request, 23% slower at p50 and has fewer errors (0.0% vs 5.0%)"
    )


def test_verdict_matches_issue_example_and_flags_small_samples():
    a = _rows(30, latency=lambda i: 100.0, cost=0.02)
    b = _rows(30, latency=lambda i: 135.0, cost=0.0)
    assert compare(a, b)["verdict"] == "B is 100% cheaper per request and 35% slower at p50"

    small = compare(a, b[:19])
    assert small["small_sample"] is True
    assert "small sample" in small["verdict"] and "19" in small["verdict"]

    faster = compare(b, a, label_a="local", label_b="cloud")
    assert faster["verdict"].startswith("cloud costs $0.0200 per request where local was free and is 26% faster")


def test_empty_sides():
    a = _rows(25, latency=lambda i: 100.0)
    out = compare(a, [])
    assert out["b"]["requests"] == 0 and out["b"]["p50_latency_ms"] is None
    assert out["small_sample"] is True
    assert out["verdict"] == "No requests for B: nothing to compare."
    assert compare([], [])["verdict"] == "No requests for A and B: nothing to compare."


def test_compare_accepts_journal_rows_with_missing_fields():
    rows = [{"latency_ms": 50.0, "status": 0, "error_class": "client_disconnect"}] * 20
    out = compare(rows, rows)
    assert out["a"]["error_rate"] == 1.0
    assert out["a"]["cache_hit_ratio"] is None
    assert out["verdict"].startswith("B costs the same per request and is equally fast at p50")
