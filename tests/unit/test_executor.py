"""The executor without a daemon: scripted upstream calls, a recording client sink (tests/support/routing.py)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from coderouterd.providers.errors import OVERFLOW, UNBUILDABLE, UpstreamError, http_error
from coderouterd.routing.attempts import Outcome
from coderouterd.routing.sink import ClientGone
from coderouterd.upstream.breaker import BreakerState
from coderouterd.upstream.lifecycle import Phase, down_why
from tests.support.routing import FakeSink, Routing, boom, chain_config, fail, hang, midstream, ok

STREAM = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def run(coro):
    return asyncio.run(coro)


def open_breaker(r: Routing, name: str) -> None:
    br = r.breaker(name)
    for _ in range(br.failures):
        br.record_failure(reason="test")
    assert br.state is BreakerState.OPEN


def half_open(r: Routing, name: str) -> None:
    open_breaker(r, name)
    r.clock.advance(30)
    assert r.breaker(name).state is BreakerState.HALF_OPEN


# -- fallback ---------------------------------------------------------------------------------------------------


def test_fallback_moves_past_a_failing_provider_and_says_so():
    r = Routing(chain_config("a", "b"))
    r.ups.script("a", fail(http_error(500, "boom")))
    ex, sink = run(r.serve())
    assert sink.status == 200 and ex.record.served_by == "b"
    assert sink.headers()["x-coderouter-attempts"] == "a:http_500,b:ok"
    assert [a.outcome for a in ex.record.attempts] == [Outcome.FAILED, Outcome.OK]
    assert r.breaker("a").consecutive_failures == 1
    assert r.state.passive_failures("a") == 1


def test_a_served_request_makes_health_healthy_not_unknown():
    r = Routing(chain_config("a"))
    assert r.state.health_of("a") is None
    run(r.serve())
    assert r.state.health_of("a") == "HEALTHY"


def test_streamed_attempts_header_names_the_winner():
    r = Routing(chain_config("a", "b"))
    r.ups.script("a", fail(http_error(503, "loading")))
    r.ups.script("b", ok(b"event: x\ndata: {}\n\n", b"event: y\ndata: {}\n\n"))
    ex, sink = run(r.serve(STREAM))
    start = sink.log[0]
    assert start[0] == "start" and start[1]["x-coderouter-attempts"] == "a:http_503,b:ok"
    assert start[1]["x-coderouter-provider"] == "b"
    assert sink.log[-1][0] == "finish" and ex.record.status == 200


def test_request_caused_400_reaches_the_client_and_counts_for_nothing():
    r = Routing(chain_config("a", "b"))
    for _ in range(6):
        r.ups.script("a", fail(http_error(400, "stop_sequences: bad")))
        _ex, sink = run(r.serve())
        assert sink.status == 400
    assert r.breaker("a").state is BreakerState.CLOSED and r.breaker("a").consecutive_failures == 0
    assert r.state.passive_failures("a") == 0
    assert r.ups.sent.count(("b", b"")) == 0 and all(n == "a" for n, _ in r.ups.sent)  # b never asked
    _ex, sink = run(r.serve())
    assert sink.status == 200


def test_context_overflows_are_400s_and_never_open_the_breaker():
    r = Routing(chain_config("a"))
    for _ in range(6):
        r.ups.script("a", fail(UpstreamError(OVERFLOW, status=400, message="too long", overflow=(5000, 4096))))
        _ex, sink = run(r.serve())
        err = sink.last_error()
        assert err[1] == 400 and err[2] == "prompt is too long: 5000 tokens > 4096 maximum"
    assert r.breaker("a").state is BreakerState.CLOSED
    ex, sink = run(r.serve())
    assert sink.status == 200 and ex.record.attempts[-1].panic is False


def test_an_overflow_without_numbers_is_told_as_unknown_not_estimated():
    r = Routing(chain_config("a"))
    r.ups.script("a", fail(UpstreamError(OVERFLOW, status=400, message="context length exceeded", overflow=(0, 0))))
    _ex, sink = run(r.serve())
    err = sink.last_error()
    # Still the wording Claude Code compacts on, but no "N tokens > M maximum" made up from the body's size.
    assert err[1] == 400 and err[2].startswith("prompt is too long") and "did not say" in err[2]
    assert ">" not in err[2] and "context length exceeded" in err[2]


def test_last_failure_429_is_a_429_with_the_smallest_retry_after():
    r = Routing(chain_config("a", "b"))
    r.ups.script("a", fail(http_error(429, "slow down", retry_after=9)))
    r.ups.script("b", fail(http_error(429, "slow down", retry_after=2.2)))
    _ex, sink = run(r.serve())
    status, _msg, kind, headers = sink.last_error()[1:]
    assert status == 429 and kind == "rate_limit_error" and headers["retry-after"] == "3"


def test_401_shows_as_auth_and_in_error_figures_but_not_in_the_breaker():
    r = Routing(chain_config("a", "b"))
    for _ in range(5):
        r.ups.script("a", fail(http_error(401, "bad key")))
        _ex, sink = run(r.serve())
        assert sink.status == 200
    assert r.state.auth_state("a")["status"] == 401
    assert r.state.stats.figures("a")["errors"] == 5
    assert r.breaker("a").state is BreakerState.CLOSED


def test_a_body_our_translation_cannot_build_is_a_400_and_never_the_providers_fault():
    # The real Call: the translation fails before any byte goes upstream (no network needed).
    from coderouterd.providers.call import Call
    from coderouterd.providers.strategies import strategy_for

    r = Routing(chain_config("a", "b"))
    provider = r.runtime.providers["a"]
    body = {"model": "m", "max_tokens": 5, "system": 7, "messages": [{"role": "user", "content": "x"}]}
    strategy = strategy_for("anthropic", "openai")(model="m", skip_prologue=False, client_body=body, input_tokens=1)
    call = Call(provider, strategy, raw_body=orjson.dumps(body), stream=False, client_headers={})
    with pytest.raises(UpstreamError) as ei:
        run(call.open())
    e = ei.value
    assert e.reason == UNBUILDABLE and e.caused_by_request and not e.counts_against_provider and e.failover
    # Through the executor: both providers refuse to build it; the client gets the 400, nobody is counted.
    r.ups.script("a", fail(e))
    r.ups.script("b", fail(e))
    _ex, sink = run(r.serve(body))
    assert sink.status == 400
    assert r.breaker("a").consecutive_failures == 0 and r.state.passive_failures("b") == 0


# -- half-open trial: every exit path gives the slot back --------------------------------------------------------


def _trial(r: Routing, step, *, sink: FakeSink | None = None, body=None):
    half_open(r, "a")
    r.ups.script("a", step)
    ex, sink = r.exchange(body, sink=sink)

    async def go():
        task = asyncio.ensure_future(ex.run())
        await asyncio.sleep(0.01)
        if not task.done():
            task.cancel()
        return await asyncio.gather(task, return_exceptions=True)

    return ex, sink, run(go())[0]


@pytest.mark.parametrize("case", ["success", "upstream_500", "request_400", "own_exception", "cancelled",
                                  "client_gone"])
def test_every_exit_of_a_half_open_trial_releases_the_slot(case):
    r = Routing(chain_config("a", extra_profile="panic = false"))
    step = {
        "success": ok(), "upstream_500": fail(http_error(500, "x")), "request_400": fail(http_error(400, "bad")),
        "own_exception": boom(KeyError("translation bug")), "cancelled": hang(),
        "client_gone": ok(b"event: x\ndata: {}\n\n"),
    }[case]
    # The client goes away while the stream is written: before the attempt could report anything.
    sink = FakeSink(gone_on="event") if case == "client_gone" else None
    ex, _sink, result = _trial(r, step, sink=sink, body=STREAM if case == "client_gone" else None)
    br = r.breaker("a")
    assert not br.trial_in_flight
    if case in ("success", "request_400"):
        assert br.state is BreakerState.CLOSED  # it answered: alive
    elif case == "upstream_500":
        assert br.state is BreakerState.OPEN  # a real failed trial re-opens; no slot is left held
        r.clock.advance(60)  # for twice as long: the second ejection
    else:
        assert br.state is BreakerState.HALF_OPEN
        assert isinstance(result, (asyncio.CancelledError, KeyError, ClientGone))
        assert ex.record.attempts[-1].outcome in (Outcome.CANCELLED, Outcome.ERROR)
    assert br.allow()  # the next trial (or request) is admitted
    assert "a" in r.ups.closed  # the upstream connection was dropped either way


def test_midstream_failure_ends_with_an_error_event_and_releases_nothing_twice():
    r = Routing(chain_config("a", "b"))
    r.ups.script("a", midstream(b"event: x\ndata: {}\n\n",
                                UpstreamError("upstream_disconnect", message="gone", after_content=True)))
    ex, sink = run(r.serve(STREAM))
    kinds = [e[0] for e in sink.log]
    assert kinds == ["start", "event", "error"]
    assert ex.record.status == 200 and ex.record.error_class == "upstream_disconnect"
    assert r.ups.sent and all(n == "a" for n, _ in r.ups.sent)  # committed: never moved to b


def test_a_failure_after_content_the_client_never_saw_moves_to_the_next_provider():
    """The upstream's first events and its error came in one read: it had produced content, but nothing was
    sent (the stream is not committed), so the next provider answers whole (the soak's 502s without failover)."""
    from tests.support.routing import Script

    r = Routing(chain_config("a", "b"))
    r.ups.script("a", Script("midstream", (), error=UpstreamError("stream_error", message="crashed",
                                                                 after_content=True)))
    ex, sink = run(r.serve(STREAM))
    assert [n for n, _ in r.ups.sent] == ["a", "b"]
    assert ex.record.status == 200 and ex.record.served_by == "b" and ex.record.error_class is None
    assert [e[0] for e in sink.log][0] == "start" and "error" not in [e[0] for e in sink.log]


def test_a_failure_after_unseen_content_on_the_last_provider_is_an_http_error_not_an_event():
    from tests.support.routing import Script

    r = Routing(chain_config("a"))
    r.ups.script("a", Script("midstream", (), error=UpstreamError("stream_error", message="crashed",
                                                                 after_content=True)))
    ex, sink = run(r.serve(STREAM))
    assert not sink.headers_sent or sink.status >= 500
    assert ex.record.status >= 500  # what the client got is what the journal says


# -- panic ------------------------------------------------------------------------------------------------------


def test_one_provider_with_an_open_breaker_is_still_served_in_panic():
    r = Routing(chain_config("a"))
    open_breaker(r, "a")
    ex, sink = run(r.serve())
    assert sink.status == 200
    assert sink.headers()["x-coderouter-attempts"] == "a:panic:ok"
    assert ex.record.panic and ex.record.attempts[0].panic and ex.record.trace(0.1, cost_usd=0.0)["panic"] is True
    assert any(n.get("panic") for n in ex.record.trace(0.1, cost_usd=0.0)["order_notes"])
    assert r.breaker("a").state is BreakerState.CLOSED  # a real generation succeeded: proof enough


def test_panic_streams_too_and_marks_the_header():
    r = Routing(chain_config("a"))
    open_breaker(r, "a")
    _ex, sink = run(r.serve(STREAM))
    assert sink.log[0][1]["x-coderouter-attempts"] == "a:panic:ok"


def test_panic_goes_best_first_and_a_panic_failure_does_not_touch_the_open_breaker():
    r = Routing(chain_config("a", "b"))
    open_breaker(r, "a")
    r.clock.advance(10)
    open_breaker(r, "b")  # b reopens later than a
    r.ups.script("a", fail(http_error(500, "still down")))
    ex, sink = run(r.serve())
    assert [a.provider for a in ex.record.attempts] == ["a", "b"] and all(a.panic for a in ex.record.attempts)
    assert sink.status == 200 and ex.record.served_by == "b"
    assert r.breaker("a").state is BreakerState.OPEN and r.breaker("a").retry_in_s == pytest.approx(20)


def test_panic_opt_out_answers_at_once():
    r = Routing(chain_config("a", extra_profile="panic = false"))
    open_breaker(r, "a")
    _ex, sink = run(r.serve())
    status, msg, kind, _h = sink.last_error()[1:]
    assert status == 529 and kind == "overloaded_error" and "breaker_open" in msg
    assert r.ups.sent == []


def test_a_managed_process_that_is_not_ready_is_never_a_panic_candidate():
    r = Routing(chain_config("a"))
    r.state.upstreams.move(["a"], Phase.STOPPED)
    _ex, sink = run(r.serve())
    assert sink.status == 529 and r.ups.sent == []
    assert "a:skipped:not_ready" in sink.headers()["x-coderouter-attempts"]


@pytest.mark.parametrize("transient", ["unhealthy", "breaker_open", "both"])
def test_a_fatal_process_is_skipped_even_in_panic_and_the_client_is_told_how_to_restart_it(transient):
    # Self-healing holds a provider whose process went FATAL (UNHEALTHY), its breaker may be open too: the planner
    # skips it for that transient reason before the down check sees it, and panic must still not try it.
    r = Routing(chain_config("a"))
    if transient in ("unhealthy", "both"):
        r.state.set_health("a", "UNHEALTHY", "process llama fatal")
    if transient in ("breaker_open", "both"):
        open_breaker(r, "a")
    r.state.upstreams.move(["a"], Phase.STOPPED, down_why("fatal", "llama", coming=False), process="llama")
    ex, sink = run(r.serve())
    assert r.ups.sent == [] and not ex.record.attempts
    status, msg, kind, headers = sink.last_error()[1:]
    assert status == 529 and kind == "overloaded_error"
    assert "a:skipped:not_ready" in headers["x-coderouter-attempts"]
    assert "fatal" in msg and "corectl restart llama" in msg, msg


def test_a_request_nothing_else_can_serve_waits_for_a_starting_process_then_is_served():
    async def go():
        r = Routing(chain_config("a"))
        r.state.upstreams.starting(["a"], "", 30, "")  # the supervisor is (re)starting a's server
        task = asyncio.ensure_future(r.serve())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and r.ups.sent == []  # waiting, not failing
        r.state.upstreams.move(["a"], Phase.RESIDENT)  # READY
        ex, sink = await asyncio.wait_for(task, 5)
        assert sink.status == 200 and ex.record.served_by == "a"
        assert "a:skipped:not_ready" not in sink.headers()["x-coderouter-attempts"]
        assert any("waited for a" in n.get("why", "") for n in ex.record.notes)
    run(go())


def test_a_waiting_request_gives_up_when_the_process_turns_fatal_or_its_start_timeout_passes():
    async def go():
        r = Routing(chain_config("a"))
        r.state.upstreams.starting(["a"], "", 30, "")
        task = asyncio.ensure_future(r.serve())
        await asyncio.sleep(0.01)
        r.state.upstreams.move(["a"], Phase.STOPPED)  # FATAL: it is not coming back by itself
        _ex, sink = await asyncio.wait_for(task, 1)
        assert sink.status == 529 and r.ups.sent == []
        r2 = Routing(chain_config("a"))
        r2.state.upstreams.starting(["a"], "", 0.05, "")
        _ex, sink = await asyncio.wait_for(r2.serve(), 2)
        assert sink.status == 529 and r2.ups.sent == []
    run(go())


def test_a_fallback_that_serves_is_not_held_back_by_a_starting_process():
    async def go():
        r = Routing(chain_config("a", "b"))
        r.state.upstreams.starting(["a"], "", 30, "")
        ex, sink = await asyncio.wait_for(r.serve(), 2)
        assert sink.status == 200 and ex.record.served_by == "b"
    run(go())


def test_unhealthy_excluded_provider_is_tried_in_panic():
    r = Routing(chain_config("a"))
    for _ in range(r.breaker("a").failures):  # failed probes: UNHEALTHY by the one count, its breaker still closed
        r.state.probe_failed("a", "probe failed: test")
    assert r.state.health_of("a") == "UNHEALTHY" and r.breaker("a").state is BreakerState.CLOSED
    ex, sink = run(r.serve())
    assert sink.status == 200 and ex.record.attempts[0].panic
    assert r.state.health_of("a") == "HEALTHY" and r.state.failures("a") == 0  # served: the count starts over


def test_a_half_open_trial_in_flight_does_not_make_others_route_nowhere():
    r = Routing(chain_config("a"))
    half_open(r, "a")
    assert r.breaker("a").allow()  # someone else holds the trial
    ex, sink = run(r.serve())
    assert sink.status == 200 and ex.record.attempts[0].panic
    assert r.breaker("a").state is BreakerState.CLOSED  # a real generation served: that closes it


# -- images -----------------------------------------------------------------------------------------------------

PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def test_images_to_a_provider_declared_without_vision_become_a_note():
    r = Routing(chain_config("a", provider_extra={"a": "capabilities = { vision = false }"}))
    body = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": PNG}, {"type": "text", "text": "what is this"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "image", "source": PNG}]}]},
    ]}
    ex, sink = run(r.serve(body))
    assert sink.status == 200
    sent = r.ups.sent[0][1]
    assert b'"type":"image"' not in sent and b"iVBORw0KGgo" not in sent
    assert sent.count(b"[image omitted: a does not accept images]") == 2
    assert any(n.get("images_omitted") == 2 for n in ex.record.trace(0.1, cost_usd=0.0)["order_notes"])


