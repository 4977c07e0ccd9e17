import orjson
import pytest

from coderouterd.upstream.breaker import BreakerRegistry, BreakerState, CircuitBreaker
from coderouterd.upstream.clock import ManualClock, SystemClock


def make(failures=3, recovery_s=30.0):
    clock = ManualClock()
    events = []
    breaker = CircuitBreaker(
        "p",
        failures=failures,
        recovery_s=recovery_s,
        clock=clock,
        on_transition=lambda name, old, new, why: events.append((name, old, new, why)),
    )
    return breaker, clock, events


def test_manual_clock_advances_and_refuses_to_go_back():
    clock = ManualClock(start=5.0)
    clock.advance(2.5)
    assert clock.now() == 7.5
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert SystemClock().now() <= SystemClock().now()


def test_full_cycle_closed_open_half_open_closed():
    b, clock, events = make()
    assert b.state is BreakerState.CLOSED and b.allow()
    b.record_failure(reason="connect refused")
    b.record_failure(reason="connect refused")
    assert b.state is BreakerState.CLOSED
    b.record_failure(reason="connect refused")
    assert b.state is BreakerState.OPEN
    assert not b.allow()
    clock.advance(29.9)
    assert b.state is BreakerState.OPEN and not b.allow()
    clock.advance(0.1)
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED
    assert b.consecutive_failures == 0
    assert [(old, new) for _, old, new, _ in events] == [
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.HALF_OPEN),
        (BreakerState.HALF_OPEN, BreakerState.CLOSED),
    ]
    assert "3 consecutive failures: connect refused" in events[0][3]
    assert all(name == "p" for name, *_ in events)


def test_success_resets_the_consecutive_count():
    b, _, _ = make()
    b.record_failure()
    b.record_failure()
    b.record_success()
    b.record_failure()
    b.record_failure()
    assert b.state is BreakerState.CLOSED


def test_neutral_outcome_does_not_count_or_reset():
    b, _, _ = make()
    b.record_failure()
    b.record_failure()
    b.record_neutral()
    b.record_failure()
    assert b.state is BreakerState.OPEN


def test_half_open_admits_exactly_one_trial_under_many_callers():
    b, clock, _ = make()
    for _ in range(3):
        b.record_failure()
    clock.advance(30)
    admitted = [b.allow() for _ in range(50)]
    assert admitted.count(True) == 1 and admitted[0] is True
    assert b.snapshot()["trial_in_flight"] is True


@pytest.mark.parametrize(
    "outcome, state_after, next_allow",
    [
        ("success", BreakerState.CLOSED, True),
        ("failure", BreakerState.OPEN, False),
        ("release", BreakerState.HALF_OPEN, True),
        ("neutral", BreakerState.HALF_OPEN, True),
    ],
)
def test_half_open_trial_outcomes(outcome, state_after, next_allow):
    b, clock, _ = make()
    for _ in range(3):
        b.record_failure()
    clock.advance(30)
    assert b.allow()
    assert not b.allow()
    {
        "success": b.record_success,
        "failure": b.record_failure,
        "release": b.release,
        "neutral": b.record_neutral,
    }[outcome]()
    assert b.state is state_after
    assert b.allow() is next_allow


def test_failed_trial_reopens_for_twice_as_long():
    b, clock, events = make()
    for _ in range(3):
        b.record_failure()
    clock.advance(30)
    assert b.allow()
    b.record_failure(reason="HTTP 503")
    assert events[-1][2] is BreakerState.OPEN and "trial request failed: HTTP 503" in events[-1][3]
    assert "out for 60s (ejection 2)" in events[-1][3]
    clock.advance(59)
    assert b.state is BreakerState.OPEN
    clock.advance(1)
    assert b.state is BreakerState.HALF_OPEN


def test_ejection_time_grows_with_each_failed_trial_up_to_the_cap_and_resets_after_a_healthy_period():
    """Issue 25: a flapping upstream is not tried every recovery_s for ever. Ejections last 30, 60, 120, 240 s,
    then the cap (300 s); a success closes it, and once it stayed closed as long as its last ejection the next
    one starts at 30 s again (a failure sooner continues the series)."""
    clock = ManualClock()
    b = CircuitBreaker("p", failures=1, recovery_s=30.0, max_recovery_s=300.0, clock=clock)
    b.record_failure()
    outs = []
    for _ in range(6):
        outs.append(b.retry_in_s)
        clock.advance(b.retry_in_s)
        assert b.allow()  # the trial
        b.record_failure()
    assert outs == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0]
    assert b.ejections == 7
    clock.advance(b.retry_in_s)
    assert b.allow()
    b.record_success()  # the trial succeeds: closed
    clock.advance(100)  # not as long as its last ejection (300 s): a new failure continues the series
    b.record_failure()
    assert b.retry_in_s == 300.0
    clock.advance(300)
    assert b.allow()
    b.record_success()
    clock.advance(300)  # healthy as long as it was last out
    b.record_failure()
    assert b.retry_in_s == 30.0 and b.ejections == 1


