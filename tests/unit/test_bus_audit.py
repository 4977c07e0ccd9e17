import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

import orjson

from coderouterd.state.audit import AuditLog, follow_audit, read_audit
from coderouterd.state.bus import EventBus
from coderouterd.state.events import (
    EVENT_TYPES,
    BreakerTransition,
    ConfigReloaded,
    Event,
    GuardFired,
    HealthTransition,
    PersistenceFault,
    ProfileSwitched,
    RecoveryProbe,
    RequestFinished,
)


@dataclass(slots=True)
class Routine(Event):
    """A routine, unaudited event, as many of the bus's are (the daemon's own are all richer)."""

    kind: ClassVar[str] = "test_routine"

    request_id: str
    provider: str
    reason: str


def _breaker(i, ts=None):
    kw = {} if ts is None else {"ts": ts}
    return BreakerTransition(f"p{i}", "closed", "open", reason=f"r{i}", **kw)


# ---- bus ------------------------------------------------------------------------------------


def test_many_publishes_reach_sinks_in_few_ordered_batches():
    bus = EventBus(flush_interval_s=0.01, max_batch=1000)
    batches = []
    bus.subscribe(lambda evs: batches.append(list(evs)))
    bus.start()
    try:
        for i in range(5000):
            bus.publish(Routine(f"r{i}", "p", "timeout"))
        assert bus.flush(timeout=5)
    finally:
        bus.stop()
    delivered = [e.request_id for b in batches for e in b]
    assert delivered == [f"r{i}" for i in range(5000)]
    assert len(batches) <= 10
    assert all(len(b) <= 1000 for b in batches)


def test_sinks_run_in_the_writer_thread_and_publish_never_waits_for_them():
    """10,000 publishes while the writer is held inside a sink: every one returns, and the writer is still held
    when they have (no timing: had publish waited for the writer, the loop could only end after the sink let go
    by its own timeout)."""
    bus = EventBus(flush_interval_s=0.005)
    inside, release, left = threading.Event(), threading.Event(), threading.Event()
    threads = set()

    def slow_sink(evs):
        threads.add(threading.current_thread().name)
        inside.set()
        release.wait(30)
        left.set()

    bus.subscribe(slow_sink)
    bus.start()
    try:
        bus.publish(Routine("first", "p", "x"))
        assert inside.wait(10)  # the writer is now stuck inside slow_sink
        for i in range(10_000):
            bus.publish(Routine(f"r{i}", "p", "x"))
        assert not left.is_set()
        assert bus.pending >= 10_000
    finally:
        release.set()
        bus.stop()
    assert threads == {"event-writer"}
    assert bus.pending == 0


def test_kind_filters_and_synchronous_sinks():
    bus = EventBus(flush_interval_s=10)
    health, counted, everything = [], [], []
    bus.subscribe(health.extend, kinds={"health_transition"})
    bus.subscribe(lambda evs: counted.append(len(evs)), kinds={Routine.kind}, in_thread=False)
    bus.subscribe(everything.extend)
    bus.start()
    try:
        bus.publish(HealthTransition("p", "up", "down"))
        bus.publish(Routine("r", "p", "x"))
        assert counted == [1]  # synchronous: seen before any flush
        assert everything == []
        bus.flush()
    finally:
        bus.stop()
    assert [e.kind for e in health] == ["health_transition"]
    assert len(everything) == 2


def test_a_raising_sink_does_not_stop_the_writer():
    bus = EventBus(flush_interval_s=0.005)
    good = []

    def bad(evs):
        raise RuntimeError("boom")

    bus.subscribe(bad)
    bus.subscribe(good.extend)
    bus.start()
    try:
        for round_ in range(3):
            bus.publish(Routine(f"r{round_}", "p", "x"))
            assert bus.flush()
        assert bus.running
    finally:
        bus.stop()
    assert [e.request_id for e in good] == ["r0", "r1", "r2"]
    assert sum(bus.sink_errors.values()) == 3


def test_stop_drains_everything_and_late_events_are_not_lost():
    bus = EventBus(flush_interval_s=60)
    got = []
    bus.subscribe(got.extend)
    bus.start()
    for i in range(100):
        bus.publish(Routine(f"r{i}", "p", "x"))
    bus.stop()
    assert len(got) == 100 and not bus.running
    bus.publish(Routine("late", "p", "x"))
    bus.flush()
    assert got[-1].request_id == "late"


def test_queue_is_bounded():
    bus = EventBus(max_queue=10)
    for i in range(15):
        bus.publish(Routine(f"r{i}", "p", "x"))
    assert bus.pending == 10 and bus.dropped == 5


def test_every_event_type_serialises_to_json():
    # attempt_failed was never produced: removed (issue 12); key, auth_refused, auth_throttled, key_rate_limited:
    # issue 41; slot_budget_too_small: issue 43
    assert len(EVENT_TYPES) == 26
    ev = GuardFired("r1", "loop", "block", {"repeats": 5})
    d = orjson.loads(orjson.dumps(ev.to_dict()))
    assert d["kind"] == "guard_fired" and d["detail"] == {"repeats": 5} and d["request_id"] == "r1"
    assert not Routine("r", "p", "x").audited
    assert not RequestFinished("r", "anthropic", "default", "p").audited
    assert RequestFinished("r", "anthropic", "default", "p", fallback_count=1).audited
    assert RequestFinished("r", "anthropic", "default", "p", status=502).audited
    for kind, cls in EVENT_TYPES.items():
        assert cls.kind == kind
        if cls not in (RequestFinished, RecoveryProbe):  # RecoveryProbe: routine, not audited
            assert cls.audited is True


