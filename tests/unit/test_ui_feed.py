"""The dashboard's live feed: nothing done while nobody watches, metadata only, and a slow browser loses events
(counted) instead of growing the daemon's memory."""

from __future__ import annotations

import asyncio
import threading

import orjson

from coderouterd.admin.apitype import FeedEvent
from coderouterd.state.bus import EventBus
from coderouterd.state.events import (
    BreakerTransition,
    BudgetBlocked,
    BudgetWarning,
    CacheBust,
    DriftAction,
    DriftDetected,
    DriftRecovered,
    GuardFired,
    HealthTransition,
    PersistenceFault,
    ProcessEvent,
    ProcessEventName,
    RequestFinished,
)
from coderouterd.ui.app import DashboardApp
from coderouterd.ui.feed import KINDS, LiveFeed, project


def _finished(i: int) -> RequestFinished:
    return RequestFinished(f"req-{i}", "anthropic", "default", "local", status=200, latency_ms=12.0,
                           session_key="client-conversation-key", attempts=[{"provider": "local", "message": "x"}])


def test_projection_carries_metadata_only():
    d = project(_finished(1))
    assert d["request_id"] == "req-1" and d["provider"] == "local" and d["kind"] == "request_finished"
    assert "attempts" not in d and "session_key" not in d
    assert project(PersistenceFault(component="journal", problem="disk full")) is None  # kinds not carried
    ev = ProcessEvent(provider="local", process="llama", event=ProcessEventName.READY, primary=False)
    assert project(ev) is None  # a process serving two providers is told once
    ev.primary = True
    assert project(ev)["event"] == "ready" and type(project(ev)["event"]) is str


def test_notable_events_are_kept_bounded_while_nobody_watches():
    feed = LiveFeed()
    loop = GuardFired(request_id="r-loop", guard="tool_loop", action="break",
                      detail={"tool": "Bash", "repeat_count": 5, "nested": {"x": 1}})
    drift = DriftDetected(provider="local", model="m", score=3.5)
    feed.sink([_finished(1), loop, drift, PersistenceFault(component="journal", problem="x")])
    got = feed.recent()
    assert [e["kind"] for e in got] == ["guard_fired", "drift_detected"]  # requests are the journal's to keep
    assert got[0]["detail"] == {"tool": "Bash", "repeat_count": 5}  # flat metadata only
    feed.sink([drift] * 200)
    assert len(feed.recent()) == 50 and feed._loop is None  # bounded, and still nothing for the loop to do


def test_no_viewer_means_no_work():
    feed = LiveFeed()
    calls = []
    feed._fanout = calls.append  # would be scheduled on the loop if anyone watched
    feed.sink([_finished(i) for i in range(100)])
    assert calls == [] and feed._loop is None


def test_events_reach_every_viewer_through_the_loop():
    async def go():
        feed = LiveFeed()
        a, b = feed.join(), feed.join()
        t = threading.Thread(target=feed.sink, args=([_finished(1), _finished(2)],))  # the writer thread
        t.start()
        t.join()
        await asyncio.wait_for(a.wake.wait(), 1)
        items, dropped = a.take()
        assert [i["request_id"] for i in items] == ["req-1", "req-2"] and dropped == 0
        assert len(b.queue) == 2
        feed.leave(a)
        feed.sink([_finished(3)])
        await asyncio.sleep(0)
        assert len(a.queue) == 0 and len(b.queue) == 3
    asyncio.run(go())


def test_a_viewer_that_never_reads_keeps_only_the_newest_and_counts_the_rest():
    async def go():
        feed = LiveFeed(queue_len=8)
        v = feed.join()
        for start in range(0, 1000, 50):
            feed.sink([_finished(i) for i in range(start, start + 50)])
        await asyncio.sleep(0)
        assert len(v.queue) == 8
        items, dropped = v.take()
        assert dropped == 992
        assert [i["request_id"] for i in items] == [f"req-{i}" for i in range(992, 1000)]
    asyncio.run(go())


def test_viewers_are_capped_and_close_ends_them():
    async def go():
        feed = LiveFeed(max_viewers=2)
        a, b = feed.join(), feed.join()
        assert feed.join() is None
        feed.close()
        assert a.closed and b.closed and a.wake.is_set()
        assert feed.join() is None  # a closing server takes no new stream
    asyncio.run(go())