def test_ejections_survive_a_restart_and_a_verified_recovery_resets_them():
    clock = ManualClock()
    b = CircuitBreaker("p", failures=1, recovery_s=30.0, max_recovery_s=300.0, clock=clock)
    b.record_failure()
    clock.advance(30)
    assert b.allow()
    b.record_failure()  # second ejection: 60 s
    again = CircuitBreaker("p", failures=1, recovery_s=30.0, max_recovery_s=300.0, clock=clock)
    again.restore(orjson.loads(orjson.dumps(b.snapshot())))
    assert again.ejections == 2 and again.retry_in_s == 60.0
    clock.advance(60)
    assert again.allow()
    again.record_failure()
    assert again.retry_in_s == 120.0
    again.reset("probe after restart")  # someone who knows verified it
    again.record_failure()
    assert again.retry_in_s == 30.0


def test_retry_after_opens_before_failure_count_is_reached():
    b, clock, events = make()
    b.record_failure(retry_after=10, reason="HTTP 429")
    assert b.state is BreakerState.OPEN
    assert "retry-after 10s" in events[0][3]
    assert b.retry_in_s == pytest.approx(10)
    clock.advance(9.9)
    assert b.state is BreakerState.OPEN
    clock.advance(0.1)
    # Opened by the retry-after alone: once it passed the breaker closes without a trial (nothing failed that a
    # trial would have to disprove), and every request may go.
    assert b.state is BreakerState.CLOSED
    assert events[-1][3] == "retry-after elapsed"
    assert b.allow() and b.allow()
    assert b.consecutive_failures == 0


def test_retry_after_only_breaker_survives_a_restart_as_such():
    b, clock, _ = make()
    b.record_failure(retry_after=5)
    b2, _clock2, _ = make()
    b2._clock = clock
    b2.restore(b.snapshot())
    clock.advance(5)
    assert b2.state is BreakerState.CLOSED


def test_a_real_failure_while_open_on_a_retry_after_needs_a_trial():
    b, clock, _ = make()
    b.record_failure(retry_after=5)
    b.record_failure()  # a failure without a hint: the backend is failing, not merely asking us to wait
    clock.advance(5)
    assert b.state is BreakerState.HALF_OPEN


def test_retry_after_longer_than_recovery_wins():
    b, clock, _ = make(recovery_s=30)
    b.record_failure()
    b.record_failure()
    b.record_failure(retry_after=120)
    clock.advance(30)
    assert b.state is BreakerState.OPEN
    clock.advance(89.9)
    assert b.state is BreakerState.OPEN
    clock.advance(0.1)
    assert b.state is BreakerState.HALF_OPEN


def test_retry_after_shorter_than_recovery_does_not_shorten_threshold_open():
    b, clock, _ = make(recovery_s=30)
    b.record_failure()
    b.record_failure()
    b.record_failure(retry_after=5)
    clock.advance(5)
    assert b.state is BreakerState.OPEN
    clock.advance(25)
    assert b.state is BreakerState.HALF_OPEN


def test_retry_after_while_open_only_extends():
    b, clock, _ = make(recovery_s=30)
    for _ in range(3):
        b.record_failure()
    clock.advance(10)
    b.record_failure(retry_after=5)  # ends earlier than the current open period: ignored
    b.record_failure(retry_after=60)  # a late 429 from an in-flight request: extends
    clock.advance(59.9)
    assert b.state is BreakerState.OPEN
    clock.advance(0.1)
    assert b.state is BreakerState.HALF_OPEN


@pytest.mark.parametrize("hint", [0, -3, float("nan"), float("inf"), None])
def test_useless_retry_after_is_ignored(hint):
    b, _, _ = make()
    b.record_failure(retry_after=hint)
    assert b.state is BreakerState.CLOSED


def test_late_success_while_open_does_not_close():
    b, _, _ = make()
    for _ in range(3):
        b.record_failure()
    b.record_success()
    assert b.state is BreakerState.OPEN


def test_hook_errors_do_not_break_routing():
    def boom(*_):
        raise RuntimeError("audit down")

    b = CircuitBreaker("p", failures=1, clock=ManualClock(), on_transition=boom)
    b.record_failure()
    assert b.state is BreakerState.OPEN


