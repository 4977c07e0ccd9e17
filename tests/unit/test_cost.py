import pytest

from coderouterd.state.cost import cache_savings_usd, cost_usd

SONNET = {"input": 3.0, "output": 15.0, "cache_read": 0.30, "cache_write": 3.75}


def test_cost_from_anthropic_usage():
    usage = {
        "input_tokens": 1000,
        "output_tokens": 500,
        "cache_read_input_tokens": 10_000,
        "cache_creation_input_tokens": 2000,
    }
    expected = (1000 * 3.0 + 500 * 15.0 + 10_000 * 0.30 + 2000 * 3.75) / 1_000_000
    assert cost_usd(usage, SONNET) == pytest.approx(expected)
    assert cost_usd(usage, SONNET) == pytest.approx(0.021)


def test_free_and_missing_values():
    assert cost_usd({"input_tokens": 10**6, "output_tokens": 10**6}, {"input": 0.0, "output": 0.0}) == 0.0
    assert cost_usd({"input_tokens": 10**6}, {}) == 0.0
    assert cost_usd({"input_tokens": None, "output_tokens": 1_000_000}, SONNET) == pytest.approx(15.0)


def test_unknown_cache_prices_charge_as_plain_input():
    usage = {"cache_read_input_tokens": 1_000_000, "cache_creation_input_tokens": 1_000_000}
    assert cost_usd(usage, {"input": 2.0, "output": 8.0}) == pytest.approx(4.0)
    assert cache_savings_usd(usage, {"input": 2.0, "output": 8.0}) == 0.0


def test_cache_savings_are_net_of_write_premium():
    reads = {"cache_read_input_tokens": 1_000_000}
    assert cache_savings_usd(reads, SONNET) == pytest.approx(2.70)
    writes = {"cache_creation_input_tokens": 1_000_000}
    assert cache_savings_usd(writes, SONNET) == pytest.approx(-0.75)
    assert cache_savings_usd({"input_tokens": 5}, SONNET) == 0.0


def test_prices_from_an_object_with_attributes():
    class Prices:
        input = 1.0
        output = 2.0
        cache_read = 0.1
        cache_write = 1.25

    usage = {"input_tokens": 1_000_000, "output_tokens": 1_000_000, "cache_read_input_tokens": 1_000_000}
    assert cost_usd(usage, Prices()) == pytest.approx(3.1)