def test_openai_image_url_is_replaced_too_and_undeclared_vision_forwards():
    cfg = chain_config("a", "b", provider_extra={"a": "capabilities = { vision = false }"})
    r = Routing(cfg)
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}
    r.ups.script("a", fail(http_error(500, "x")))
    run(r.serve(body, ingress="openai"))
    (_a, to_a), (_b, to_b) = r.ups.sent
    assert b"image_url" not in to_a and b"[image omitted" in to_a
    assert b"image_url" in to_b  # b did not declare vision: unknown, forwarded
    assert orjson.loads(to_b)["messages"][0]["content"][0]["type"] == "image_url"


def test_an_out_of_memory_cooldown_is_named_as_such_not_as_an_open_breaker():
    from coderouterd.providers.errors import MEMORY_PRESSURE

    r = Routing(chain_config("a", "b"))
    r.ups.script("a", fail(UpstreamError(MEMORY_PRESSURE, status=500, message="cudaMalloc failed: out of memory")))
    ex, sink = run(r.serve())
    assert ex.record.served_by == "b" and r.breaker("a").state is BreakerState.OPEN
    ex, sink = run(r.serve())
    skip = next(s for s in ex.record.skips if s.provider == "a")
    assert skip.reason == "memory_cooldown" and "a: held: memory cooldown" in skip.message
    assert "ran out of memory" in skip.message
    assert "a:skipped:memory_cooldown" in sink.headers()["x-coderouter-attempts"]
    r2 = Routing(chain_config("a", "b"))
    open_breaker(r2, "a")  # failures of another kind are still an open breaker
    ex, _sink = run(r2.serve())
    assert next(s for s in ex.record.skips if s.provider == "a").reason == "breaker_open"


