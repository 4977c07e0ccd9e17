"""Local models on demand: the pure residency policy (budget, LRU, idle deadlines) and the scheduler over a fake
effects interface. No processes, no sleeping: the clock is a number the test moves."""

from __future__ import annotations

import asyncio
import io
import struct
from pathlib import Path

import pytest

from coderouterd.state.events import ProcessEventName
from coderouterd.supervise.memory import (
    context_size,
    estimate_mb,
    kv_cache_bytes,
    missing,
    model_path,
    read_gguf_metadata,
)
from coderouterd.supervise.ondemand import IDLE, OnDemand, Rules, Settings, room_for
from coderouterd.supervise.residency import NoRoom, ResidencyPolicy, Resident
from coderouterd.upstream.lifecycle import Phase
from coderouterd.upstream.upstream import Lease


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def run(coro):
    return asyncio.run(coro)


class CountedPolicy(ResidencyPolicy):
    """The policy with requests in flight counted as the upstreams count them in production (upstream/upstream.py's
    Lease): one count per process, here a dict, which the policy only reads."""

    def __init__(self, budget_mb: float = 0.0, *, clock, min_resident_s: float = 0.0) -> None:
        self.counts: dict[str, int] = {}
        super().__init__(budget_mb, clock=clock, min_resident_s=min_resident_s,
                         in_flight=lambda name: self.counts.get(name, 0))

    def begin(self, name: str) -> bool:
        ok = super().begin(name)
        if ok:
            self.counts[name] = self.counts.get(name, 0) + 1
        return ok

    def end(self, name: str) -> None:
        self.counts[name] = max(0, self.counts.get(name, 0) - 1)
        super().end(name)


def policy(budget: float, *residents: Resident) -> tuple[ResidencyPolicy, Clock]:
    clock = Clock()
    p = CountedPolicy(budget, clock=clock)
    p.configure(residents, budget)
    return p, clock


# -- the budget -------------------------------------------------------------------------------------------------


def test_no_budget_never_stops_anything():
    p, _ = policy(0, Resident("a", 5000), Resident("b", 5000))
    assert p.victims("b", {"a"}) == []


def test_fits_without_stopping():
    p, _ = policy(10_000, Resident("a", 4000), Resident("b", 5000))
    assert p.victims("b", {"a"}) == []


def test_least_recently_used_is_stopped_first():
    p, clock = policy(10_000, Resident("a", 4000), Resident("b", 4000), Resident("c", 4000))
    p.begin("b"), p.end("b")
    clock.t += 1
    p.begin("a"), p.end("a")  # a is the most recent: b goes
    assert p.victims("c", {"a", "b"}) == ["b"]


def test_stops_as_many_as_needed_and_no_more():
    p, clock = policy(10_000, Resident("a", 3000), Resident("b", 3000), Resident("c", 3000), Resident("big", 7000))
    for n in ("a", "b", "c"):
        clock.t += 1
        p.touch(n)
    assert p.victims("big", {"a", "b", "c"}) == ["a", "b"]


def test_a_stopping_process_still_counts():
    # "holding" includes a process still stopping: the caller passes it, and it is not offered as a victim twice.
    p, _ = policy(8000, Resident("a", 5000), Resident("b", 5000))
    p.drain(["a"])
    assert p.held_mb({"a"}) == 5000
    assert p.victims("b", {"a"}) == ["a"]


def test_pinned_is_never_a_victim():
    p, clock = policy(10_000, Resident("a", 6000, pinned=True), Resident("b", 3000), Resident("c", 3000))
    p.touch("b")
    clock.t += 1
    p.touch("a")
    assert p.victims("c", {"a", "b"}) == ["b"]
    with pytest.raises(NoRoom, match="pinned a"):
        policy(8000, Resident("a", 6000, pinned=True), Resident("c", 3000))[0].victims("c", {"a"})


