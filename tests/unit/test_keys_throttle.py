"""Repeated authentication failures: a growing, capped delay per source that decays; one audit line per episode;
other sources untouched; refusal audit lines folded to one per (reason, key, source) a minute."""

from __future__ import annotations

from coderouterd.keys.throttle import (
    FREE,
    HALF_LIFE_S,
    MAX_DELAY_S,
    MAX_SOURCES,
    REFUSAL_EVERY_S,
    REFUSAL_LINES_PER_MINUTE,
    FailureThrottle,
    RefusalLog,
    source_key,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_delay_grows_within_the_bound_and_one_episode_is_reported():
    clock = Clock()
    th = FailureThrottle(clock=clock)
    delays, episodes = [], []
    for _ in range(30):
        d, ep = th.failed("10.0.0.9")
        delays.append(d)
        if ep is not None:
            episodes.append(ep)
    assert delays[:int(FREE)] == [0.0] * int(FREE)  # a few typos cost nothing
    assert all(a <= b for a, b in zip(delays, delays[1:], strict=False))
    assert max(delays) == MAX_DELAY_S and delays[int(FREE)] > 0
    assert episodes == [int(FREE) + 1]  # one line for the episode, not one per failure
    assert th.delay("10.0.0.8") == 0.0  # another source is untouched


def test_the_score_decays_and_a_new_episode_is_reported_after():
    clock = Clock()
    th = FailureThrottle(clock=clock)
    for _ in range(20):
        th.failed("a")
    assert th.delay("a") == MAX_DELAY_S
    clock.t += HALF_LIFE_S * 6
    assert th.delay("a") < 0.2
    clock.t += HALF_LIFE_S * 10
    assert th.delay("a") == 0.0
    episodes = [ep for ep in (th.failed("a")[1] for _ in range(10)) if ep is not None]
    assert len(episodes) == 1


def test_the_table_is_bounded():
    clock = Clock()
    th = FailureThrottle(clock=clock)
    for i in range(MAX_SOURCES + 500):
        th.failed(f"s{i}")
    assert len(th) <= MAX_SOURCES


def test_refusal_lines_are_folded_per_minute():
    clock = Clock()
    log = RefusalLog(clock=clock)
    assert log.record("unknown", None, "a") == 0
    assert [log.record("unknown", None, "a") for _ in range(5)] == [None] * 5
    assert log.record("expired", "carol", "a") == 0  # another reason or key: its own line
    assert log.record("unknown", None, "b") == 0
    clock.t += REFUSAL_EVERY_S
    assert log.record("unknown", None, "a") == 5  # the folded ones, counted on the next line


def test_many_sources_at_once_write_a_bounded_number_of_lines():
    clock = Clock()
    log = RefusalLog(clock=clock)
    written = [log.record("unknown", None, f"10.0.{i // 250}.{i % 250}") for i in range(1000)]
    assert sum(1 for w in written if w is not None) == REFUSAL_LINES_PER_MINUTE
    clock.t += 60
    assert log.record("unknown", None, "192.0.2.1") == 1000 - REFUSAL_LINES_PER_MINUTE  # the rest, counted


def test_an_ipv6_source_counts_as_its_64():
    clock = Clock()
    th = FailureThrottle(clock=clock)
    for i in range(20):
        th.failed(f"2001:db8:1:2::{i:x}")  # a new address per guess, one /64
    assert th.delay("2001:db8:1:2::ffff") == MAX_DELAY_S
    assert th.delay("2001:db8:1:3::1") == 0.0
    assert source_key("2001:db8:1:2:aa::1") == "2001:db8:1:2::/64" and source_key("10.0.0.1") == "10.0.0.1"