# -- a spent budget (issue 23 item 7) ----------------------------------------------------------------------------


def _spent_budget(tmp_path, *providers: str, extra_profile: str = ""):
    from coderouterd.config.loader import parse_config_text
    from coderouterd.guards.apply import BudgetHooks
    from coderouterd.guards.budget import Budget
    from coderouterd.state.store import Store

    toml = chain_config(*providers, extra_profile=extra_profile, provider_extra={
        "paid": 'paid = true\ncost = { input = 3.0, output = 15.0 }\nmonthly_budget_usd = 0.01\n'})
    budget = Budget(Store(tmp_path / "state.db"))
    budget.configure(parse_config_text(toml, "test").providers, global_cap_usd=0.0, warn_ratio=0.8)
    budget.record("paid", 0.02)
    return Routing(toml, budget=BudgetHooks(budget))


@pytest.mark.parametrize(("ingress", "status", "kind"), [("anthropic", 402, "billing_error"),
                                                         ("openai", 402, "billing_error"),
                                                         ("responses", 400, "invalid_request_error")])
def test_a_spent_budget_is_final_and_says_which_cap_and_when_it_resets(tmp_path, ingress, status, kind):
    r = _spent_budget(tmp_path, "paid")
    _ex, sink = run(r.serve(ingress=ingress))
    got_status, msg, got_kind, headers = sink.last_error()[1:]
    assert (got_status, got_kind) == (status, kind)
    assert headers["x-should-retry"] == "false"  # the SDKs stop at once whatever the status
    assert "'paid' monthly budget is spent (0.02 of 0.01 USD); it resets " in msg and msg.endswith(" UTC")
    assert r.ups.sent == []


