"""Retry-After from an upstream is untrusted input: whatever the header says, the parsed value is a finite number
of seconds between 0 and MAX_RETRY_AFTER_S (or None), and neither the client's answer nor the breaker breaks on it."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from coderouterd.providers.errors import MAX_RETRY_AFTER_S, parse_retry_after
from coderouterd.routing.replies import retry_after_value
from coderouterd.upstream.breaker import CircuitBreaker
from coderouterd.upstream.clock import ManualClock

_NASTY = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e20", "-5", "-0.001", "0",
          "99999999999999999999999", "  7 ", "7.5", "", " ", "soon", "0x10", "1_000", "\u0661\u0662"]
header_values = st.one_of(
    st.sampled_from(_NASTY),
    st.floats().map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(max_size=30),
)


def _check(value: float | None) -> None:
    assert value is None or (math.isfinite(value) and 0 <= value <= MAX_RETRY_AFTER_S), value


@settings(max_examples=400, deadline=None)
@given(seconds=header_values, ms=st.one_of(st.none(), header_values))
def test_any_retry_after_parses_to_a_bounded_finite_value(seconds, ms):
    headers = {"retry-after": seconds}
    if ms is not None:
        headers["retry-after-ms"] = ms
    value = parse_retry_after(headers)
    _check(value)
    if value:
        retry_after_value(value)  # the client's header is built from it: must not raise


def test_specific_values():
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    for bad in ("nan", "-inf", "-3", "soon"):
        assert parse_retry_after({"retry-after": bad}) is None, bad
    for huge in ("inf", "1e400", "1e20", "99999999999999999999999"):
        assert parse_retry_after({"retry-after": huge}) == MAX_RETRY_AFTER_S, huge
    # A bad millisecond value falls back to the seconds header.
    assert parse_retry_after({"retry-after-ms": "nan", "retry-after": "3"}) == 3.0


def test_http_date_form():
    soon = datetime.now(UTC) + timedelta(seconds=120)
    value = parse_retry_after({"retry-after": format_datetime(soon, usegmt=True)})
    assert value is not None and 100 <= value <= 121
    past = datetime.now(UTC) - timedelta(days=1)
    assert parse_retry_after({"retry-after": format_datetime(past, usegmt=True)}) == 0.0
    far = datetime(9999, 1, 1, tzinfo=UTC)
    assert parse_retry_after({"retry-after": format_datetime(far, usegmt=True)}) == MAX_RETRY_AFTER_S


@settings(max_examples=200, deadline=None)
@given(hint=st.floats())
def test_breaker_never_opens_longer_than_the_cap(hint):
    """Defence in depth: whatever reaches the breaker (a value persisted by an older daemon, a caller that did
    not parse), it never waits longer than the cap."""
    b = CircuitBreaker("p", failures=1, recovery_s=30, clock=ManualClock())
    b.record_failure(retry_after=hint)
    snap = b.snapshot()
    if snap["retry_in_s"] is not None:
        assert snap["retry_in_s"] <= max(30.0, MAX_RETRY_AFTER_S)
    restored = CircuitBreaker("p", failures=1, recovery_s=30, clock=ManualClock())
    restored.restore({**snap, "retry_in_s": 1e20, "retry_at": None})
    assert restored.snapshot()["retry_in_s"] <= MAX_RETRY_AFTER_S
