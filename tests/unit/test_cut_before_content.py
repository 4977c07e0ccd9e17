"""A stream cut after the upstream reported its usage but before any content (a long prompt read, the client gone
while the model thinks) is billed for what the upstream counted: its input was processed, and the upstream bills
it (issue 41: a client that drops its streams must not spend without limit)."""

from __future__ import annotations

import asyncio

from coderouterd.guards.apply import BudgetHooks
from coderouterd.guards.budget import Budget
from coderouterd.state.store import Store
from tests.support.reservations import STREAM, config, providers_cfg
from tests.support.routing import FakeCall, Routing, ok

START = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
         b'"usage":{"prompt_tokens":50000,"completion_tokens":0,"total_tokens":50000}}\n\n')


READ = asyncio.Event()


class UsageThenNothing(FakeCall):
    """The upstream's first chunk reports the prompt's usage (stream_options include_usage, continuous usage) and
    nothing after it for as long as the client stays."""

    async def open(self) -> None:
        self.ups.sent.append((self.provider.name, self.raw_body))

    async def read(self, timeout: float) -> bytes | None:
        if self._chunks:
            self._chunks.clear()
            self.strategy.produced.openai({"choices": [], "usage": {"prompt_tokens": 50000}})
            self.strategy.usage = {"input_tokens": 50000, "output_tokens": 0}
            return START
        READ.set()  # the usage chunk was handed on: asked for the next
        await asyncio.Event().wait()
        return None


def test_a_stream_cut_after_usage_before_content_is_billed_for_its_input(tmp_path):
    async def go():
        budget = Budget(Store(tmp_path / "state.db"))
        budget.configure(providers_cfg(("a",), ""), global_cap_usd=10.0, warn_ratio=0.8)
        r = Routing(config(("a",), ""), budget=BudgetHooks(budget))
        r.ups.call_class = UsageThenNothing
        r.ups.script("a", ok(START))
        ex, sink = r.exchange(STREAM, ingress="openai")
        task = asyncio.ensure_future(ex.run())
        await asyncio.wait_for(READ.wait(), 30)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return budget, ex

    budget, ex = asyncio.run(go())
    assert budget.outstanding == 0
    assert budget.spent("a") >= 50000 / 1e6 * 1.0  # input $1/M: the prompt the upstream read