def test_a_spent_budget_next_to_a_provider_that_comes_back_is_still_an_overload(tmp_path):
    r = _spent_budget(tmp_path, "paid", "local", extra_profile="panic = false")
    open_breaker(r, "local")
    _ex, sink = run(r.serve())
    status, _msg, kind, _h = sink.last_error()[1:]
    assert (status, kind) == (529, "overloaded_error")


def test_a_request_too_dear_for_what_is_left_of_the_cap_is_final_too(tmp_path):
    """The cap is not spent, but this request's worst case (input + max_tokens) cannot fit what is left: retrying
    cannot help before the reset, so it is the final budget answer, not a retryable overload."""
    from coderouterd.config.loader import parse_config_text
    from coderouterd.guards.apply import BudgetHooks
    from coderouterd.guards.budget import Budget
    from coderouterd.state.store import Store

    toml = chain_config("paid", provider_extra={
        "paid": 'paid = true\ncost = { input = 3.0, output = 15.0 }\nmonthly_budget_usd = 1.0\n'})
    budget = Budget(Store(tmp_path / "state.db"))
    budget.configure(parse_config_text(toml, "test").providers, global_cap_usd=0.0, warn_ratio=0.8)
    budget.record("paid", 0.99999)
    r = Routing(toml, budget=BudgetHooks(budget))
    _ex, sink = run(r.serve())
    status, msg, kind, headers = sink.last_error()[1:]
    assert (status, kind) == (402, "billing_error") and headers["x-should-retry"] == "false"
    assert "more than the 1e-05 USD left of the 'paid' monthly budget" in msg
    assert r.ups.sent == []


