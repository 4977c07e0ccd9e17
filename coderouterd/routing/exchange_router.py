"""The seam between one request's routine (the Exchange, routing/executor.py) and the router it runs against.

`ExchangeRouter` is everything an exchange (and race mode, through it) may ask its router: a plan, a lease on an
upstream (upstream/upstream.py: the breaker's admission, the wait for a process, the count in flight), a budget
reservation and its settling, the outcome of each attempt, and the few facts about providers and prefix affinity
an attempt needs. It is asked through methods,
never by reaching into the router's affinity or routing state, so that the router alone decides what they hold.
`routing.router.Router` is the one implementation; mypy checks that it fits (the Exchange's `router` parameter).

`CallFactory` makes one upstream call (providers/call.py's `Call`; tests give a scripted one).

Both are typing.Protocols for mypy only: nothing on the request path checks them at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..affinity.service import Placement, Ticket
    from ..config.schema import ProfileConfig
    from ..providers.call import Call
    from ..providers.errors import UpstreamError
    from ..providers.provider import Provider
    from ..providers.strategies import Strategy
    from ..translate.unsigned_thinking import UpstreamSignatures
    from ..upstream.upstream import Lease
    from .availability import Availability
    from .generation import Generation
    from .planner import Plan
    from .request import ClientRequest


class ExchangeRouter(Protocol):
    """What an exchange may ask its router (routing/router.py's `Router`)."""

    # -- planning -------------------------------------------------------------------------------------------

    def ticket(self, req: ClientRequest) -> Ticket | None:
        """The request's prefix-affinity ticket, or None (no affinity, or nothing to place by)."""
        ...

    async def server_counts(self, profile: ProfileConfig, runtime: Generation, req: ClientRequest) -> dict[str, int]:
        ...

    def plan(self, profile_name: str, profile: ProfileConfig, runtime: Generation, req: ClientRequest,
             ticket: Ticket | None = None, counts: dict[str, int] | None = None) -> Plan:
        ...

    def panic_order(self, names: list[str]) -> list[str]:
        ...

    # -- one attempt ----------------------------------------------------------------------------------------

    def lease(self, provider: str, *, background: bool = False) -> Lease:
        """The request's hold on one upstream: the only way it waits for a process, is admitted through the
        breaker and is counted in flight."""
        ...

    def availability(self, provider: str) -> Availability:
        """Whether the provider can take traffic now and why not (routing/availability.py): the words a refused
        admission is explained by."""
        ...

    async def reserve(self, provider: Provider, req: ClientRequest) -> object | None:
        ...

    def settle(self, reservation: object | None, provider: Provider, usage: dict | None) -> dict | None:
        ...

    def spent_cap(self, provider: str) -> str | None:
        ...

    def report_success(self, provider: str, latency_s: float, admission: str = ...) -> None:
        ...

    def report_failure(self, provider: str, e: UpstreamError, elapsed_s: float, admission: str = ...) -> None:
        ...

    # -- what an attempt needs to know ----------------------------------------------------------------------

    def context_window(self, provider: Provider) -> int:
        ...

    def named_tool_choice(self, provider: Provider) -> bool:
        ...

    def signatures_for(self, signer: str) -> UpstreamSignatures:
        ...

    # -- prefix affinity (only ever asked with a ticket `ticket` gave) ----------------------------------------

    def body_for(self, ticket: Ticket, provider: Provider, req: ClientRequest) -> tuple[dict, bytes]:
        ...

    async def place(self, ticket: Ticket, provider: Provider) -> Placement | None:
        ...

    def finish_placement(self, ticket: Ticket | None, placement: Placement, provider: Provider, *, ok: bool,
                         strategy: Strategy, request_id: str) -> None:
        """The attempt `place` placed is over: its slot is free again, and a success teaches the index."""
        ...

    def learn_unplaced(self, ticket: Ticket, provider: Provider, *, strategy: Strategy, request_id: str) -> None:
        """A success never placed (a race winner): what it cached still teaches the index."""
        ...

    def cannot_start_reason(self, provider: str) -> str | None:
        """Why this provider's process cannot start (its client is told so), or None."""
        ...


class CallFactory(Protocol):
    """Makes one upstream call: providers/call.py's `Call` itself, or a test's scripted stand-in."""

    def __call__(self, provider: Provider, strategy: Strategy, *, raw_body: bytes, stream: bool,
                 client_headers: dict[str, str]) -> Call:
        ...
