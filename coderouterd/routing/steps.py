"""One attempt's slot, and the Exchange's public steps that the race and the waits are written against.

`Exchange` (executor.py) is the routine; race mode (race.py) and the waits for a starting process (waiting.py)
drive it only through the steps named here. They name it by this protocol, not by the class, so the executor
imports them and they do not import it back: the executor is the one module above the other two."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..providers.call import Call
from ..providers.provider import Provider

if TYPE_CHECKING:
    from ..affinity.service import Placement
    from ..config.schema import ProfileConfig, ServerConfig
    from ..providers.errors import UpstreamError
    from ..upstream.upstream import Lease
    from .exchange_router import ExchangeRouter
    from .generation import Generation
    from .record import RequestRecord
    from .request import ClientRequest


@dataclass(slots=True, eq=False)
class Slot:
    """One admitted attempt at one provider: what must be given back however the attempt ends (the breaker's
    trial slot, a budget reservation, the upstream connection). `Exchange.holding` guarantees it."""

    provider: Provider
    admission: str  # its lease's admission through the breaker: "closed" | "trial" | "panic"
    started: float
    lease: Lease  # the request's hold on the upstream: its trial slot, its count in flight (upstream/upstream.py)
    reservation: object | None = None
    call: Call | None = None
    done: bool = False  # its outcome was reported to the router
    ok: bool = False
    bill: dict | None = None  # usage to settle a budget reservation with, when the call cannot say (race loser)
    panic: bool = False  # tried in panic mode (whatever its breaker said)
    name: str = ""
    placement: Placement | None = None  # affinity's slot placement for this attempt, finished with it

    def __post_init__(self) -> None:
        self.name = self.provider.name

    @property
    def made(self) -> Call:
        """The attempt's call, once `new_call` made it (delivering and learning happen only after that)."""
        call = self.call
        if call is None:
            raise RuntimeError(f"attempt at {self.name} has no call yet")
        return call


class Steps(Protocol):
    """What race.py and waiting.py may ask of an Exchange: its inputs, and the steps fallback uses too."""

    @property
    def req(self) -> ClientRequest: ...

    @property
    def profile(self) -> ProfileConfig: ...

    @property
    def server(self) -> ServerConfig: ...

    @property
    def runtime(self) -> Generation: ...

    @property
    def router(self) -> ExchangeRouter: ...

    @property
    def record(self) -> RequestRecord: ...

    @property
    def committed(self) -> bool: ...

    async def open_slot(self, name: str) -> Slot | None: ...

    def holding(self, slot: Slot) -> AbstractContextManager[Slot]: ...

    def new_call(self, slot: Slot, model: str) -> Call: ...

    async def first_output(self, call: Call, *, until_content: bool = False) -> bytes: ...

    def failed(self, slot: Slot, e: UpstreamError) -> None: ...

    def lost(self, slot: Slot, *, cancelled: bool = False) -> None: ...

    def ends_request(self, e: UpstreamError, rest: list[str]) -> bool: ...

    async def send_failure(self, e: UpstreamError) -> None: ...

    def hold_remaining(self) -> float: ...

    async def commit_early(self, provider_name: str, calls: Sequence[Call]) -> None: ...

    async def ping(self) -> None: ...

    async def deliver_body(self, slot: Slot, body: bytes) -> None: ...

    async def deliver_stream(self, slot: Slot, first: bytes) -> None: ...

    async def try_in_order(self, names: list[str], errors: list[UpstreamError]) -> bool: ...
