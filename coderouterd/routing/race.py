"""Race mode: ask the first N providers at once, keep the first that produces useful output.

Useful output is the first content or tool-call event of a stream, or a whole response otherwise. The losers
are cancelled and their connections closed at once, so the upstream sees the disconnect and stops generating.
A participant that fails before the race is decided simply drops out; when all of them fail, the providers not
raced are left to the executor's one try-in-order routine. With `race_delay_ms` (hedging) the second and later
participants start only if nobody has produced useful output by then, which bounds the extra cost.

Only the race itself lives here; every step of an attempt (admission, budget, breaker reports, the first-byte
wait, the record, delivering the winner) goes through the Exchange's public operations (`steps.Steps`), the same ones fallback
uses; what the race decided goes into the request's record through its methods."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..providers.call import Call
from ..providers.errors import UpstreamError
from .sink import ClientGone

if TYPE_CHECKING:
    from .steps import Slot, Steps


async def _until_useful(ex: Steps, call: Call) -> bytes:
    """Open the call and read until it produced content; returns everything produced so far."""
    if ex.req.stream:
        return await ex.first_output(call, until_content=True)
    await call.open()
    return await call.result()


async def run_race(ex: Steps, candidates: list[str], errors: list) -> list[str] | None:
    """Race the first `race_width` admitted candidates. Returns None when the client has been answered (a
    winner, or a failure that ends the request), else the candidates that were not raced, for try-in-order.
    Failures are appended to `errors`."""
    width = ex.profile.race_width
    delay = ex.profile.race_delay_ms / 1000.0
    pending = list(candidates)
    running: dict[asyncio.Task, Slot] = {}
    launched = 0

    async def launch() -> None:
        """Start the next admissible candidate, if any is left within the race's width."""
        nonlocal launched
        while pending and launched < width:
            slot = await ex.open_slot(pending.pop(0))
            if slot is None:
                continue
            launched += 1
            # From its admission until it runs, the participant is held here: a client leaving while its model is
            # resolved, or our own error, gives back its reservation and trial slot (issue 41: a reservation
            # taken for an attempt never made stayed held, and renewed, for the life of the process).
            try:
                model = await slot.provider.resolve_model(ex.req.model)
                if not ex.record.model_used:
                    ex.record.chose_model(model)
                call = ex.new_call(slot, model)
            except UpstreamError as e:
                with ex.holding(slot):
                    ex.failed(slot, e)
                errors.append(e)
                return
            except BaseException:
                with ex.holding(slot):
                    raise
            running[asyncio.ensure_future(_until_useful(ex, call))] = slot
            return

    def drop_all(*, cancelled: bool) -> list[asyncio.Task]:
        """Cancel every participant still running and drop its connection (the upstream sees the disconnect)."""
        tasks = []
        for task, slot in list(running.items()):
            task.cancel()
            with ex.holding(slot):
                ex.lost(slot, cancelled=cancelled)
            tasks.append(task)
        running.clear()
        return tasks

    winner: tuple[asyncio.Task, Slot] | None = None

    def drop_winner(*, cancelled: bool) -> None:
        # A winner found in the same tick as our own error or the client leaving: it is let go too.
        nonlocal winner
        if winner is not None:
            with ex.holding(winner[1]):
                ex.lost(winner[1], cancelled=cancelled)
            winner = None

    race_started = time.monotonic()
    next_launch = 0.0
    try:
        # The first launches are inside the guard too: a client leaving while the second participant's budget is
        # reserved (a round trip to a shared ledger) must drop the first, already running.
        await launch()
        if delay <= 0:
            while pending and launched < width:
                await launch()
        next_launch = time.monotonic() + delay
        while running and winner is None:
            timeout = None
            if pending and launched < width:
                timeout = max(0.0, next_launch - time.monotonic())
            if ex.req.stream and not ex.committed:
                hold = ex.hold_remaining()
                timeout = hold if timeout is None else min(timeout, hold)
            elif ex.req.stream:
                ping = ex.server.ping_interval_s
                timeout = ping if timeout is None else min(timeout, ping)
            done, _ = await asyncio.wait(tuple(running), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            # Finishers first: a participant that produced useful output wins even if another failed in the same
            # tick with an error that would end the request.
            for task in sorted(done, key=lambda t: t.cancelled() or t.exception() is not None):
                slot = running.pop(task)
                e = None if task.cancelled() else task.exception()
                if e is None and not task.cancelled():
                    if winner is None:
                        winner = (task, slot)
                    else:  # a second finisher in the same tick: it lost too
                        with ex.holding(slot):
                            ex.lost(slot)
                    continue
                if not isinstance(e, UpstreamError):
                    with ex.holding(slot):
                        raise e if e is not None else asyncio.CancelledError()
                with ex.holding(slot):
                    ex.failed(slot, e)
                errors.append(e)
                others = [s.name for s in running.values()] + pending
                if winner is None and not ex.committed and ex.ends_request(e, others):
                    await _reap(drop_all(cancelled=False))
                    await ex.send_failure(e)
                    return None
            if winner is not None:
                break
            if pending and launched < width and (time.monotonic() >= next_launch or not running):
                await launch()
                next_launch = time.monotonic() + delay
                continue
            if not done and ex.req.stream:
                if not ex.committed:
                    if ex.hold_remaining() <= 0 and running:
                        first = next(iter(running.values()))
                        await ex.commit_early(first.name, [s.made for s in running.values()])
                else:
                    await ex.ping()
    except (asyncio.CancelledError, ClientGone):
        drop_winner(cancelled=True)
        await _reap(drop_all(cancelled=True))
        raise
    except Exception:  # our own error in one participant: the others are dropped, nothing is left holding
        drop_winner(cancelled=False)
        await _reap(drop_all(cancelled=False))
        raise

    # The losers are cancelled and their connections closed now, but reaped only after the winner's first
    # bytes went out: waiting for their teardown first would add it to the time to first byte.
    loser_tasks = drop_all(cancelled=False)
    if winner is None:
        await _reap(loser_tasks)
        return pending

    task, slot = winner
    ex.record.race_won(slot.name, time.monotonic() - race_started)
    try:
        with ex.holding(slot):
            try:
                if ex.req.stream:
                    await ex.deliver_stream(slot, task.result())
                else:
                    await ex.deliver_body(slot, task.result())
            except UpstreamError as e:
                ex.failed(slot, e)
                errors.append(e)
                await ex.send_failure(e)
    finally:
        await _reap(loser_tasks)
    return None


async def _reap(tasks: list[asyncio.Task]) -> None:
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
