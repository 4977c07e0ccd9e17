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


class AttemptFacts(Protocol):
    """What an attempt needs to know of its provider (routing/router.py's AttemptFacts)."""

    def context_window(self, provider: Provider) -> int: ...

    def named_tool_choice(self, provider: Provider) -> bool: ...

    def signatures_for(self, signer: str) -> UpstreamSignatures: ...


class Placing(Protocol):
    """Prefix affinity as one request uses it (routing/router.py's AffinityPlacement); only ever asked with a ticket
    its `ticket` gave."""

    def body_for(self, ticket: Ticket, provider: Provider, req: ClientRequest) -> tuple[dict, bytes]: ...

    async def place(self, ticket: Ticket, provider: Provider) -> Placement | None: ...

    def finish(self, ticket: Ticket | None, placement: Placement, provider: Provider, *, ok: bool,
               strategy: Strategy, request_id: str) -> None: ...

    def learn_unplaced(self, ticket: Ticket, provider: Provider, *, strategy: Strategy, request_id: str) -> None: ...

    def died(self, ticket: Ticket, provider: str) -> None: ...


class ExchangeRouter(Protocol):
    """What an exchange may ask its router (routing/router.py's `Router`): eleven members."""

    async def route(self, profile_name: str, profile: ProfileConfig, runtime: Generation,
                    req: ClientRequest) -> tuple[Plan, Ticket | None]:
        """The request's plan, and its prefix-affinity ticket (None: no affinity, or nothing to place by)."""
        ...

    def panic_order(self, names: list[str]) -> list[str]:
        """Best first among providers all out for a passing reason (panic)."""
        ...

    def lease(self, provider: str, *, background: bool = False) -> Lease:
        """The request's hold on one upstream: the only way it waits for a process, is admitted through the
        breaker and is counted in flight."""
        ...

    def availability(self, provider: str) -> Availability:
        """Whether the provider can take traffic now and why not (routing/availability.py): the words a refused
        admission, or a process that cannot start, is explained by."""
        ...

    async def reserve(self, provider: Provider, req: ClientRequest) -> object | None:
        ...

    def settle(self, reservation: object | None, provider: Provider, usage: dict | None) -> dict | None:
        ...

    def spent_cap(self, provider: str) -> str | None:
        """Why a budget-skipped provider cannot come back before its cap resets, or None."""
        ...

    def report(self, provider: str, admission: str, elapsed_s: float, error: UpstreamError | None = None) -> None:
        """How an attempt ended: served (`error` None) or failed; what counts against a provider is decided there."""
        ...

    @property
    def attempt(self) -> AttemptFacts: ...

    @property
    def placement(self) -> Placing | None:
        """Prefix affinity, or None when it is off."""
        ...

    def start_eta(self, provider: str) -> float | None:
        """Seconds until a process being started should be ready (None: not starting, or unknown): a Retry-After
        for the 529/503 a start under way made."""
        ...


class CallFactory(Protocol):
    """Makes one upstream call: providers/call.py's `Call` itself, or a test's scripted stand-in."""

    def __call__(self, provider: Provider, strategy: Strategy, *, raw_body: bytes, stream: bool,
                 client_headers: dict[str, str]) -> Call:
        ...
