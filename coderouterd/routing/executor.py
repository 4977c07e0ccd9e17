"""Serving one request: try the planned providers in order (fallback), stream the winner to the client.

A streaming request holds its HTTP status until the first upstream event or `stream_hold_s`, whichever comes
first, so that an early failure is still a real HTTP error or a silent failover. After that the client has a
200 and gets `ping`s while the upstream is silent; a provider that fails before producing content can still be
replaced by the next one. Once content has been sent the request cannot move: the client gets a well-formed
error event and a clean end.

Serve the user first: when every provider was skipped only for transient reasons (breaker open, excluded as
unhealthy), the request is tried on them anyway, best first, and each such attempt is marked `panic` (Envoy's
panic threshold). A profile with `panic = false` gets the fast 529/503 instead.

The client is reached only through a `ClientSink` (routing/sink.py); race mode (routing/race.py) uses the same
public steps as fallback: `open_slot`, `new_call`, `holding`, `first_output`, `failed`, `lost`, `deliver_*`,
`ends_request`, `send_failure`, and the one try-in-order routine, `try_in_order`.

The Exchange is the routine; what the request did is its `record` (routing/record.py), written through the
record's methods and handed to the observers once the answer is out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import orjson

from ..providers.call import Call
from ..providers.errors import BUDGET, BUDGET_FINAL, IDLE_TIMEOUT, OVERFLOW, TOTAL_TIMEOUT, UpstreamError
from ..translate.answer_stats import client_limit, cut_usage, without_client_cut
from ..translate.images import omit_images
from ..translate.tool_repair import repair_tools_for
from ..wire.errors import error_kind
from . import replies
from .attempts import Outcome
from .availability import Code
from .planner import Skip
from .record import CLIENT_DISCONNECTED, RequestRecord
from .request import ClientRequest
from .sink import ClientGone, ClientSink, StreamOpening
from .starts import Starts, died_under
from .steps import Slot

if TYPE_CHECKING:
    from .exchange_router import CallFactory, ExchangeRouter
    from .generation import Generation


class Exchange:
    """The life of one client request across its attempts: the routine. What it did goes into `self.record`."""

    __slots__ = ("req", "_before_upstream", "_call_factory", "sink", "runtime", "router", "profile_name",
                 "profile", "server", "record", "budget_final", "committed", "_panicked", "starts")

    def __init__(self, req: ClientRequest, sink: ClientSink, *, runtime: Generation, router: ExchangeRouter,
                 profile: str, call_factory: CallFactory = Call,
                 before_upstream: Callable[[], None] | None = None) -> None:
        """`call_factory(provider, strategy, raw_body=, stream=, client_headers=)` makes one upstream call;
        tests give a scripted one. `before_upstream()` is called just before each wait on an upstream (the
        daemon runs its deferred bookkeeping there, see after_response.py)."""
        self.req = req
        self._before_upstream = before_upstream
        self._call_factory = call_factory
        self.sink = sink
        self.runtime = runtime
        self.router: ExchangeRouter = router
        self.profile_name = profile
        # The request's inputs (req, runtime, profile) are the record's too: it is what observers read.
        self.record = record = RequestRecord(req, runtime, profile)
        self.profile = record.profile
        self.server = runtime.config.server
        self.budget_final: dict[str, str] = {}  # provider -> why its budget refused this request until the reset
        self.committed = False
        self._panicked: list[Skip] = []  # the transient skips panic mode overrode
        # Our leases on the processes being started for us (on demand), starting, or restarting after one died
        # under an attempt (routing/starts.py): the one way this request waits for a process
        self.starts = Starts(self)

    def _record(self, slot: Slot, outcome: Outcome, reason: str, status: int | None = None,
                message: str = "") -> None:
        self.record.attempted(slot.name, outcome, reason, status, slot.started, message, slot.panic)

    # -- main loop ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.starts.give_back()

    async def _run(self) -> None:
        record = self.record
        plan, ticket = await self.router.route(self.profile_name, self.profile, self.runtime, self.req)
        record.set_affinity(ticket)
        record.planned(plan)
        errors: list[UpstreamError] = []
        names = list(plan.candidates)
        starts = self.starts
        starts.demand(plan.skips, ahead_of=names)
        # "wait" holds for background requests too: it says the data stays here, or that the remote costs.
        if starts and self.profile.on_demand_start == "wait":
            ahead = starts.ahead(names)
            if ahead and await starts.wait(ahead, errors):
                return
        if self.profile.mode == "race" and len(names) > 1:
            from .race import run_race  # local import: race mode is the exception, not the hot path

            rest = await run_race(self, names, errors)
            if rest is None:
                return
            record.race_unwon(more_to_try=bool(rest))
            names = rest
        if names and await self.try_in_order(names, errors):
            return
        if not record.attempts and self._enter_panic():
            if await self.try_in_order(self._panic_order(), errors):
                return
        # Failover first, then the local model started for this request (or one the supervisor is starting or
        # restarting): it is waited for only when nothing else served (on_demand_start = "failover", the
        # default). Those behind the candidates are wanted now, and those whose process died under an attempt
        # are tried once more when it is back.
        starts.demand(plan.skips)
        if starts.died:
            await starts.restarts()
        if starts and await starts.wait(list(starts.leases), errors):
            return
        await self.conclude(errors)

    async def try_in_order(self, names: list[str], errors: list[UpstreamError]) -> bool:
        """The one fallback routine (fallback mode, and what race mode tries after its race): each provider in
        turn until one serves the request or a failure ends it. True when the client has been answered; False
        when every provider failed or was skipped (then `conclude` answers, with `errors` collected here)."""
        for i, name in enumerate(names):
            slot = await self.open_slot(name)
            if slot is None:
                continue
            with self.holding(slot):
                try:
                    await self.serve(slot)
                    return True
                except UpstreamError as e:
                    self.failed(slot, e)
                    errors.append(e)
                    if self.ends_request(e, names[i + 1:]):
                        await self.send_failure(e)
                        return True
        return False

    # -- panic ----------------------------------------------------------------------------------------------

    def _enter_panic(self) -> bool:
        if not self.profile.panic:
            return False
        transient = [s for s in self.record.skips if s.transient]
        if not transient:
            return False
        self._panicked = transient
        self.record.panicked(transient)
        return True

    def _panic_order(self) -> list[str]:
        return self.router.panic_order([s.provider for s in self._panicked])

    # -- one attempt ----------------------------------------------------------------------------------------

    async def open_slot(self, name: str) -> Slot | None:
        """Admit an attempt at `name` through its lease (breaker, then budget, then counted in flight), or record
        why it is skipped and return None."""
        provider = self.runtime.providers[name]
        panic = self.record.panic
        # (Whether the request is a background one matters only to a start: asked when one is wanted: starts.py.)
        lease = self.starts.leases.get(name) or self.router.lease(name)
        admission = lease.admit(panic)
        if admission is None:
            why = self.router.availability(name)
            self.record.skipped(Skip(name, "breaker_open", f"{name}: {why.words}" if not why.available else
                                     f"{name}: its breaker refused the attempt", retry_in_s=why.retry_in_s))
            return None
        slot = Slot(provider, admission, time.monotonic(), lease, panic=panic)
        try:
            slot.reservation = await self.router.reserve(provider, self.req)
        except UpstreamError as e:
            lease.release_trial()  # a refused reservation is a budget gate, not a failure
            if e.reason != BUDGET:
                raise
            self.record.skipped(Skip(name, "budget", e.message))
            if e.error_type == BUDGET_FINAL:
                self.budget_final[name] = e.message
            return None
        except BaseException:
            # Cancelled (client gone) while a shared ledger answered: the trial slot is not ours to keep.
            lease.release_trial()
            raise
        if not lease.begin():
            # Its process is being stopped (idle, or to make room): not its failure; we take a turn for its next
            # start, and are served then.
            lease.release_trial()
            self.router.settle(slot.reservation, provider, None)
            self.record.skipped(Skip(name, "not_ready", f"{name}'s managed process is stopping", overridable=False))
            self.starts.again(name, lease)
            return None
        return slot

    def holding(self, slot: Slot) -> _Holding:
        """`with ex.holding(slot):` — every exit path of an attempt gives back what it holds: a half-open trial
        slot is released unless the attempt reported success or failure (cancellation, a client gone, our own
        exception), the budget reservation is settled, the upstream connection is closed."""
        return _Holding(self, slot)

    def _abandon(self, slot: Slot, outcome: Outcome, reason: str, message: str = "") -> None:
        if slot.done:
            return
        slot.done = True
        slot.lease.release_trial()
        self._record(slot, outcome, reason, message=message)

    def _close_slot(self, slot: Slot) -> None:
        call = slot.call
        try:
            slot.lease.end()  # out of the in-flight count (a stop waiting for it may go on)
            placing = self.router.placement
            if slot.placement is not None and call is not None and placing is not None:
                placing.finish(self.record.affinity, slot.placement, slot.provider, ok=slot.ok,
                               strategy=call.strategy, request_id=self.req.request_id)
                slot.placement = None
            if call is not None:
                call.close()
                self.record.waited_upstream(call.wait_s)
                slot.call = None
            if not slot.done:  # e.g. a race participant dropped without a verdict
                slot.done = True
                slot.lease.release_trial()
        finally:
            # Whatever failed above, the reservation is settled: one left open lowers what is left of the cap for
            # every request after it (issue 41).
            self._settle_slot(slot, call)

    def _settle_slot(self, slot: Slot, call: Call | None) -> None:
        """Settle the attempt's reservation with what it cost. A stream cut before its end (the client left, the
        upstream broke) was billed for what the upstream produced: the upstream's count where it covers it, else
        our estimate; when that attempt is what ended the request, the record (the journal) says so too."""
        usage = slot.bill
        if usage is None and call is not None:
            st = call.strategy
            if slot.ok:
                usage = st.usage
            elif st.started_content or st.produced.chars or st.produced.reported:
                # (reported: the upstream counted the prompt it read before any content; it bills that too)
                usage, estimated = cut_usage(st.produced, st.usage or {},
                                             slot.provider.estimate_tokens(call.request_chars or len(self.req.raw)))
                record = self.record
                if record.status and record.served_by is None and record.answered_by in (None, slot.name):
                    record.cut(slot.name, usage, estimated)
        if slot.reservation is None:
            return
        try:
            settled = self.router.settle(slot.reservation, slot.provider, usage)
        finally:
            slot.reservation = None
        if settled is not None:
            self.record.settled(settled)

    def new_call(self, slot: Slot, model: str) -> Call:
        """An attempt at the slot's provider, translating between the client's wire and the provider's as needed.
        After a commit, a sink that opened the stream itself already sent the opening: the upstream's is dropped."""
        req = self.req
        provider = slot.provider
        body, raw = req.body, req.raw
        ticket = self.record.affinity
        placing = self.router.placement
        if ticket is not None and placing is not None:
            body, raw = placing.body_for(ticket, provider, req)
        if provider.cfg.capabilities.vision is False and req.has_images():
            body, omitted = omit_images(req.ingress, body, f"[image omitted: {provider.name} does not accept "
                                                           "images]")
            if omitted:
                raw = orjson.dumps(body)
                self.record.note({"provider": provider.name, "moved": "none", "images_omitted": omitted,
                                  "why": f"{omitted} image(s) replaced by a text note: {provider.name} has "
                                         "capabilities.vision = false"})
        cls = provider.adapter.strategy_for(req.ingress)
        # Any: which keywords a strategy takes depends on its class (native for Responses, signatures for an
        # Anthropic passthrough, ...); each class's own signature is what checks them.
        kw: dict[str, Any] = {"model": model, "skip_prologue": self.committed and self.sink.opens_stream_itself,
                              "client_body": body,
                              # Answers name the model as the client asked for it (or as configured), whatever
                              # the server says.
                              "answer_model": req.model or provider.cfg.model or model}
        if req.native is not None:
            kw["native"] = req.native
            kw["provider_name"] = provider.name
        kw["repair_tools"] = repair_tools_for(provider.cfg, req.body)
        if req.body.get("tool_choice") is not None and not self.router.attempt.named_tool_choice(provider):
            kw["named_tool_choice"] = False
        kw["observe"] = self.profile.drift_action != "off" and provider.cfg.is_local()
        if req.ingress == "anthropic" and cls.upstream_wire == "openai":
            kw["input_tokens"] = provider.estimate_tokens(len(raw))
        elif req.ingress == "anthropic":
            kw["signatures"] = self.router.attempt.signatures_for(provider.adapter.signer)
        call = self._call_factory(provider, cls(**kw), raw_body=raw, stream=req.stream, client_headers=req.headers)
        slot.call = call
        return call

    async def serve(self, slot: Slot) -> None:
        """One whole attempt: resolve the model, open the call, deliver the answer. Raises UpstreamError."""
        model = await slot.provider.resolve_model(self.req.model)
        self.record.chose_model(model)
        call = self.new_call(slot, model)
        ticket = self.record.affinity
        placing = self.router.placement
        if ticket is not None and placing is not None:
            call.placement = slot.placement = placement = await placing.place(ticket, slot.provider)
            if placement is not None:
                call.extra_fields = placement.fields
        if self._before_upstream is not None:
            self._before_upstream()
        if self.req.stream:
            await self.deliver_stream(slot, await self._first_output_or_commit(call))
        else:
            await call.open()
            await self.deliver_body(slot, await call.result())

    async def deliver_body(self, slot: Slot, body: bytes) -> None:
        """A whole non-streaming answer from the slot's provider: it won."""
        self.record.set_ttfb(slot.made.ttfb)
        self.succeeded(slot, learn=False)
        try:
            await self.sink.finish(body, self.record.route_headers(slot.name))
        finally:
            self._learn_from(slot)  # after the answer is out: nothing in it depends on this

    async def deliver_stream(self, slot: Slot, first: bytes) -> None:
        """Stream the slot's provider to the client from its first output to its end. Raises UpstreamError."""
        call = slot.made
        self.record.set_ttfb(call.ttfb)
        if not self.committed:
            self.committed = True
            await self.sink.start_stream(self.record.route_headers(slot.name, serving=_serving(slot, "ok")))
        await self.sink.event(first)
        # The client has this provider's output: nothing else will serve it. A turn still held at a stopped model
        # (failed over while it was started) goes back now, not at the end of the stream: once that model is up
        # it would be kept for this request, and no other swap could stop it, for as long as the stream lasts.
        self.starts.give_back()
        try:
            await self._pump(call)
        finally:
            self.record.set_ttfb(call.ttfb)  # the first content may come after the first output (message_start)
        # The upstream's whole answer, its usage included, is with the client now: the request succeeded. It is
        # recorded before the housekeeping below, because a client that closes right after [DONE] cancels this
        # task there, and the journal must still get the usage the upstream reported.
        self.succeeded(slot)
        await call.drain()
        await self.sink.finish()

    def succeeded(self, slot: Slot, *, learn: bool = True) -> None:
        """The slot's provider served the request. `learn=False`: the caller calls `_learn_from` itself once
        the answer is out."""
        slot.done = slot.ok = True
        self.record.served(slot.name, slot.made.strategy)
        self._record(slot, Outcome.OK, "ok", 200)
        if learn:
            self._learn_from(slot)

    def _learn_from(self, slot: Slot) -> None:
        """What a success teaches: the breaker and adaptive stats, the token ratio, drift, affinity."""
        call = slot.made
        record = self.record
        if getattr(call.strategy, "answer", None) is not None:
            sample = call.strategy.drift_sample(tools_offered=bool(self.req.body.get("tools")),
                                                prompt_key=_last_turn_key(self.req.body))
            if sample is not None:
                sample = without_client_cut(sample, client_limit(self.req.body),
                                            record.usage.get("output_tokens") or 0)
            record.sampled_drift(sample)
        latency = call.ttfb if call.ttfb is not None else time.monotonic() - slot.started
        self.router.report(slot.name, slot.admission, latency)
        usage = record.usage
        prompt_tokens = (usage.get("input_tokens") or 0) + (usage.get("cache_read_input_tokens") or 0)
        if prompt_tokens:
            slot.provider.learn_ratio(call.request_chars, prompt_tokens)
        ticket = record.affinity
        placing = self.router.placement
        if ticket is not None and slot.placement is None and placing is not None:
            # A race winner: never slot-pinned, but what it cached still teaches the index.
            placing.learn_unplaced(ticket, slot.provider, strategy=call.strategy, request_id=self.req.request_id)

    def failed(self, slot: Slot, e: UpstreamError) -> None:
        # What a failure teaches is its label, status and message. The frames it was raised through name the
        # attempt's bodies and buffers (up to 16 MB), and the error outlives the attempt (the request's errors, a
        # race's tasks, an exception aiohttp raised while this one was handled): the soak kept megabytes per
        # refused answer that way.
        e.__traceback__ = None
        e.__context__ = None
        slot.done = True
        if died_under(slot.provider, e, self.committed):
            self.starts.dead(slot.name, slot.lease)
            # balance: its lane's saved slot file goes to whichever replica serves the next attempt (on this
            # machine: kvcache/move.py), as it would had the replica been down before the request came.
            placing, ticket = self.router.placement, self.record.affinity
            if placing is not None and ticket is not None and self.profile.mode == "balance":
                placing.died(ticket, slot.name)
        self.router.report(slot.name, slot.admission, time.monotonic() - slot.started, e)
        self._record(slot, Outcome.FAILED, e.label, e.status, e.message)

    def lost(self, slot: Slot, *, cancelled: bool = False) -> None:
        """A race participant that was beaten (or dropped because the client left). A paid API bills the
        prompt it already read, so that is what its reservation settles with."""
        slot.bill = {"input_tokens": slot.provider.estimate_tokens(len(self.req.raw))}
        if cancelled:
            self._abandon(slot, Outcome.CANCELLED, "client_disconnected")
        else:
            self._abandon(slot, Outcome.LOST, "race_lost")

    # -- streaming ------------------------------------------------------------------------------------------

    async def first_output(self, call: Call, *, until_content: bool = False) -> bytes:
        """Open a streaming call and read its first output within the call's first-byte timeout: its first event
        (b"" when the stream ends first), or with `until_content` (a race, where only useful output counts)
        every event until the first content or tool call, joined. Raises UpstreamError (first_byte_timeout)."""
        await call.open()
        got: list[bytes] | None = [] if until_content else None
        while got is None or not call.strategy.started_content:
            remaining = call.first_byte_deadline - time.monotonic()
            if remaining <= 0:
                raise UpstreamError("first_byte_timeout", message=f"no {'content' if until_content else 'event'} "
                                                                  "within the first-byte timeout")
            try:
                data = await call.read(remaining)
            except TimeoutError:
                continue
            if data is None:
                break
            if got is not None:
                got.append(data)
            elif data:
                return data
        return b"".join(got) if got else b""

    async def _first_output_or_commit(self, call: Call) -> bytes:
        """The first output of a streaming call; meanwhile the stream commits when its hold is over, then the
        client gets pings while the upstream is silent."""
        task = asyncio.ensure_future(self.first_output(call))
        try:
            if not self.committed:
                wait = self.hold_remaining()
                if wait > 0:
                    done, _ = await asyncio.wait((task,), timeout=wait)
                    if done:
                        return task.result()
                await self.commit_early(call.provider.name, (call,))
            while True:
                done, _ = await asyncio.wait((task,), timeout=self.server.ping_interval_s)
                if done:
                    return task.result()
                await self.sink.ping()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def hold_remaining(self) -> float:
        """Seconds left before a stream must commit to the client (send its 200) without an upstream event."""
        return self.req.started + self.server.stream_hold_s - time.monotonic()

    async def commit_early(self, provider_name: str, calls: Iterable[Call]) -> None:
        """Send the 200 (and the sink's own opening) before any upstream event: from now on the client waits on
        us. The `calls` still waiting are told first, before any await, so none emits an opening after ours."""
        if self.sink.opens_stream_itself:
            for c in calls:
                c.strategy.skip_prologue = True
        self.committed = True
        record = self.record
        opening = StreamOpening(self.req.model, record.message_id, int(len(self.req.raw) / 4))
        serving = f"{provider_name}:panic:streaming" if record.panic else f"{provider_name}:streaming"
        await self.sink.start_stream(record.route_headers(provider_name, serving=serving), opening)

    async def ping(self) -> None:
        await self.sink.ping()

    async def _pump(self, call: Call) -> None:
        """Relay the upstream's stream to the client until its end (e.g. [DONE]) has been relayed."""
        sink = self.sink
        t = call.provider.cfg.timeouts
        ping_every = self.server.ping_interval_s
        last = time.monotonic()
        while not call.strategy.done:
            now = time.monotonic()
            wait = min(ping_every, t.idle - (now - last), call.total_deadline - now)
            if wait <= 0:
                reason = TOTAL_TIMEOUT if call.total_deadline <= now else IDLE_TIMEOUT
                raise UpstreamError(reason, message=f"upstream {reason.replace('_', ' ')}",
                                    after_content=call.strategy.started_content)
            try:
                data = await call.read(wait)
            except TimeoutError:
                await sink.ping()
                continue
            if data is None:
                break
            last = time.monotonic()
            if data:
                await sink.event(data)

    # -- endings --------------------------------------------------------------------------------------------

    def ends_request(self, e: UpstreamError, rest: list[str]) -> bool:
        """Whether this failure ends the request (then `send_failure(e)`) instead of moving to the next provider."""
        if e.after_content and self.committed:
            return True  # the client has part of this answer: another provider's cannot follow it
        # Content the upstream produced but the client never saw (the failure came in the same read as the first
        # events, before anything was sent) is no reason to stop: the next provider can still answer whole.
        if e.reason == OVERFLOW:
            return not self._larger_window_ahead(e, rest)
        return not e.failover

    async def send_failure(self, e: UpstreamError) -> None:
        """Answer the client with the failure that ended the request."""
        self.record.ended_by_last_attempt()
        if e.after_content and self.committed:
            await self._fail_committed(e)
        elif e.reason == OVERFLOW:
            await self._reply(replies.overflow(e, ingress=self.req.ingress,
                                               max_tokens=replies.requested_output(self.req.body)))
        else:
            await self._reply(replies.passed_on(e))

    async def conclude(self, errors: list[UpstreamError]) -> None:
        """Nobody served the request: one error naming each attempt and skip and its cause."""
        router = self.router
        for s in list(self.record.skips):
            # A start this request waited for ended unable to start (fatal, no room): the client is told why.
            if s.reason != "not_ready":
                continue
            if (a := router.availability(s.provider)).code is Code.CANNOT_START:
                self.record.cannot_start(s.provider, a.words)
            else:
                s.retry_in_s = router.start_eta(s.provider)  # a start under way: when to come back
        skips = self.record.skips
        args = {"ingress": self.req.ingress, "profile": self.profile_name, "summary": self.record.failure_summary()}
        if errors:
            await self._reply(replies.all_failed(errors, skips=skips, **args))
        else:
            spent = {s.provider: why for s in skips if s.reason == "budget"
                     and (why := self.budget_final.get(s.provider) or self.router.spent_cap(s.provider)) is not None}
            await self._reply(replies.nothing_attempted(skips, spent=spent, **args))

    def _larger_window_ahead(self, e: UpstreamError, rest: list[str]) -> bool:
        needed = e.overflow[0] if e.overflow and e.overflow[0] else 0
        have = e.overflow[1] if e.overflow and e.overflow[1] else 0
        for name in rest:
            w = self.router.attempt.context_window(self.runtime.providers[name])
            if w == 0 or w > max(have, needed):
                return True
        return False

    async def _send_error(self, status: int, message: str, *, kind: str | None = None,
                          extra: dict | None = None, headers: dict | None = None, code: str | None = None) -> None:
        self.record.end(status, kind or error_kind(status))
        if self.committed:
            await self.sink.error(status, message, kind=kind or error_kind(status), code=code)
            return
        h = self.record.route_headers(None)
        if headers:
            h.update(headers)
        await self.sink.error(status, message, kind=kind, headers=h, extra=extra, code=code)

    async def _reply(self, r: replies.Reply) -> None:
        await self._send_error(r.status, r.message, kind=r.kind, headers=r.headers, code=r.code)

    async def _fail_committed(self, e: UpstreamError) -> None:
        self.record.end(200, e.reason)
        kind = e.error_type or ("overloaded_error" if e.status in replies.OVERLOAD_STATUSES else "api_error")
        await self.sink.error(e.status or 502, f"upstream {self.record.attempts[-1].provider} failed mid-stream: "
                                               f"{e.message}", kind=kind)


