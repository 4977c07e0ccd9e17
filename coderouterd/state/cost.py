"""Request cost from token usage and per-million-token prices.

Usage is Anthropic-shaped: `input_tokens` counts only uncached input, while
`cache_read_input_tokens` and `cache_creation_input_tokens` are billed separately.
Prices are USD per million tokens under the keys `input`, `output`, `cache_read`, `cache_write`
(a mapping, or any object with those attributes such as a config model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_PER = 1_000_000.0


def _price(prices: Any, name: str) -> float | None:
    value = prices.get(name) if isinstance(prices, Mapping) else getattr(prices, name, None)
    return None if value is None else float(value)


def _prices(prices: Any) -> tuple[float, float, float, float]:
    p_in = _price(prices, "input") or 0.0
    p_out = _price(prices, "output") or 0.0
    # An unknown cache price is charged at the plain input price: never report a discount that
    # nobody promised.
    p_read = _price(prices, "cache_read")
    p_write = _price(prices, "cache_write")
    return p_in, p_out, p_in if p_read is None else p_read, p_in if p_write is None else p_write


def _tokens(usage: Mapping[str, Any]) -> tuple[int, int, int, int]:
    return (
        int(usage.get("input_tokens") or 0),
        int(usage.get("output_tokens") or 0),
        int(usage.get("cache_read_input_tokens") or 0),
        int(usage.get("cache_creation_input_tokens") or 0),
    )


def cost_usd(usage: Mapping[str, Any], prices: Any) -> float:
    """USD charged for one request's usage."""
    if not prices:
        return 0.0
    p_in, p_out, p_read, p_write = _prices(prices)
    t_in, t_out, t_read, t_write = _tokens(usage)
    return (t_in * p_in + t_out * p_out + t_read * p_read + t_write * p_write) / _PER


def cache_savings_usd(usage: Mapping[str, Any], prices: Any) -> float:
    """Net USD saved by prompt caching versus sending every cached token as plain input.

    Cache writes usually cost more than plain input, so a request that only writes the cache
    has negative savings; the reads of later requests pay that back.
    """
    if not prices:
        return 0.0
    p_in, _, p_read, p_write = _prices(prices)
    _, _, t_read, t_write = _tokens(usage)
    return (t_read * (p_in - p_read) + t_write * (p_in - p_write)) / _PER