# ---- audit ----------------------------------------------------------------------------------


def test_audit_keeps_only_audited_events_as_json_lines(tmp_path):
    log = AuditLog(tmp_path)
    ts = datetime(2025, 5, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    log.sink(
        [
            Routine("r0", "p", "x"),
            RequestFinished("r1", "openai", "default", "p"),
            RequestFinished("r2", "openai", "default", "p", fallback_count=2, ts=ts),
            ProfileSwitched("default", "coding", source="corectl", ts=ts),
        ]
    )
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    assert len(lines) == 2
    first = orjson.loads(lines[0])
    assert first["ts"] == "2025-05-01T12:00:00.000Z"
    assert first["kind"] == "request_finished" and first["request_id"] == "r2" and first["fallback_count"] == 2
    assert orjson.loads(lines[1])["new"] == "coding"
    log.close()


def test_rotation_keeps_n_files_and_reads_span_them(tmp_path):
    log = AuditLog(tmp_path, max_bytes=400, keep=2)
    base = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    for i in range(40):
        log.sink([_breaker(i, ts=base + i)])
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size <= 400 for p in tmp_path.iterdir())

    records = read_audit(tmp_path)
    providers = [r["provider"] for r in records]
    assert providers[-1] == "p39"
    # Oldest records fell off with the third rotation; what is left is contiguous and in order.
    first = int(providers[0][1:])
    assert first > 0 and providers == [f"p{i}" for i in range(first, 40)]

    assert [r["provider"] for r in read_audit(tmp_path, n=3)] == ["p37", "p38", "p39"]
    since = datetime(2025, 1, 1, 0, 0, 38, tzinfo=UTC)
    assert [r["provider"] for r in read_audit(tmp_path, since=since)] == ["p38", "p39"]
    assert read_audit(tmp_path, kind="config_reloaded") == []
    assert read_audit(tmp_path, n=0) == []


def test_read_audit_filters_kind_and_skips_torn_lines(tmp_path):
    log = AuditLog(tmp_path)
    log.sink([_breaker(1), ConfigReloaded("/c.toml", ["server.port"]), _breaker(2)])
    log.close()
    with open(tmp_path / "audit.jsonl", "ab") as f:
        f.write(b'{"ts": "2025-')  # a crash mid-line
    assert [r["kind"] for r in read_audit(tmp_path)] == ["breaker_transition", "config_reloaded", "breaker_transition"]
    assert [r["changed"] for r in read_audit(tmp_path, kind={"config_reloaded"})] == [["server.port"]]
    assert read_audit(tmp_path / "missing") == []


def test_follow_yields_new_records_across_rotation(tmp_path):
    log = AuditLog(tmp_path, max_bytes=300, keep=3)
    log.sink([_breaker(0)])  # before following: not yielded
    deadline = time.monotonic() + 30  # a ceiling that ends the follower if the test fails, not a measure
    follower = follow_audit(tmp_path, poll_s=0.005, stop=lambda: time.monotonic() > deadline)
    for i in range(1, 6):
        log.sink([_breaker(i)])
    assert (tmp_path / "audit.jsonl.1").exists()  # at least one rotation happened
    got = [next(follower)["provider"] for _ in range(5)]
    assert got == ["p1", "p2", "p3", "p4", "p5"]

    def later():
        time.sleep(0.05)
        log.sink([_breaker(6)])

    t = threading.Thread(target=later)
    t.start()
    assert next(follower)["provider"] == "p6"
    t.join()
    log.close()
    follower.close()


def test_unwritable_audit_dir_reports_once_and_catches_up(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    bus = EventBus()
    seen = []
    bus.subscribe(seen.extend)
    log = AuditLog(blocker / "audit", bus=bus)
    log.sink([_breaker(1)])
    log.sink([_breaker(2)])
    assert not log.healthy and log.problem
    bus.flush()
    faults = [e for e in seen if isinstance(e, PersistenceFault)]
    assert len(faults) == 1 and faults[0].component == "audit"

    blocker.unlink()
    log.sink([_breaker(3)])
    assert log.healthy
    assert [r["provider"] for r in read_audit(blocker / "audit")] == ["p1", "p2", "p3"]
    log.close()


def test_bus_to_audit_end_to_end(tmp_path):
    bus = EventBus(flush_interval_s=0.01)
    log = AuditLog(tmp_path)
    bus.subscribe(log.sink)
    bus.start()
    bus.publish(HealthTransition("ollama", "up", "down", reason="3 timeouts"))
    bus.publish(Routine("r", "ollama", "timeout"))
    bus.stop()
    log.close()
    assert [(r["kind"], r["reason"]) for r in read_audit(tmp_path)] == [("health_transition", "3 timeouts")]