class _Holding:
    """The context manager behind `Exchange.holding` (a class: it is on every attempt's path)."""

    __slots__ = ("ex", "slot")

    def __init__(self, ex: Exchange, slot: Slot) -> None:
        self.ex = ex
        self.slot = slot

    def __enter__(self) -> Slot:
        return self.slot

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        ex, slot = self.ex, self.slot
        try:
            if exc_type is not None:
                if issubclass(exc_type, (asyncio.CancelledError, ClientGone)):
                    if not slot.ok:  # not a client leaving after its whole answer (see deliver_stream)
                        ex._abandon(slot, Outcome.CANCELLED, CLIENT_DISCONNECTED)
                        ex.record.end(499, CLIENT_DISCONNECTED)
                elif issubclass(exc_type, Exception):
                    ex._abandon(slot, Outcome.ERROR, "internal_error", exc_type.__name__)
        finally:
            ex._close_slot(slot)
        return False  # never swallows: the caller decides what an exception means for the request


def _last_turn_key(body: dict) -> int:
    """What was just asked (the last message or input item), for drift: the same answer to the same question is
    a loop, to different questions it is not. Only for answers drift watches (local providers)."""
    turns = body.get("messages") or body.get("input")
    if isinstance(turns, list) and turns:
        try:
            return hash(orjson.dumps(turns[-1]))
        except TypeError:
            return 0
    return hash(turns) if isinstance(turns, str) else 0


def _serving(slot: Slot, result: str) -> str:
    return f"{slot.name}:panic:{result}" if slot.panic else f"{slot.name}:{result}"