def test_external_processes_are_treated_like_pinned():
    p, _ = policy(8000, Resident("a", 6000), Resident("c", 3000))
    with pytest.raises(NoRoom, match=r"a \(6,000 MB\)"):
        p.victims("c", {"a"}, fixed={"a"})


def test_too_big_alone():
    p, _ = policy(4000, Resident("a", 5000))
    with pytest.raises(NoRoom, match="more than"):
        p.victims("a", set())


def test_a_draining_process_takes_no_request():
    p, _ = policy(0, Resident("a", 1))
    p.drain(["a"])
    assert p.begin("a") is False
    p.drained("a")
    assert p.begin("a") is True and p.in_flight("a") == 1


# -- idleness ---------------------------------------------------------------------------------------------------


def test_idle_deadline_counts_from_the_last_request_end():
    p, clock = policy(0, Resident("a", 1, idle_stop_s=60), Resident("b", 1))
    p.begin("a")
    clock.t += 100
    assert p.idle_due({"a", "b"}) == []  # busy: never idle
    p.end("a")
    assert p.idle_left("a") == 60
    clock.t += 59
    assert p.idle_due({"a"}) == []
    assert p.next_deadline({"a", "b"}) == clock.t + 1
    clock.t += 1
    assert p.idle_due({"a", "b"}) == ["a"]  # b has no idle stop
    assert p.idle_due(set()) == []  # not ready: nothing to stop


# -- the scheduler over fake effects ----------------------------------------------------------------------------


class FakeEffects:
    """Processes as a dict of states; starts and stops complete when the test lets them."""

    def __init__(self, names):
        self.state = dict.fromkeys(names, "stopped")
        self.sch: OnDemand | None = None  # the scheduler, whose upstreams hear the "supervisor's" events
        self.log: list[tuple] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.fail: dict[str, str] = {}
        self.max_held_together = 0
        self.ext: set[str] = set()

    def holding(self):
        return {n for n, s in self.state.items() if s not in ("stopped", "fatal")}

    def ready(self):
        return {n for n, s in self.state.items() if s == "ready"}

    def external(self):
        return self.ext

    def stopped(self, name):
        return self.state[name] == "stopped"

    def providers_of(self, name):
        return [f"prov-{name}"]

    def event(self, name, event):
        """What the supervisor tells the upstreams registry (supervise/from_config.Processes)."""
        if self.sch is not None:
            self.sch.upstreams.process_event(name, event, self.providers_of(name), "test", wait_s=30,
                                             on_demand=self.sch.on_demand(name))

    async def start(self, name, wait=True):
        self.log.append(("start", name))
        self.state[name] = "starting"
        self.max_held_together = max(self.max_held_together, len(self.holding()))
        gate = self.gates.get(name)
        if gate is not None:
            await gate.wait()
        if name in self.fail:
            self.state[name] = "fatal"
            self.event(name, ProcessEventName.FATAL)
            return self.fail[name]
        self.state[name] = "ready"
        self.event(name, ProcessEventName.READY)
        return None

    async def wait_ready(self, name):
        while self.state[name] == "starting":
            await asyncio.sleep(0)

    async def stop(self, name, reason):
        self.log.append(("stop", name, reason))
        self.state[name] = "stopping"
        await asyncio.sleep(0)
        self.state[name] = "stopped"
        self.event(name, ProcessEventName.STOPPED)

    def moved(self, up, old, new):
        """The upstreams' lifecycle moves the scheduler makes, as the log's words (routing hears them)."""
        name = up.name.removeprefix("prov-")
        if new is Phase.STARTING and "on demand" in up.life.why:
            self.log.append(("coming", name))
        elif new is Phase.DRAINING:
            self.log.append(("leaving", name, up.life.why.split("stopping: ", 1)[1].split(";")[0]))
        elif new is Phase.CANNOT_START:
            self.log.append(("cannot_start", name, up.life.why.split(" cannot start: ", 1)[1]))


