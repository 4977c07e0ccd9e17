"""Deferred bookkeeping: it waits until the loop would otherwise wait on an upstream (or a short timer), runs
in order, and one failing record never costs the others theirs."""

from __future__ import annotations

import asyncio
import logging

from coderouterd.after_response import AfterResponse


def test_deferred_work_runs_when_an_exchange_waits_on_its_upstream():
    async def go():
        after = AfterResponse(delay_s=60)  # the timer must not be what runs it here
        done = []
        after.defer(done.append, 1)
        after.defer(done.append, 2)
        await asyncio.sleep(0)
        assert done == [] and after.pending == 2
        after.while_waiting()
        assert done == []  # not inline: the caller first sends its upstream request
        sent = []
        asyncio.get_running_loop().call_soon(sent.append, "request")  # what aiohttp's writer task does next
        await asyncio.sleep(0)
        assert sent == ["request"] and done == []  # the request goes out first
        await asyncio.sleep(0)
        assert done == [1, 2] and after.pending == 0
    asyncio.run(go())


def test_the_timer_catches_the_last_request_of_a_burst():
    async def go():
        after = AfterResponse(delay_s=0.001)
        done = []
        after.defer(done.append, "x")
        for _ in range(200):
            if done:
                break
            await asyncio.sleep(0.005)
        assert done == ["x"]
    asyncio.run(go())


def test_one_failing_record_does_not_stop_the_others(caplog):
    after = AfterResponse()
    done = []

    def boom():
        raise ValueError("bad record")

    async def go():
        after.defer(boom)
        after.defer(done.append, "next")
        after.drain()
    with caplog.at_level(logging.ERROR):
        asyncio.run(go())
    assert done == ["next"]
    assert "recording a finished request failed" in caplog.text


def test_without_a_loop_work_runs_at_once():
    after = AfterResponse()
    done = []
    after.defer(done.append, 1)
    assert done == [1]
