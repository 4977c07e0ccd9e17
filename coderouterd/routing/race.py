"""Race mode: ask the first N providers at once, keep the first that produces useful output.

Useful output is the first content or tool-call event of a stream, or a whole response otherwise. The losers
are cancelled and their connections closed at once, so the upstream sees the disconnect and stops generating.
A participant that fails before the race is decided simply drops out; when all of them fail the remaining
candidates are tried one by one as in fallback mode. With `race_delay_ms` (hedging) the second and later
participants start only if nobody has produced useful output by then, which bounds the extra cost."""

from __future__ import annotations

import asyncio
import time

from ..providers.call import Call
from ..providers.errors import UpstreamError


async def _until_useful(ex, call: Call) -> bytes:
    """Open the call and read until it produced content; returns everything produced so far."""
    await call.open()
    if not ex.req.stream:
        return await call.result()
    out: list[bytes] = []
    while not call.strategy.started_content:
        remaining = call.first_byte_deadline - time.monotonic()
        if remaining <= 0:
            raise UpstreamError("first_byte_timeout", message="no content within the first-byte timeout")
        try:
            data = await call.read(remaining)
        except TimeoutError:
            continue
        if data is None:
            break
        out.append(data)
    return b"".join(out)


async def run_race(ex, candidates: list[str]) -> None:
    width = ex.profile.race_width
    delay = ex.profile.race_delay_ms / 1000.0
    racers: list[str] = []
    rest: list[str] = []
    for name in candidates:
        if len(racers) < width and ex.router.admit(name):
            racers.append(name)
        elif len(racers) >= width:
            rest.append(name)
        else:
            ex.skips.append({"provider": name, "reason": "breaker_open", "message": "circuit breaker open"})

    calls: dict[asyncio.Task, tuple[str, Call, float]] = {}
    errors: list[UpstreamError] = []
    hooks = ex.router.budget_hooks
    reservations: dict[str, object] = {}  # paid racers hold a budget reservation like fallback attempts do

    def settle(name: str, usage: dict | None) -> None:
        res = reservations.pop(name, None)
        if res is not None:
            hooks.settle(res, ex.runtime.providers[name], usage)

    def settle_lost(name: str) -> None:
        # A cancelled loser reports no usage, but a paid API bills the prompt it already read: count that.
        provider = ex.runtime.providers[name]
        settle(name, {"input_tokens": provider.estimate_tokens(len(ex.req.raw))})

    async def launch(name: str) -> None:
        provider = ex.runtime.providers[name]
        try:
            model = await provider.resolve_model(ex.req.model)
        except UpstreamError as e:
            ex.router.report_failure(name, e, 0.0)
            ex._note(name, "failed", e.label, time.monotonic(), e.status, e.message)
            errors.append(e)
            return
        if hooks is not None:
            try:
                res = hooks.reserve(provider, ex.req)
            except UpstreamError as e:  # a refused reservation is a budget gate, not a failure
                ex.router.release(name)
                ex.skips.append({"provider": name, "reason": "budget", "message": e.message})
                return
            if res is not None:
                reservations[name] = res
        ex.model_used = ex.model_used or model
        call = ex.new_call(provider, model)
        task = asyncio.ensure_future(_until_useful(ex, call))
        calls[task] = (name, call, time.monotonic())

    pending_names = list(racers)
    await launch(pending_names.pop(0))
    if delay <= 0:
        while pending_names:
            await launch(pending_names.pop(0))
    next_launch = time.monotonic() + delay
    winner: tuple[asyncio.Task, str, Call, float] | None = None
    race_started = time.monotonic()
    try:
        while calls and winner is None:
            timeout = None
            if pending_names:
                timeout = max(0.0, next_launch - time.monotonic())
            if ex.req.stream and not ex.committed:
                hold = ex.req.started + ex.server.stream_hold_s - time.monotonic()
                timeout = hold if timeout is None else min(timeout, hold)
            elif ex.req.stream:
                timeout = ex.server.ping_interval_s if timeout is None else min(timeout, ex.server.ping_interval_s)
            done, _ = await asyncio.wait(tuple(calls), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                name, call, started = calls.pop(task)
                e = task.exception()
                if e is None:
                    if winner is None:
                        winner = (task, name, call, started)
                    else:  # a second finisher in the same tick: it lost too
                        call.close()
                        settle_lost(name)
                        ex.router.release(name)
                        ex._note(name, "lost", "race_lost", started)
                    continue
                call.close()
                settle(name, None)
                if not isinstance(e, UpstreamError):
                    raise e
                ex.router.report_failure(name, e, time.monotonic() - started)
                ex._note(name, "failed", e.label, started, e.status, e.message)
                errors.append(e)
                if not e.failover and not ex.committed:
                    await _reap(_cancel_losers(ex, calls, settle_lost))
                    await ex._pass_error(e)
                    return
            if winner is not None:
                break
            if pending_names and (time.monotonic() >= next_launch or not calls):
                await launch(pending_names.pop(0))
                next_launch = time.monotonic() + delay
                continue
            if not done and ex.req.stream:
                if not ex.committed:
                    if ex.req.started + ex.server.stream_hold_s <= time.monotonic():
                        first = next(iter(calls.values()))[0] if calls else None
                        await ex._commit(first or "race", [c for _n, c, _s in calls.values()])
                else:
                    await ex.resp.ping()
    except asyncio.CancelledError:
        await _reap(_cancel_losers(ex, calls, settle_lost))
        raise

    # The losers are cancelled and their connections closed now, but reaped only after the winner's first
    # bytes went out: waiting for their teardown first would add it to the time to first byte.
    loser_tasks = _cancel_losers(ex, calls, settle_lost)
    if winner is None:
        await _reap(loser_tasks)
        if rest:
            ex.race_outcome = "no_winner_fallback"
            for name in rest:
                if not ex.router.admit(name):
                    ex.skips.append({"provider": name, "reason": "breaker_open", "message": "circuit breaker open"})
                    continue
                started = time.monotonic()
                try:
                    await ex.attempt(ex.runtime.providers[name], started)
                    return
                except UpstreamError as e:
                    ex.router.report_failure(name, e, time.monotonic() - started)
                    ex._note(name, "failed", e.label, started, e.status, e.message)
                    errors.append(e)
                    if e.after_content:
                        await ex._fail_committed(e)
                        return
        ex.race_outcome = ex.race_outcome or "no_winner"
        await ex._all_failed(errors)
        return

    task, name, call, started = winner
    provider = call.provider
    won_after = time.monotonic() - race_started
    lost = [a["provider"] for a in ex.attempts if a["outcome"] == "lost"]
    ex.race_outcome = f"winner={name} after {won_after * 1000:.1f}ms" + (f"; losers={','.join(lost)}" if lost
                                                                       else "")
    body = task.result()
    try:
        if not ex.req.stream:
            ex.ttfb = call.ttfb
            ex._succeeded(provider, call, started)
            await ex.resp.json(200, body)
            return
        ex.ttfb = call.ttfb
        if not ex.committed:
            ex._set_route_headers(name)
            await ex.resp.start_stream()
            ex.committed = True
        await ex.resp.chunk(body)
        try:
            await ex._pump(call)
        except UpstreamError as e:
            ex.router.report_failure(name, e, time.monotonic() - started)
            ex._note(name, "failed", e.label, started, e.status, e.message)
            await ex._fail_committed(e)
            return
        ex._succeeded(provider, call, started)
    finally:
        call.close()
        settle(name, call.strategy.usage if call.strategy.started_content or not ex.req.stream else None)
        ex.upstream_wait_s += call.wait_s
        await _reap(loser_tasks)


def _cancel_losers(ex, calls: dict, settle_lost) -> list[asyncio.Task]:
    """Cancel every still-running participant and drop its connection (the upstream sees the disconnect)."""
    tasks = []
    for task, (name, call, started) in list(calls.items()):
        task.cancel()
        call.close()
        settle_lost(name)
        ex.router.release(name)
        ex._note(name, "lost", "race_lost", started)
        tasks.append(task)
    calls.clear()
    return tasks


async def _reap(tasks: list[asyncio.Task]) -> None:
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