class Requests:
    """The scheduler as the request path uses it: each request through a lease on its provider's upstream (which
    counts it in flight, the one count), everything else as it is."""

    def __init__(self, sch: OnDemand) -> None:
        self._sch = sch
        self._open: dict[str, list[Lease]] = {}

    def __getattr__(self, name):
        return getattr(self._sch, name)

    def begin(self, provider: str, turn=None) -> bool:
        lease = self._sch.upstreams.get(provider).lease()
        lease.turn = turn
        if not lease.begin():
            return False
        self._open.setdefault(provider, []).append(lease)
        return True

    def end(self, provider: str) -> None:
        self._open[provider].pop().end()


def scheduler(budget, residents, on_demand=("a", "b", "c"), stop_timeout_s=10.0, hold_s=0.0, min_resident_s=0.0):
    fx = FakeEffects([r.name for r in residents])
    clock = Clock()
    sch = OnDemand(fx, clock=clock, process_of=lambda p: p.removeprefix("prov-"), budget_mb=budget)
    fx.sch = sch
    sch.upstreams.watch(fx.moved)
    sch.configure(budget, {r.name: (r, Settings(on_demand=r.name in on_demand, stop_timeout_s=stop_timeout_s))
                           for r in residents}, Rules(hold_s=hold_s, min_resident_s=min_resident_s))
    # Stopped until a request needs it (the daemon says so at start: Processes.await_first_starts).
    for r in residents:
        sch.upstreams.stopped(fx.providers_of(r.name), r.name, on_demand=r.name in on_demand, first=True)
    return Requests(sch), fx, clock


async def started(sch, provider, *, background=False) -> bool:
    """A request's turn at a stopped process: True once the process came up for it. The turn is released at once
    (the request went elsewhere): nothing keeps the process for it."""
    turn = sch.demand(provider, background=background)
    ok = await turn.ready
    sch.release(turn)
    return ok


async def settle(n=30):
    for _ in range(n):
        await asyncio.sleep(0)


def test_demand_starts_once_for_every_request_that_asks():
    run(_test_demand_starts_once_for_every_request_that_asks())


async def _test_demand_starts_once_for_every_request_that_asks():
    sch, fx, _ = scheduler(0, [Resident("a", 1)])
    t1, t2 = sch.demand("prov-a"), sch.demand("prov-a")
    assert await t1.ready is True and await t2.ready is True
    assert fx.log[0] == ("coming", "a") and fx.log.count(("start", "a")) == 1
    assert sch.demand("prov-a") is None  # ready now: nothing to start
    assert sch.demand("prov-unknown") is None
    await sch.close()


def test_swap_stops_the_other_before_starting_never_both():
    run(_test_swap_stops_the_other_before_starting_never_both())


async def _test_swap_stops_the_other_before_starting_never_both():
    sch, fx, clock = scheduler(6000, [Resident("a", 4000), Resident("b", 4000)])
    assert await started(sch, "prov-a")
    clock.t += 1
    assert await started(sch, "prov-b")
    assert [e for e in fx.log if e[0] != "coming"][-3:] == [("leaving", "a", room_for("b")),
                                                           ("stop", "a", room_for("b")), ("start", "b")]
    assert fx.max_held_together == 1
    clock.t += 1
    assert await started(sch, "prov-a")  # stopped for room: started again by the next request, b making room
    assert fx.max_held_together == 1 and fx.state == {"a": "ready", "b": "stopped"}
    assert sch.swaps == 2
    await sch.close()


def test_requests_in_flight_finish_before_the_stop():
    run(_test_requests_in_flight_finish_before_the_stop())


async def _test_requests_in_flight_finish_before_the_stop():
    sch, fx, clock = scheduler(6000, [Resident("a", 4000), Resident("b", 4000)])
    assert await started(sch, "prov-a")
    assert sch.begin("prov-a")
    swap = sch.demand("prov-b")  # hold_s = 0: a foreground request stops a busy model at once
    await settle()
    assert ("stop", "a", room_for("b")) not in fx.log and fx.state["a"] == "ready"
    assert sch.begin("prov-a") is False  # draining: no new request goes there
    sch.end("prov-a")
    assert await swap.ready
    assert fx.state == {"a": "stopped", "b": "ready"}
    await sch.close()


