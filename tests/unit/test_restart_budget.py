"""The restart budget (supervise/restarts.py) on an injected clock: the back-off steps, the sliding window, the
limit that ends a crash loop, and the healthy period after which a crash starts the count again."""

from __future__ import annotations

import pytest

from coderouterd.supervise.restarts import RestartBudget
from coderouterd.supervise.spec import ProcessSpec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _budget(clock: Clock, **limits) -> RestartBudget:
    spec = ProcessSpec(name="p", command=["true"], **limits)
    return RestartBudget(spec, (1, 2, 4), clock)


def test_each_restart_waits_the_next_step_and_the_last_step_repeats():
    clock = Clock()
    budget = _budget(clock, max_restarts=5, restart_window_s=300)
    assert [budget.take(clock.now) for _ in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert budget.recent(clock.now) == 5


def test_the_limit_ends_a_crash_loop_without_spending_more():
    clock = Clock()
    budget = _budget(clock, max_restarts=2, restart_window_s=300)
    assert budget.take(clock.now) == 1.0
    assert budget.take(clock.now) == 2.0
    assert budget.take(clock.now) is None
    assert budget.recent(clock.now) == 2


def test_restarts_older_than_the_window_no_longer_count():
    clock = Clock()
    budget = _budget(clock, max_restarts=2, restart_window_s=60)
    budget.take(clock.now)
    clock.now += 30
    budget.take(clock.now)
    clock.now += 31  # the first is 61 s old, the second 31 s
    assert budget.recent(clock.now) == 1
    assert budget.take(clock.now) == 2.0  # the step follows the restarts still in the window


def test_clear_starts_the_count_again():
    clock = Clock()
    budget = _budget(clock, max_restarts=1)
    budget.take(clock.now)
    budget.clear()
    assert budget.recent(clock.now) == 0
    assert budget.take(clock.now) == 1.0


def test_a_process_proves_itself_after_the_healthy_period():
    clock = Clock()
    budget = _budget(clock, healthy_after_s=10)
    assert not budget.proved(None)  # not ready: nothing proved
    since = clock.now
    clock.now += 9.9
    assert not budget.proved(since)
    clock.now += 0.1
    assert budget.proved(since)


def test_without_a_healthy_period_the_longest_step_is_it():
    clock = Clock()
    budget = _budget(clock)
    since = clock.now
    clock.now += 3.9
    assert not budget.proved(since)
    clock.now += 0.1
    assert budget.proved(since)


def test_an_empty_backoff_is_refused():
    with pytest.raises(ValueError, match="at least one delay"):
        RestartBudget(ProcessSpec(name="p", command=["true"]), (), Clock())
