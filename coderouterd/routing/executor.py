"""Serving one request: try the planned providers in order (fallback), stream the winner to the client.

A streaming request holds its HTTP status until the first upstream event or `stream_hold_s`, whichever comes
first, so that an early failure is still a real HTTP error or a silent failover. After that the client has a
200 and gets `ping`s while the upstream is silent; a provider that fails before producing content can still be
replaced by the next one. Once content has been sent the request cannot move: the client gets a well-formed
error event and a clean end.
"""

from __future__ import annotations

import asyncio
import time

from ..ids import new_id
from ..ingress.errors import anthropic_type
from ..ingress.responder import Responder
from ..providers.call import Call
from ..providers.errors import BUDGET, IDLE_TIMEOUT, OVERFLOW, TOTAL_TIMEOUT, UpstreamError
from ..providers.runtime import Provider
from ..providers.strategies import strategy_for
from .request import ClientRequest

_OVERLOAD_STATUSES = {429, 503, 529}


class Exchange:
    """The life of one client request across its attempts. Collects the decision trace as it goes."""

    def __init__(self, req: ClientRequest, responder: Responder, *, runtime, router, profile: str) -> None:
        self.req = req
        self.resp = responder
        self.runtime = runtime
        self.router = router
        self.profile_name = profile
        self.profile = runtime.config.profiles[profile]
        self.server = runtime.config.server
        self.attempts: list[dict] = []
        self.skips: list[dict] = []
        self.committed = False
        self.served_by: str | None = None
        self.model_used: str | None = None
        self.usage: dict = {}
        self.status = 0
        self.error_class: str | None = None
        self.ttfb: float | None = None
        self.message_id = new_id("msg")
        self.plan = None
        self.race_outcome: str | None = None
        self.cost_usd = 0.0
        self.upstream_wait_s = 0.0
        self.affinity = None  # affinity.service.Ticket: session, lane, canonical prompt, what affinity did

    # -- bookkeeping ----------------------------------------------------------------------------------------

    def _note(self, provider: str, outcome: str, reason: str, started: float, status: int | None = None,
              message: str = "") -> None:
        self.attempts.append({
            "provider": provider, "outcome": outcome, "reason": reason, "status": status,
            "ms": round((time.monotonic() - started) * 1000, 2), "message": message[:300],
        })

    def skips_and_attempts(self) -> list[dict]:
        """The whole decision trace in order: what was skipped (and why), then each attempt."""
        return [{"provider": s["provider"], "outcome": "skipped", "reason": s["reason"]} for s in self.skips] + \
            [{k: a[k] for k in ("provider", "outcome", "reason", "status", "ms")} for a in self.attempts]

    def trace(self, latency_s: float) -> dict:
        """The decision trace of this request, for `corectl explain` and GET /v1/requests/{id}."""
        plan = self.plan
        return {
            "request_id": self.req.request_id, "ts": self.req.wall_started, "ingress": self.req.ingress,
            "stream": self.req.stream, "model_requested": self.req.model, "model_used": self.model_used,
            "profile": self.profile_name, "mode": self.profile.mode,
            "candidates": list(self.profile.providers),
            "effective_order": list(plan.candidates) if plan is not None else [],
            "order_notes": list(plan.order_notes) if plan is not None else [],
            "skips": list(self.skips), "attempts": list(self.attempts), "served_by": self.served_by,
            "status": self.status, "error_class": self.error_class, "race_outcome": self.race_outcome,
            "latency_ms": round(latency_s * 1000, 3),
            "ttfb_ms": round(self.ttfb * 1000, 3) if self.ttfb is not None else None,
            "usage": dict(self.usage), "cost_usd": self.cost_usd,
            "notes": list(getattr(self.req.native, "notes", ())),
            "affinity": self.affinity.note() if self.affinity is not None else None,
        }

    def attempts_header(self) -> str:
        parts = [f"{s['provider']}:skipped:{s['reason']}" for s in self.skips]
        parts += [f"{a['provider']}:{a['reason'] if a['outcome'] != 'ok' else 'ok'}" for a in self.attempts]
        return ",".join(parts)

    def _set_route_headers(self, provider: str | None) -> None:
        r = self.resp
        r.extra_headers.clear()
        if provider:
            r.add_header("x-coderouter-provider", provider)
        r.add_header("x-coderouter-profile", self.profile_name)
        r.add_header("x-coderouter-attempts", self.attempts_header())

    # -- main loop ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        aff = self.router.affinity
        self.affinity = aff.ticket(self.req, prompt_cache_key=self.req.session_key()) if aff is not None else None
        self.plan = plan = self.router.plan(self.profile_name, self.profile, self.runtime, self.req,
                                            ticket=self.affinity)
        self.skips = [{"provider": s.provider, "reason": s.reason, "message": s.message} for s in plan.skips]
        if not plan.candidates:
            await self._no_candidates()
            return
        if self.profile.mode == "race" and len(plan.candidates) > 1:
            from .race import run_race  # local import: race mode is the exception, not the hot path

            await run_race(self, plan.candidates)
            return
        errors: list[UpstreamError] = []
        candidates = list(plan.candidates)
        for i, name in enumerate(candidates):
            provider = self.runtime.providers[name]
            if not self.router.admit(name):
                self.skips.append({"provider": name, "reason": "breaker_open", "message": "circuit breaker open"})
                continue
            started = time.monotonic()
            try:
                await self.attempt(provider, started)
                return
            except UpstreamError as e:
                if e.reason == BUDGET:  # the reservation was refused: a budget gate, not a failure
                    self.router.release(name)
                    self.skips.append({"provider": name, "reason": "budget", "message": e.message})
                    continue
                self.router.report_failure(name, e, time.monotonic() - started)
                self._note(name, "failed", e.label, started, e.status, e.message)
                errors.append(e)
                if e.after_content:
                    await self._fail_committed(e)
                    return
                if e.reason == OVERFLOW:
                    if self._larger_window_ahead(e, candidates[i + 1:]):
                        continue
                    await self._overflow(e)
                    return
                if not e.failover:
                    await self._pass_error(e)
                    return
            except asyncio.CancelledError:
                self.router.release(name)
                self._note(name, "cancelled", "client_disconnected", started)
                self.status = 499
                raise
        if not errors:
            await self._no_candidates()
            return
        await self._all_failed(errors)

    def new_call(self, provider: Provider, model: str) -> Call:
        """An attempt at `provider`, translating between the client's wire and the provider's as needed.
        After a commit, an Anthropic client already has its message_start (a Responses client its
        response.created): the next provider's is dropped."""
        req = self.req
        cls = strategy_for(req.ingress, provider.cfg.kind, serves_responses=provider.cfg.serves_responses)
        body, raw = req.body, req.raw
        if self.affinity is not None:
            body, raw = self.router.affinity.body_for(self.affinity, provider, req)
        kw = {"model": model, "skip_prologue": self.committed and req.ingress != "openai", "client_body": body}
        if req.native is not None:
            kw["native"] = req.native
            kw["provider_name"] = provider.name
        if req.ingress == "anthropic" and cls.upstream_kind == "openai":
            kw["input_tokens"] = provider.estimate_tokens(len(req.raw))
        return Call(provider, cls(**kw), raw_body=raw, stream=req.stream, client_headers=req.headers)

    async def attempt(self, provider: Provider, started: float) -> None:
        req = self.req
        model = await provider.resolve_model(req.model)
        self.model_used = model
        call = self.new_call(provider, model)
        hooks = self.router.budget_hooks
        reservation = hooks.reserve(provider, req) if hooks is not None else None
        aff = self.router.affinity if self.affinity is not None else None
        placement = None
        ok = False
        try:
            if aff is not None:
                call.placement = placement = await aff.place(self.affinity, provider)
                if placement is not None:
                    call.extra_fields = placement.fields
            if req.stream:
                await self._stream(call, provider)
            else:
                await call.open()
                body = await call.result()
                self.ttfb = call.ttfb
                self._succeeded(provider, call, started)
                await self.resp.json(200, body)
            ok = True
        finally:
            call.close()
            self.upstream_wait_s += call.wait_s
            if placement is not None:
                aff.finish(self.affinity, placement, provider, ok=ok, strategy=call.strategy,
                           request_id=req.request_id)
            if reservation is not None:
                hooks.settle(reservation, provider, call.strategy.usage if ok or call.strategy.started_content
                             else None)

    def _succeeded(self, provider: Provider, call: Call, started: float) -> None:
        self.served_by = provider.name
        self.usage = call.strategy.usage or {}
        self.status = 200
        self._note(provider.name, "ok", "ok", started, 200)
        latency = call.ttfb if call.ttfb is not None else time.monotonic() - started
        self.router.report_success(provider.name, latency)
        prompt_tokens = (self.usage.get("input_tokens") or 0) + (self.usage.get("cache_read_input_tokens") or 0)
        if prompt_tokens:
            provider.learn_ratio(call.request_chars, prompt_tokens)
        if self.affinity is not None and call.placement is None:
            # A race winner: never slot-pinned, but what it cached still teaches the index.
            aff = self.router.affinity
            aff.finish(self.affinity, aff.unplaced(self.affinity, provider), provider, ok=True,
                       strategy=call.strategy, request_id=self.req.request_id)
        self._set_route_headers(provider.name)

    # -- streaming ------------------------------------------------------------------------------------------

    async def _first_output(self, call: Call) -> bytes:
        async def first() -> bytes:
            await call.open()
            while True:
                remaining = call.first_byte_deadline - time.monotonic()
                if remaining <= 0:
                    raise UpstreamError("first_byte_timeout", message="no event within the first-byte timeout")
                try:
                    data = await call.read(remaining)
                except TimeoutError:
                    continue
                if data is None or data:
                    return data or b""

        task = asyncio.ensure_future(first())
        try:
            if not self.committed:
                hold = self.req.started + self.server.stream_hold_s - time.monotonic()
                if hold > 0:
                    done, _ = await asyncio.wait((task,), timeout=hold)
                    if done:
                        return task.result()
                await self._commit(call.provider.name, (call,))
            while True:
                done, _ = await asyncio.wait((task,), timeout=self.server.ping_interval_s)
                if done:
                    return task.result()
                await self.resp.ping()
        finally:
            if not task.done():
                task.cancel()

    async def _commit(self, provider_name: str, calls) -> None:
        """Send the 200 and an Anthropic prologue before any upstream event: from now on the client waits on us.
        The `calls` still waiting are told first, before any await, so none emits a message_start after ours."""
        for c in calls:
            c.strategy.skip_prologue = self.req.ingress != "openai"  # chat streams have no prologue
        self._set_route_headers(provider_name)
        await self.resp.start_stream()
        self.committed = True
        est = int(len(self.req.raw) / 4)
        await self.resp.chunk(self.resp.prologue(self.req.model, self.message_id, est))

    async def _stream(self, call: Call, provider: Provider) -> None:
        started = call.started
        first = await self._first_output(call)
        self.ttfb = call.ttfb
        if not self.committed:
            self._set_route_headers(provider.name)
            await self.resp.start_stream()
            self.committed = True
        await self.resp.chunk(first)
        await self._pump(call)
        self._succeeded(provider, call, started)

    async def _pump(self, call: Call) -> None:
        resp = self.resp
        t = call.provider.cfg.timeouts
        ping_every = self.server.ping_interval_s
        last = time.monotonic()
        while True:
            now = time.monotonic()
            wait = min(ping_every, t.idle - (now - last), call.total_deadline - now)
            if wait <= 0:
                reason = TOTAL_TIMEOUT if call.total_deadline <= now else IDLE_TIMEOUT
                raise UpstreamError(reason, message=f"upstream {reason.replace('_', ' ')}",
                                    after_content=call.strategy.started_content)
            try:
                data = await call.read(wait)
            except TimeoutError:
                await resp.ping()
                continue
            if data is None:
                break
            last = time.monotonic()
            if data:
                await resp.chunk(data)
        await resp.end()

    # -- endings --------------------------------------------------------------------------------------------

    def _larger_window_ahead(self, e: UpstreamError, rest: list[str]) -> bool:
        needed = e.overflow[0] if e.overflow and e.overflow[0] else 0
        have = e.overflow[1] if e.overflow and e.overflow[1] else 0
        for name in rest:
            w = self.runtime.providers[name].cfg.context_window
            if w == 0 or w > max(have, needed):
                return True
        return False

    async def _send_error(self, status: int, message: str, *, error_type: str | None = None,
                          extra: dict | None = None, headers: list | None = None, code: str | None = None) -> None:
        self.status = status
        self.error_class = error_type or anthropic_type(status)
        if self.committed:
            await self.resp.stream_error(error_type or anthropic_type(status), message, code=code)
            return
        self._set_route_headers(None)
        if code and self.req.ingress != "anthropic":
            extra = {**(extra or {}), "code": code}
        await self.resp.error(status, message, error_type=error_type, extra=extra, headers=headers)

    async def _overflow(self, e: UpstreamError) -> None:
        n, m = e.overflow or (0, 0)
        if not n:
            n = int(len(self.req.raw) / 4)
        if not m or m >= n:
            m = max(1, n - 1) if not m else m
        # OpenAI-shaped clients (Codex) recognise the overflow by its code and compact their history.
        await self._send_error(400, f"prompt is too long: {n} tokens > {m} maximum",
                               error_type="invalid_request_error", code="context_length_exceeded")

    async def _pass_error(self, e: UpstreamError) -> None:
        status = e.status or 502
        await self._send_error(status, e.message, error_type=e.error_type if self.req.ingress == "anthropic" else None)

    async def _fail_committed(self, e: UpstreamError) -> None:
        self.status = 200
        self.error_class = e.reason
        etype = e.error_type or ("overloaded_error" if e.status in _OVERLOAD_STATUSES else "api_error")
        await self.resp.stream_error(etype, f"upstream {self.attempts[-1]['provider']} failed mid-stream: {e.message}")

    def _failure_summary(self) -> str:
        parts = [f"{s['provider']}: skipped ({s['reason']}: {s['message']})" for s in self.skips]
        for a in self.attempts:
            if a["outcome"] != "ok":
                parts.append(f"{a['provider']}: {a['reason']}" + (f" ({a['message']})" if a["message"] else ""))
        return "; ".join(parts)

    async def _all_failed(self, errors: list[UpstreamError]) -> None:
        summary = self._failure_summary()
        overloaded = bool(errors) and all(e.status in _OVERLOAD_STATUSES for e in errors)
        if not errors:
            # Every candidate was refused by its breaker: nothing was even tried.
            overloaded = True
        headers = None
        retry = [e.retry_after for e in errors if e.retry_after]
        if retry:
            headers = [(b"retry-after", str(int(max(1, min(retry)))).encode())]
        if self.req.ingress == "anthropic":
            status, etype = (529, "overloaded_error") if overloaded else (502, "api_error")
        elif self.req.ingress == "responses" and errors and all(e.status == 429 for e in errors):
            # Codex backs off on 429 + retry-after; a 503 would read as a server fault.
            status, etype = 429, "rate_limit_error"
        else:
            status, etype = (503, "overloaded_error") if overloaded else (502, "api_error")
        await self._send_error(status, f"all providers failed for profile {self.profile_name!r}: {summary}",
                               error_type=etype, headers=headers)

    async def _no_candidates(self) -> None:
        summary = self._failure_summary()
        transient = any(s["reason"] in ("breaker_open", "unhealthy", "budget") for s in self.skips)
        if transient:
            status = 529 if self.req.ingress == "anthropic" else 503
            await self._send_error(status, f"no provider available in profile {self.profile_name!r}: {summary}",
                                   error_type="overloaded_error")
        else:
            await self._send_error(400, f"no provider in profile {self.profile_name!r} can serve this request: "
                                        f"{summary}", error_type="invalid_request_error")