def test_a_request_stuck_in_flight_is_bounded_by_the_stop_timeout():
    run(_test_a_request_stuck_in_flight_is_bounded_by_the_stop_timeout())


async def _test_a_request_stuck_in_flight_is_bounded_by_the_stop_timeout():
    sch, fx, _ = scheduler(6000, [Resident("a", 4000), Resident("b", 4000)], stop_timeout_s=0.05)
    assert await started(sch, "prov-a")
    assert sch.begin("prov-a")
    assert await asyncio.wait_for(started(sch, "prov-b"), 30)
    assert fx.state == {"a": "stopped", "b": "ready"}
    await sch.close()


def test_ready_processes_are_served_while_a_swap_waits():
    run(_test_ready_processes_are_served_while_a_swap_waits())


async def _test_ready_processes_are_served_while_a_swap_waits():
    sch, fx, _ = scheduler(9000, [Resident("a", 4000), Resident("b", 4000), Resident("c", 4000)])
    assert await started(sch, "prov-a") and await started(sch, "prov-b")
    fx.gates["c"] = asyncio.Event()
    swap = sch.demand("prov-c")
    await settle()
    assert fx.state["c"] == "starting" and sch._swap.locked()
    assert sch.begin("prov-b")  # b kept (a was older): served at once, no lock involved
    sch.end("prov-b")
    fx.gates["c"].set()
    assert await swap.ready
    await sch.close()


def test_no_room_is_said_to_routing_and_fails_the_start():
    run(_test_no_room_is_said_to_routing_and_fails_the_start())


async def _test_no_room_is_said_to_routing_and_fails_the_start():
    sch, fx, _ = scheduler(5000, [Resident("a", 4000, pinned=True), Resident("b", 4000)], on_demand=("b",))
    await sch.ensure("a")
    assert await started(sch, "prov-b") is False
    assert fx.log[-1][0:2] == ("cannot_start", "b") and "pinned a" in fx.log[-1][2]
    assert fx.state["a"] == "ready"
    await sch.close()


def test_a_fatal_start_is_said_and_not_restarted_by_requests():
    run(_test_a_fatal_start_is_said_and_not_restarted_by_requests())


async def _test_a_fatal_start_is_said_and_not_restarted_by_requests():
    sch, fx, _ = scheduler(0, [Resident("a", 1)])
    fx.fail["a"] = "model file 'x.gguf' not found"
    assert await started(sch, "prov-a") is False
    assert fx.log[-1] == ("cannot_start", "a", "model file 'x.gguf' not found")
    assert sch.demand("prov-a") is None  # fatal: only `corectl start` brings it back
    await sch.close()


def test_an_always_process_stopped_by_hand_stays_stopped_one_stopped_for_idleness_does_not():
    run(_test_an_always_process_stopped_by_hand_stays_stopped_one_stopped_for_idleness_does_not())


async def _test_an_always_process_stopped_by_hand_stays_stopped_one_stopped_for_idleness_does_not():
    sch, fx, _ = scheduler(0, [Resident("a", 1)], on_demand=())
    await sch.ensure("a")
    await sch.stop("a", "manual")
    assert sch.demand("prov-a") is None
    await sch.ensure("a")
    await sch.stop("a", IDLE)
    assert await started(sch, "prov-a") is True
    await sch.close()


def test_idle_stop_then_on_demand_start():
    run(_test_idle_stop_then_on_demand_start())


async def _test_idle_stop_then_on_demand_start():
    sch, fx, clock = scheduler(0, [Resident("a", 1, idle_stop_s=30)])
    assert await started(sch, "prov-a")
    sch.start_idle_watch()
    try:
        clock.t += 31
        sch._wake.set()  # the loop re-reads the clock: no sleeping for the deadline
        for _ in range(50):
            if fx.state["a"] == "stopped":
                break
            await asyncio.sleep(0)
        assert ("stop", "a", IDLE) in fx.log and fx.state["a"] == "stopped"
        assert await started(sch, "prov-a") is True and fx.state["a"] == "ready"
    finally:
        await sch.close()