def test_snapshot_is_json_and_restore_rebases_on_the_new_clock():
    b, clock, _ = make()
    for _ in range(3):
        b.record_failure()
    clock.advance(10)
    snap = orjson.loads(orjson.dumps(b.snapshot()))
    assert snap["state"] == "open"
    assert snap["consecutive_failures"] == 3
    assert snap["retry_in_s"] == pytest.approx(20)
    assert snap["retry_at"] == pytest.approx(clock.wall() + 20)
    assert snap["opened_at"] == pytest.approx(clock.wall() - 10)
    assert snap["trial_in_flight"] is False

    # A new process: unrelated monotonic origin, wall clock 5 s later.
    new_clock = ManualClock(start=3.0, wall_start=clock.wall() + 5)
    events = []
    restored = CircuitBreaker("p", clock=new_clock, on_transition=lambda *a: events.append(a))
    restored.restore(snap)
    assert restored.state is BreakerState.OPEN
    assert restored.retry_in_s == pytest.approx(15)  # the 5 s of downtime counted
    new_clock.advance(15)
    assert restored.state is BreakerState.HALF_OPEN
    assert restored.allow()
    assert events == [("p", BreakerState.OPEN, BreakerState.HALF_OPEN, "recovery time elapsed")]


def test_restore_after_long_downtime_goes_half_open_and_backward_wall_does_not_extend():
    b, clock, _ = make()
    for _ in range(3):
        b.record_failure()
    snap = b.snapshot()

    late = ManualClock(start=0.0, wall_start=clock.wall() + 3600)
    r = CircuitBreaker("p", clock=late)
    r.restore(snap)
    assert r.state is BreakerState.HALF_OPEN

    skewed = ManualClock(start=0.0, wall_start=clock.wall() - 3600)
    r2 = CircuitBreaker("p", clock=skewed)
    r2.restore(snap)
    assert r2.retry_in_s == pytest.approx(30)


def test_restore_half_open_frees_the_trial_slot():
    b, clock, _ = make()
    for _ in range(3):
        b.record_failure()
    clock.advance(30)
    assert b.allow()
    snap = b.snapshot()
    assert snap["state"] == "half_open" and snap["trial_in_flight"] is True
    r = CircuitBreaker("p", clock=ManualClock())
    r.restore(snap)
    assert r.state is BreakerState.HALF_OPEN
    assert r.allow() and not r.allow()


@pytest.mark.parametrize(
    "snap",
    [
        {"state": "melted"},
        {"state": "open", "consecutive_failures": -1},
        {"state": "open", "retry_in_s": "soon"},
        {"state": "closed", "consecutive_failures": True},
        "open",
    ],
)
def test_restore_rejects_malformed_snapshots_without_changing_state(snap):
    b, _, _ = make()
    b.record_failure()
    with pytest.raises(ValueError):
        b.restore(snap)
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 1


def test_registry_shares_breakers_configures_and_round_trips():
    clock = ManualClock()
    seen = []
    reg = BreakerRegistry(failures=2, recovery_s=10, clock=clock, on_transition=lambda *a: seen.append(a))
    assert reg.get("a") is reg.get("a")
    reg.get("a").record_failure()
    reg.get("a").record_failure()
    assert reg.get("a").state is BreakerState.OPEN
    assert seen[0][:3] == ("a", BreakerState.CLOSED, BreakerState.OPEN)

    reg.configure(failures=5, recovery_s=60)
    assert reg.get("a").failures == 5 and reg.get("a").recovery_s == 60
    assert reg.get("a").state is BreakerState.OPEN  # configuration does not reset state
    assert reg.get("b").failures == 5

    data = orjson.loads(orjson.dumps(reg.snapshot()))
    assert set(data) == {"a", "b"}
    reg2 = BreakerRegistry(clock=ManualClock(wall_start=clock.wall()))
    assert reg2.restore(data) == []
    assert reg2.get("a").state is BreakerState.OPEN
    assert reg2.get("b").state is BreakerState.CLOSED
    assert set(reg2.names()) == {"a", "b"} and "a" in reg2


def test_registry_restore_skips_bad_entries():
    reg = BreakerRegistry(clock=ManualClock())
    rejected = reg.restore({"good": {"state": "open", "retry_in_s": 5}, "bad": {"state": "??"}})
    assert rejected == ["bad"]
    assert reg.get("good").state is BreakerState.OPEN
    assert reg.get("bad").state is BreakerState.CLOSED
    assert reg.restore(["not", "a", "dict"]) == []


@pytest.mark.parametrize("kwargs", [{"failures": 0}, {"recovery_s": 0}])
def test_invalid_parameters(kwargs):
    with pytest.raises(ValueError):
        CircuitBreaker("p", **kwargs)
    with pytest.raises(ValueError):
        BreakerRegistry().configure(kwargs.get("failures", 3), kwargs.get("recovery_s", 30))
