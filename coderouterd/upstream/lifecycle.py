"""One upstream's life as routing sees it: whether its process can take a request now, is coming, is going, or will
not come back by itself, and why, in the words every client is told.

It is a state machine with an explicit table, like supervise/spec.py's: a move the table does not name is a bug
in whoever asked for it; it is refused and logged (never raised into a request or the supervisor's callback).
Who moves it: the supervisor's process events (through `Upstreams.process_event`) and the on-demand scheduler
(through the effects it acts by). Nobody else writes "down".

An upstream without a managed process is RESIDENT for its whole life.
"""

from __future__ import annotations

import asyncio
import enum
import logging

log = logging.getLogger("coderouterd.upstream")


class Phase(enum.StrEnum):
    RESIDENT = "resident"  # ready (or not managed): takes requests
    STARTING = "starting"  # a start or restart under way; requests may wait for it (the ready event)
    DRAINING = "draining"  # chosen to stop (idle, room, by hand): no new request; those in flight finish
    STOPPED_ON_DEMAND = "stopped_on_demand"  # stopped; the next request that needs it starts it
    STOPPED = "stopped"  # stopped by hand (or a stop not ours): stays so until started
    CANNOT_START = "cannot_start"  # a start failed for a reason that holds (no room, a file missing, timed out)
    FATAL = "fatal"  # the supervisor gave up on it; `corectl start` brings it back


P = Phase
# The only moves; a start may come from any stopped or failed phase, readiness only from a start (or an adoption
# of a server found running, from any phase but draining), a stop only from a phase that holds a process.
MOVES: dict[Phase, frozenset[Phase]] = {
    P.RESIDENT: frozenset({P.STARTING, P.DRAINING, P.STOPPED, P.STOPPED_ON_DEMAND, P.FATAL}),
    P.STARTING: frozenset({P.RESIDENT, P.STARTING, P.DRAINING, P.STOPPED, P.STOPPED_ON_DEMAND, P.CANNOT_START,
                           P.FATAL}),
    # Back to RESIDENT: a stop that did not happen (an external process, an error); it serves on.
    P.DRAINING: frozenset({P.RESIDENT, P.STOPPED, P.STOPPED_ON_DEMAND, P.STARTING, P.FATAL}),
    # FATAL straight from a stopped phase: a start whose command cannot even run (`corectl start`).
    P.STOPPED_ON_DEMAND: frozenset({P.STARTING, P.RESIDENT, P.STOPPED, P.CANNOT_START, P.FATAL}),
    P.STOPPED: frozenset({P.STARTING, P.RESIDENT, P.STOPPED_ON_DEMAND, P.CANNOT_START, P.FATAL}),
    P.CANNOT_START: frozenset({P.STARTING, P.RESIDENT, P.STOPPED, P.STOPPED_ON_DEMAND, P.CANNOT_START, P.FATAL}),
    P.FATAL: frozenset({P.STARTING, P.RESIDENT, P.STOPPED, P.CANNOT_START, P.FATAL}),
}
# Phases in which the process does not come back by itself: a request is told why at once.
NOT_COMING = frozenset({P.STOPPED, P.CANNOT_START, P.FATAL})


class Lifecycle:
    """The phase, why (for the client), the process's name, while STARTING how long a request may wait, and how
    many moves it has made (a wait for the next one is `left`; a start or stop ending is `settled`)."""

    __slots__ = ("provider", "phase", "why", "process", "wait_s", "since", "ours", "moves", "_moved")

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.phase = Phase.RESIDENT
        self.why = ""
        self.process = ""
        self.wait_s = 0.0
        self.since = 0.0  # clock time of the last move (a start's window ends at since + wait_s)
        self.ours = False  # DRAINING or stopped for a reason of the scheduler's (idle, room): a request restarts it
        self.moves = 0  # changes of phase so far: RESIDENT with another count than before is not the same stay
        self._moved: asyncio.Event | None = None  # set (and dropped) at the next move, whatever it is

    @property
    def resident(self) -> bool:
        return self.phase is Phase.RESIDENT

    def move(self, new: Phase, why: str = "", *, process: str = "", wait_s: float = 0.0, ours: bool = False,
             now: float = 0.0) -> bool:
        """Move to `new` (a move to the same phase updates its words). False, logged, when the table refuses."""
        old = self.phase
        if new is not old and new not in MOVES[old]:
            log.warning("upstream %s: refused lifecycle move %s -> %s (%s)", self.provider, old, new, why)
            return False
        self.phase = new
        self.why = why
        self.process = process or self.process
        self.wait_s = wait_s if new is Phase.STARTING else 0.0
        self.since = now
        self.ours = ours
        if new is not old:
            self.moves += 1
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()
        return True

    async def settled(self, timeout: float) -> bool:
        """Wait (at most `timeout`) until the current start or stop has ended. True when it has."""
        if self.phase not in (Phase.STARTING, Phase.DRAINING):
            return True
        return await self.left(self.phase, timeout)

    async def left(self, phase: Phase, timeout: float) -> bool:
        """Wait (at most `timeout`) until the phase is no longer `phase`. True when it is not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while self.phase is phase:
            if self._moved is None:
                self._moved = asyncio.Event()
            ev = self._moved
            try:
                async with asyncio.timeout_at(deadline):
                    await ev.wait()
            except TimeoutError:
                return self.phase is not phase
        return True

    def start_left(self, now: float) -> float | None:
        """Seconds left in a start's window (None: not starting): when it has come up or failed, at the latest."""
        if self.phase is not Phase.STARTING or self.wait_s <= 0:
            return None
        return max(0.0, self.since + self.wait_s - now)

    def words(self) -> str:
        """Why a provider out of routing is so, for the client ("llama's managed process llama is fatal; ...")."""
        return f"{self.provider}'s {self.why or down_why('', '', coming=True)}"


def down_why(state: str, process: str, *, coming: bool) -> str:
    what = f"managed process {process}" if process else "managed process"
    if coming or not state:
        return f"{what} is not ready" + (f" ({state})" if state else "")
    # Not coming back by itself (fatal, stopped): say so, and what brings it back.
    return f"{what} is {state}; `corectl restart {process}` starts it again" if process else f"{what} is {state}"