def test_a_request_for_a_process_being_stopped_waits_for_the_stop_then_starts_it():
    run(_test_a_request_for_a_process_being_stopped_waits_for_the_stop_then_starts_it())


async def _test_a_request_for_a_process_being_stopped_waits_for_the_stop_then_starts_it():
    sch, fx, clock = scheduler(6000, [Resident("a", 4000), Resident("b", 4000)])
    assert await started(sch, "prov-a")
    assert sch.begin("prov-a")
    swap = sch.demand("prov-b")
    for _ in range(20):
        if sch._stopping("a"):
            break
        await asyncio.sleep(0)
    back = sch.demand("prov-a")  # a is draining for b: the request takes a turn at a's next start
    assert back is not None
    sch.end("prov-a")
    assert await swap.ready
    sch.release(swap)  # b's request begun and ended: a's turn comes
    assert await back.ready
    assert fx.state == {"a": "ready", "b": "stopped"} and fx.max_held_together == 1
    await sch.close()


def test_snapshot_shows_budget_held_and_idle_time():
    sch, fx, clock = scheduler(6000, [Resident("a", 4000, idle_stop_s=60)])
    fx.state["a"] = "ready"
    sch.policy.touch("a")
    clock.t += 10
    snap = sch.snapshot()
    assert snap["memory_budget_mb"] == 6000 and snap["memory_held_mb"] == 4000
    assert snap["processes"]["a"]["idle_stop_in_s"] == 50 and snap["processes"]["a"]["resident"]


# -- memory estimate and pre-flight -----------------------------------------------------------------------------


def _gguf(kv: dict) -> bytes:
    out = io.BytesIO()
    out.write(b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", 0, len(kv) + 1))

    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    out.write(s("tokenizer.ggml.tokens") + struct.pack("<I", 9) + struct.pack("<IQ", 8, 2) + s("a") + s("bc"))
    for k, v in kv.items():
        if isinstance(v, str):
            out.write(s(k) + struct.pack("<I", 8) + s(v))
        else:
            out.write(s(k) + struct.pack("<I", 4) + struct.pack("<I", v))
    return out.getvalue()


def test_gguf_header_gives_the_kv_cache_size(tmp_path):
    meta = {"general.architecture": "llama", "llama.block_count": 30, "llama.embedding_length": 576,
            "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3, "llama.context_length": 8192}
    read = read_gguf_metadata(io.BytesIO(_gguf(meta)))
    assert read["llama.block_count"] == 30 and "tokenizer.ggml.tokens" not in read
    # 2 (K, V) x 30 layers x ctx x 3 KV heads x 64 per head x 2 bytes
    assert kv_cache_bytes(read, 4096) == 2 * 30 * 4096 * 3 * 64 * 2
    assert kv_cache_bytes(read, 0) == 2 * 30 * 8192 * 3 * 64 * 2  # no -c: the model's trained context
    model = tmp_path / "m.gguf"
    model.write_bytes(_gguf(meta) + b"\0" * (3 * 1024 * 1024))
    cmd = ["llama-server", "--model", str(model), "-c", "4096"]
    assert model_path(cmd) == model and context_size(cmd) == 4096
    assert estimate_mb(cmd) == pytest.approx((model.stat().st_size + 2 * 30 * 4096 * 3 * 64 * 2) / 2**20, abs=0.1)
    assert estimate_mb(["ollama", "serve"]) == 0.0
    assert model_path(["python3", "-m", "server"]) is None  # python's -m names a module
    assert model_path(["python3", "-m", "server", "-m", "x.gguf"], "/w") == Path("/w/x.gguf")
    assert model_path(["vllm", "serve", "--model", "Qwen/Qwen3-8B"]) is None  # a hub name, not a file


def test_missing_binary_and_model_are_named(tmp_path):
    assert missing([str(tmp_path / "nope"), "-m", str(tmp_path / "m.gguf")]) == [
        f"binary {str(tmp_path / 'nope')!r} not found", f"model file {str(tmp_path / 'm.gguf')!r} not found"]
    assert missing(["no-such-binary-anywhere-xyz"]) == ["binary 'no-such-binary-anywhere-xyz' not found on PATH"]
    assert missing(["sh", "-c", "true"]) == []


# -- what routing and the client are told ------------------------------------------------------------------------


def test_a_process_that_cannot_start_is_down_not_coming_until_started_again():
    from coderouterd.config.schema import ConfigModel
    from coderouterd.routing.state import RoutingState

    cfg = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://127.0.0.1:1/v1"}},
                                      "profiles": {"default": {"providers": ["p"]}}})
    st = RoutingState(cfg)
    ups = st.upstreams
    ups.stopped(["p"], "x", on_demand=True, first=True)
    ups.cannot_start(["p"], "managed process x cannot start: model file 'm.gguf' not found")
    assert st.is_down("p") and ups.get("p").life.wait_s == 0 and not ups.get("p").lease().want()
    assert st.cannot_start_reason("p") == "managed process x cannot start: model file 'm.gguf' not found"
    ups.starting(["p"], "x", 30, "starting on demand")  # started again: it may come up this time
    assert st.cannot_start_reason("p") is None and ups.get("p").lease().want()
    ups.cannot_start(["p"], "again")
    ups.move(["p"], Phase.RESIDENT)
    assert st.cannot_start_reason("p") is None and not st.is_down("p")


