"""Every way a request can end, against a real budget (the local ledger on SQLite, or the shared one on PostgreSQL):
the scenarios of issue 41's "no reservation outlives its request". Each builds a Routing over the given budget,
ends one request its own way, and returns the Exchange and the sink; the test then asks its budget whether any
reservation is still held.

Prices: input $1/M, output $100/M, max_tokens 5: a request reserves ~$0.0005 and the caps below are far from it,
except "over" (a provider whose own cap is already spent)."""

from __future__ import annotations

import asyncio

from coderouterd.config.loader import parse_config_text
from coderouterd.guards.apply import BudgetHooks
from coderouterd.providers.errors import DISCONNECT, UpstreamError, http_error
from tests.support.routing import FakeCall, FakeSink, Routing, chain_config, fail, gated, hang, midstream, ok

PAID = 'paid = true\ncost = { input = 1.0, output = 100.0 }\nmonthly_budget_usd = 5.0\n'
OVER = 'paid = true\ncost = { input = 1.0, output = 100.0 }\nmonthly_budget_usd = 0.0001\n'
PROVIDERS = {"a": PAID, "b": PAID, "over": OVER}
BODY = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**BODY, "stream": True}
SSE = b'data: {"choices":[{"index":0,"delta":{"content":"hello there"}}]}\n\n'

# name -> (chain, extra profile lines, body)
ENDINGS: dict[str, tuple[tuple[str, ...], str, dict]] = {
    "served": (("a",), "", BODY),
    "served_stream": (("a",), "", STREAM),
    "skipped": (("over", "a"), "", BODY),  # the paid provider over its cap is skipped for budget, the next serves
    "refused": (("over",), "panic = false", BODY),  # nothing fits: the budget's refusal
    "failed_over": (("a", "b"), "", BODY),
    "cancelled": (("a",), "", BODY),
    "client_gone": (("a",), "", STREAM),
    "race_served": (("a", "b"), 'mode = "race"\nrace_width = 2', STREAM),
    "race_client_gone_while_launching": (("a", "b"), 'mode = "race"\nrace_width = 2', STREAM),
    "race_same_tick": (("a", "b"), 'mode = "race"\nrace_width = 2', BODY),
    "broke_mid_stream": (("a",), "", STREAM),  # the upstream broke after content: the client got an error event
    "garbled_usage": (("a",), "", BODY),  # the upstream's usage cannot be priced: settled at the estimate
}


def config(chain: tuple[str, ...], extra: str) -> str:
    return chain_config(*chain, extra_profile=extra, provider_extra={p: PROVIDERS[p] for p in chain})


def providers_cfg(chain: tuple[str, ...], extra: str):
    return parse_config_text(config(chain, extra), "test").providers


async def end_request(name: str, budget) -> tuple:
    """One request ended the way `name` says, over `budget` (Budget or SharedBudget, configured by the caller
    with `providers_cfg`). Returns (exchange, sink)."""
    chain, extra, body = ENDINGS[name]
    r = Routing(config(chain, extra), budget=BudgetHooks(budget))
    if name in ("served", "served_stream", "skipped", "race_served"):
        r.ups.script("a", ok(SSE) if body.get("stream") else ok())
        r.ups.script("b", hang())
        return await r.serve(body, ingress="openai")
    if name == "garbled_usage":
        # Unpriceable usage, and our own code tripping over it after the answer: an exception path that must
        # still settle (the request itself fails on our error; the daemon answers such a one with a 500).
        r.ups.call_class = GarbledUsageCall
        ex, sink = r.exchange(body, ingress="openai")
        try:
            await ex.run()
        except TypeError:
            pass
        return ex, sink
    if name == "broke_mid_stream":
        r.ups.script("a", midstream(SSE, UpstreamError(DISCONNECT, message="upstream went away", after_content=True)))
        return await r.serve(body, ingress="openai")
    if name == "refused":
        return await r.serve(body, ingress="openai")
    if name == "failed_over":
        r.ups.script("a", fail(http_error(500, "boom")))
        r.ups.script("b", ok())
        return await r.serve(body, ingress="openai")
    if name == "cancelled":
        r.ups.script("a", hang())
        ex, sink = r.exchange(body, ingress="openai")
        task = asyncio.ensure_future(ex.run())
        for _ in range(500):
            if r.ups.sent:
                break
            await asyncio.sleep(0.01)
        assert r.ups.sent, "the attempt never started"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return ex, sink
    if name == "client_gone":
        r.ups.script("a", ok(SSE, SSE))
        sink = FakeSink(opens_stream_itself=False, gone_on="event")
        ex, sink = r.exchange(body, ingress="openai", sink=sink)
        try:
            await ex.run()
        except Exception:
            pass
        return ex, sink
    if name == "race_client_gone_while_launching":
        # "a" is running; the client leaves while "b" is being launched (its model being resolved).
        r.ups.script("a", hang())
        r.ups.script("b", hang())
        resolving = asyncio.Event()
        never = asyncio.Event()

        async def resolve_forever(requested: str) -> str:
            resolving.set()
            await never.wait()
            return "m"

        r.runtime.providers["b"].resolve_model = resolve_forever  # type: ignore[method-assign]
        ex, sink = r.exchange(body, ingress="openai")
        task = asyncio.ensure_future(ex.run())
        await asyncio.wait_for(resolving.wait(), 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return ex, sink
    if name == "race_same_tick":
        # One participant answers and the other fails with an error that would end the request, in one tick.
        gate = asyncio.Event()
        r.ups.script("a", gated(gate))
        r.ups.script("b", gated(gate, http_error(400, "bad request")))
        ex, sink = r.exchange(body, ingress="openai")
        task = asyncio.ensure_future(ex.run())
        for _ in range(500):
            if len(r.ups.sent) == 2:
                break
            await asyncio.sleep(0.01)
        gate.set()
        await task
        return ex, sink
    raise AssertionError(name)


class GarbledUsageCall(FakeCall):
    async def result(self) -> bytes:
        body = await super().result()
        self.strategy.usage = {"input_tokens": "a great many", "output_tokens": {"n": 2}}
        return body