class _Owner:
    """What DashboardApp._events reads of the daemon: its feed."""

    def __init__(self, feed: LiveFeed) -> None:
        self.live = feed


def test_a_stuck_browser_socket_holds_memory_at_the_queue_bound():
    """The stream's send blocks (a browser that stopped reading: the transport's buffer is full); events keep
    coming; what the daemon holds for that browser never exceeds the queue's bound."""

    async def go():
        feed = LiveFeed(queue_len=16)
        app = DashboardApp(_Owner(feed))
        stuck = asyncio.Event()
        sent = []

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body", b"").startswith(b"event:"):
                await stuck.wait()  # never set: the socket stays full

        task = asyncio.create_task(app._events({"headers": []}, send))
        while feed.viewers == 0:
            await asyncio.sleep(0)
        viewer = next(iter(feed._viewers))
        feed.sink([_finished(0)])
        for _ in range(5):
            await asyncio.sleep(0)
        for start in range(1, 5001, 100):
            feed.sink([_finished(i) for i in range(start, start + 100)])
            await asyncio.sleep(0)
            assert len(viewer.queue) <= 16
        assert viewer.dropped >= 5000 - 16
        feed.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert feed.viewers == 0  # leaving is not forgotten on the way out
    asyncio.run(go())


def test_the_feed_is_a_bus_subscriber_off_the_publishing_path():
    """publish() (the request path) only appends; the feed's sink runs in the bus's writer thread."""
    bus = EventBus(flush_interval_s=60)
    seen = []
    feed = LiveFeed()
    feed.sink = lambda events: seen.append(threading.current_thread().name)
    bus.subscribe(feed.sink)
    bus.start()
    try:
        bus.publish(_finished(1))
        assert seen == []
        assert bus.flush(5)
        assert seen == ["event-writer"]
    finally:
        bus.stop()


def test_the_daemon_does_not_load_the_dashboard_until_someone_asks_for_it():
    """Start-up and the proxy import only the feed (a bus subscriber); the page, its views and the journal's
    trend readers are imported by the first /ui request (ProxyApp.dashboard)."""
    import subprocess
    import sys

    code = ("import sys, coderouterd.serve, coderouterd.daemon, coderouterd.ingress.dispatch; "
            "print([m for m in ('coderouterd.ui.app', 'coderouterd.admin.history', 'coderouterd.state.trends') "
            "if m in sys.modules], 'coderouterd.ui.feed' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[] True", r.stdout + r.stderr


def test_every_kind_the_feed_carries_is_an_apitype_feed_event_written_as_the_model_writes_it():
    """The stream writes the projected dicts with orjson (cheaper on the loop than a model per item per viewer):
    each must be a valid FeedEvent, and the bytes must say what the model's own JSON says."""
    one_of_each = [
        _finished(1), BreakerTransition(provider="p", old="closed", new="open", reason="3 failures"),
        HealthTransition(provider="p", old="healthy", new="unhealthy", reason="probe failed"),
        CacheBust(request_id="r", provider="p", lane="l", session="s", segment="tools changed", cause="tools"),
        ProcessEvent(provider="p", process="llama", event=ProcessEventName.READY, pid=42, detail={"port": 8080}),
        GuardFired(request_id="r", guard="tool_loop", action="break", detail={"tool": "Bash"}),
        DriftDetected(provider="p", model="m", score=3.5), DriftAction(provider="p", model="m", action="reload"),
        DriftRecovered(provider="p", model="m"), BudgetWarning(provider="p", spent_usd=8.0, cap_usd=10.0, ratio=0.8),
        BudgetBlocked(provider="p", spent_usd=10.0, cap_usd=10.0),
    ]
    assert sorted(e.kind for e in one_of_each) == sorted(KINDS)
    for ev in one_of_each:
        item = project(ev)
        assert item is not None
        model = FeedEvent.model_validate(item)
        assert orjson.loads(orjson.dumps(item)) == orjson.loads(model.model_dump_json(by_alias=True)), ev.kind