def test_a_failed_attempt_keeps_its_message_not_the_frames_it_was_raised_through():
    """Issue 23 soak: the frames of a refused answer's traceback named its body (up to 16 MB), and the error outlived
    the request; RSS climbed by megabytes per refused answer until a later request replaced it."""
    r = Routing(chain_config("a", "b"))

    def raised_with_a_big_local() -> UpstreamError:
        body = b"x" * 1_000_000  # noqa: F841 - what the frame would keep
        try:
            try:
                raise ValueError("not JSON")
            except ValueError:
                raise UpstreamError("bad_response", message="upstream answered 200 with garbage") from None
        except UpstreamError as e:
            return e

    err = raised_with_a_big_local()
    assert err.__traceback__ is not None and err.__context__ is not None
    r.ups.script("a", fail(err))
    ex, _ = asyncio.run(r.serve())
    assert ex.record.served_by == "b"
    assert err.__traceback__ is None and err.__context__ is None


# -- the first-byte wait, the one routine for fallback and race ---------------------------------------------------


class _Reads:
    """A streaming call that answers reads from a script (bytes, None for the end, TimeoutError) and marks
    content at the byte string given."""

    def __init__(self, *reads, content_at=None, deadline_s=30.0) -> None:
        import time
        from types import SimpleNamespace

        self.reads = list(reads)
        self.content_at = content_at
        self.strategy = SimpleNamespace(started_content=False)
        self.first_byte_deadline = time.monotonic() + deadline_s
        self.opened = False

    async def open(self) -> None:
        self.opened = True

    async def read(self, timeout):
        data = self.reads.pop(0)
        if isinstance(data, BaseException):
            raise data
        if data is not None and data == self.content_at:
            self.strategy.started_content = True
        return data


def test_the_first_output_is_the_first_event_or_everything_until_content():
    ex, _sink = Routing(chain_config("a")).exchange(STREAM)
    call = _Reads(TimeoutError(), b"", b"ping", b"text", None)
    assert run(ex.first_output(call)) == b"ping" and call.opened  # empty reads and read timeouts are waited past
    call = _Reads(b"prologue", TimeoutError(), b"", b"text", b"more", content_at=b"text")
    assert run(ex.first_output(call, until_content=True)) == b"prologuetext"  # a race wants useful output
    assert run(ex.first_output(_Reads(None))) == b""  # the stream ended first
    assert run(ex.first_output(_Reads(b"x", None), until_content=True)) == b"x"  # ended before any content


def test_no_first_output_within_the_first_byte_timeout_is_a_failure_of_the_attempt():
    ex, _sink = Routing(chain_config("a")).exchange(STREAM)
    for until_content, what in ((False, "event"), (True, "content")):
        with pytest.raises(UpstreamError) as e:
            run(ex.first_output(_Reads(deadline_s=0), until_content=until_content))
        assert e.value.reason == "first_byte_timeout"
        assert e.value.message == f"no {what} within the first-byte timeout"