@pytest.mark.parametrize(("ingress", "status", "kind"), [("anthropic", 500, "api_error"), ("openai", 500, "api_error"),
                                                         ("responses", 400, "invalid_request_error")])
def test_cannot_start_is_one_attempt_for_every_client(ingress, status, kind):
    from coderouterd.routing.planner import Skip
    from coderouterd.routing.replies import nothing_attempted

    why = "managed process x cannot start: binary 'llama-server' not found on PATH"
    r = nothing_attempted([Skip("p", "cannot_start", why, overridable=False)], ingress=ingress, profile="default",
                          summary="")
    assert (r.status, r.kind, r.headers, r.code) == (status, kind, {"x-should-retry": "false"},
                                                     "backend_cannot_start")
    assert why in r.message
    # Something else only waits (a breaker, a start under way): still "overloaded", worth a retry.
    r = nothing_attempted([Skip("p", "cannot_start", why), Skip("q", "not_ready", "starting")], ingress=ingress,
                          profile="default", summary="")
    assert r.status in (503, 529)


def test_a_start_by_hand_does_not_wait_but_idle_time_still_counts_from_readiness():
    run(_start_by_hand())


async def _start_by_hand():
    sch, fx, clock = scheduler(0, [Resident("a", 1, idle_stop_s=30)])
    fx.gates["a"] = asyncio.Event()

    async def slow_start(name, wait=True):  # the process takes its time: no readiness before the gate opens
        fx.state[name] = "starting"
        if wait:
            await fx.gates[name].wait()
            fx.state[name] = "ready"
        return None

    fx.start = slow_start
    await sch.ensure("a", wait=False)
    assert fx.state["a"] == "starting"
    clock.t += 100  # a long load
    fx.state["a"] = "ready"
    for _ in range(10):
        await asyncio.sleep(0)
    assert sch.policy.idle_left("a") == 30  # counted from readiness, not from the start's decision
    await sch.close()


def test_an_error_of_ours_during_a_start_is_a_failed_start_for_the_waiting_requests():
    run(_error_during_start())


async def _error_during_start():
    sch, fx, _ = scheduler(0, [Resident("a", 1)])

    async def broken(name, wait=True):
        raise RuntimeError("supervisor is shut down")

    fx.start = broken
    assert await started(sch, "prov-a") is False
    await sch.close()
