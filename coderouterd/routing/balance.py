"""`mode = "balance"`: a profile whose providers are replicas of one model, each turn sent to the one expected to
answer first.

- A new conversation (its lane continues no history) goes to the replica with the shortest queue, then the most
  free slots; among equals, the one holding fewest lanes, then the one picked least (a burst of new conversations
  arriving together spreads before any of them is placed).
- A returning turn goes where one cost is lowest: the prefill still to compute there (the prompt's tokens minus
  what that replica is expected to hold of it, at the replica's own measured prefill speed) plus the wait for the
  load ahead of it. So the replica holding the lane's prefix wins unless its queue costs more than recomputing
  the prefix elsewhere.

The load is the larger of what this daemon has in flight there and what the replica's own `/slots` says is
processing (other clients may use it directly); `/slots` also caps what a replica is believed to hold (a replica
that restarted holds nothing, whatever was sent to it before). `/slots` is polled in the background, at most every
POLL_S per replica, and only for the replicas of a balance profile being planned: the plan never waits for it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .planner import Plan

if TYPE_CHECKING:
    from ..affinity.index import PrefixIndex, ProviderPrefixes
    from ..affinity.service import Ticket
    from ..kvcache.cache import KVCache
    from ..providers.provider import Provider
    from ..providers.server_info import ServerDirectory
    from ..servers.llamacpp import LlamaServer, SlotState

POLL_S = 0.5  # a replica's /slots is asked at most this often
STALE_S = 5.0  # an answer older than this says nothing about the load now
POLL_TIMEOUT_S = 1.0
DEFAULT_TURN_S = 2.0  # a turn's duration on a replica that has not answered one yet
MAX_MOVES = 256


@dataclass(frozen=True, slots=True)
class Live:
    """A replica's `/slots` as last read: slots processing, slots in all, the most tokens any slot holds."""

    processing: int
    total: int
    held: int | None
    at: float


def live_from(states: list[SlotState], at: float) -> Live:
    known = [s.tokens for s in states if s.tokens is not None]
    return Live(sum(1 for s in states if s.processing), len(states), max(known) if known else None, at)


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica as this decision sees it."""

    name: str
    prompt_tokens: int  # the request's prompt, in this replica's tokens
    cached_tokens: int  # of which it is expected to hold
    busy: int  # requests running or queued there
    width: int  # its slots
    prefill_s: float  # computing the uncached part
    wait_s: float  # the load ahead of this request
    lanes: int  # lanes whose last turn it served
    picks: int  # times this balancer picked it

    @property
    def queue(self) -> int:
        """Requests ahead of this one that it must wait for: none while a slot is free."""
        return max(0, self.busy - self.width + 1)

    @property
    def free(self) -> int:
        return max(0, self.width - self.busy)

    @property
    def cost_s(self) -> float:
        return self.prefill_s + self.wait_s


def replica(name: str, index: PrefixIndex | None, ticket: Ticket | None, live: Live | None, *, lanes: int = 0,
            picks: int = 0) -> Replica:
    """What `name` would cost this request, from the prefix index (what it holds, how fast it is, what this
    daemon has in flight there) and its own `/slots` (`live`, None when unknown or stale)."""
    p = index.providers.get(name) if index is not None else None
    width = len(p.slots.slots) if p is not None and p.slots is not None else 0
    if live is not None and live.total:
        width = live.total
    width = max(1, width)
    # The upstream's one in-flight count (the index reads it from the Upstream), and the replica's own /slots.
    busy = max(index.in_flight(name) if index is not None else 0, live.processing if live is not None else 0)
    mean = p.mean_duration_s if p is not None and p.mean_duration_s else DEFAULT_TURN_S
    wait_s = max(0, busy - width + 1) * mean / width
    if index is None or ticket is None:
        return Replica(name, 0, 0, busy, width, 0.0, wait_s, lanes, picks)
    if p is None:
        # A replica that never answered here holds nothing of this prompt and computes it at the default speed
        # until measured. Costing it nothing made a conversation's second turn leave the replica holding its
        # prefix for one that had not yet served anything.
        from ..affinity.index import ProviderPrefixes

        p = ProviderPrefixes()
    prompt = ticket.prompt
    bpt = p.bytes_per_token
    total = int(prompt.size / bpt)
    cached = int(index.predict(name, ticket.lane, prompt) * p.realised / bpt)
    if live is not None and live.held is not None and live.at >= _last_finish(p):
        # No slot holds more than the server says its fullest one does (a replica that restarted holds nothing).
        # Only a reading taken after this daemon's last answer there says so: an older one predates what that
        # answer left in its slot.
        cached = min(cached, live.held)
    cached = min(cached, total)
    return Replica(name, total, cached, busy, width, (total - cached) * p.s_per_token, wait_s, lanes, picks)


def _last_finish(p: ProviderPrefixes) -> float:
    return max((s.last_used for s in p.slots.slots), default=0.0) if p.slots is not None else 0.0


def rank(replicas: list[Replica], *, new: bool) -> list[Replica]:
    """Best first. Stable: the profile's order breaks the last ties."""
    if new:
        return sorted(replicas, key=lambda r: (r.queue, -r.free, r.lanes, r.picks, r.cost_s))
    return sorted(replicas, key=lambda r: (_rounded(r.cost_s), -r.cached_tokens, r.queue, r.picks))


def _rounded(s: float) -> float:
    # Costs within a millisecond are equal: the tie-breaks decide, not float noise.
    return math.floor(s * 1000)


def why(chosen: Replica, others: list[Replica], *, new: bool) -> str:
    """The words `corectl explain` shows: "prefix 3,112 of 3,400 tokens cached on gpu2; queue 1 ahead"."""
    ahead = f"queue {chosen.queue} ahead" if chosen.queue else f"{chosen.free} of {chosen.width} slots free"
    if new:
        head = f"new conversation: {ahead} on {chosen.name}"
    else:
        head = (f"prefix {chosen.cached_tokens:,} of {chosen.prompt_tokens:,} tokens cached on {chosen.name}; "
                f"{ahead}")
    if others:
        head += " (" + ", ".join(
            f"{r.name}: {r.cached_tokens:,} cached, queue {r.queue}, cost {r.cost_s:.2f}s" for r in others) + ")"
    return "balance: " + head


class Balancer:
    """Orders a balance profile's candidates; polls the replicas' `/slots` in the background. One per router."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._live: dict[str, Live] = {}
        self._asked: dict[str, float] = {}
        self._picks: dict[str, int] = {}
        self._tasks: set[asyncio.Task] = set()
        # lane -> the replica it was last served by, now unavailable: its saved slot state is to follow the lane
        # to wherever it is placed, when both run on this machine (kvcache/move.py). Bounded: a lane never placed
        # (its request failed before) is forgotten with the oldest.
        self._moves: dict[str, str] = {}

    def live(self, name: str) -> Live | None:
        got = self._live.get(name)
        return got if got is not None and self.clock() - got.at <= STALE_S else None

    def picks(self, name: str) -> int:
        return self._picks.get(name, 0)

    def order(self, candidates: list[str], ticket: Ticket | None, index: PrefixIndex | None,
              moved_back: Iterable[str] = (), *, pick: bool = True) -> tuple[list[str], list[dict]]:
        """(new order, order notes). Candidates health or adaptive moved back (and paid ones, apply_balance) stay behind
    the others, in the order they came."""
        back = set(moved_back)
        pool = [c for c in candidates if c not in back]
        if not pool:
            return candidates, []
        lanes = _lanes_held(index)
        views = [replica(c, index, ticket, self.live(c), lanes=lanes.get(c, 0), picks=self.picks(c)) for c in pool]
        new = ticket is None or not ticket.continues
        ranked = rank(views, new=new)
        first = ranked[0]
        if pick:
            self._picks[first.name] = self._picks.get(first.name, 0) + 1
        order = [r.name for r in ranked] + [c for c in candidates if c in back]
        words = why(first, ranked[1:], new=new)
        last = index.last_prompt(ticket.lane) if index is not None and ticket is not None and not new else None
        if last is not None and last[0] not in candidates:
            # Its replica is down (or skipped): the lane moves, and its saved slot state with it where it can.
            self.moving(ticket, last[0])  # type: ignore[arg-type]
            words += f"; its lane moves from {last[0]}, which is not available"
        return order, [{"provider": first.name, "moved": "front" if order[0] != candidates[0] else "none",
                        "why": words}]

    def moving(self, ticket: Ticket, src: str) -> None:
        """The ticket's lane leaves `src` (down, or its server died under an attempt of this request): its saved
        slot state is to follow it to wherever it is placed next (`follow`)."""
        if ticket.lane_label is None:
            return  # (no lane named: nothing of it was placed anywhere)
        self._moves[ticket.lane] = src
        while len(self._moves) > MAX_MOVES:
            del self._moves[next(iter(self._moves))]

    def follower(self, ticket: Ticket | None, dst: str, kv: KVCache) -> Callable[[], Awaitable[dict | None]] | None:
        """For a placement on `dst`: None unless the ticket's lane is moving off an unavailable replica; else what
        the placement awaits once `dst`'s key is known and before its slot is chosen (affinity/service.py), so
        the slot is chosen with the moved file (`follow`)."""
        if not self._moves or ticket is None or ticket.lane_label is None or ticket.lane not in self._moves:
            return None  # (no lane named yet: this request was not balanced, and naming one costs its digests)
        return lambda: self.follow(ticket, dst, kv)

    async def follow(self, ticket: Ticket | None, dst: str, kv: KVCache) -> dict | None:
        """A lane moving off an unavailable replica takes its saved slot state along when both servers run here
        and the file was saved under `dst`'s key (kvcache/move.py). What moved, for the request's record:
        {"from": the replica, "tokens": what the file holds}, or None. Once per move, whichever replica the lane
        lands on."""
        if not self._moves or ticket is None or ticket.lane_label is None:
            return None
        src = self._moves.pop(ticket.lane, None)
        if src is None:
            return None
        from ..kvcache.move import move_lane

        # Shielded: a request cancelled mid-move (its client left) must not leave the file renamed and the tables
        # not told, or the other way round.
        tokens = await asyncio.shield(move_lane(kv, ticket.lane, src, dst))
        return None if tokens is None else {"from": src, "tokens": tokens}

    # -- the replicas' own state -------------------------------------------------------------------------------

    def poll(self, providers: Mapping[str, Provider], server: Callable[[Provider], LlamaServer | None]) -> None:
        """Ask each replica's `/slots` in the background when its last answer is older than POLL_S. `server`: the
        replica as a llama-server (servers/llamacpp.LlamaServer), None when it is not one."""
        now = self.clock()
        for name, provider in providers.items():
            if now - self._asked.get(name, -math.inf) < POLL_S:
                continue
            srv = server(provider)
            if srv is None:
                continue
            self._asked[name] = now
            try:
                task = asyncio.get_running_loop().create_task(self._read(name, srv))
            except RuntimeError:  # no loop (a synchronous caller, e.g. a status view): nothing to poll with
                return
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(self, name: str, srv: LlamaServer) -> None:
        # Stamped when asked, not when answered: an answer that finished while the question was in flight may
        # or may not be in the reading, so only a reading asked after it may cap what that answer left cached
        # (`replica`). Stamped on arrival, a reading taken before a turn's answer capped the lane's prefix on
        # its own replica to nothing, and the conversation's next turn left it.
        asked = self.clock()
        try:
            async with asyncio.timeout(POLL_TIMEOUT_S):
                states = await srv.slot_states()
        except (OSError, TimeoutError, ValueError):
            states = None
        if states is None:
            self._live.pop(name, None)  # unknown: the daemon's own in-flight count decides alone
            return
        self._live[name] = live_from(states, asked)

    def status(self, name: str) -> dict | None:
        """For the dashboard: a replica's live load and cache, as last read."""
        got = self.live(name)
        if got is None:
            return None
        return {"processing": got.processing, "slots": got.total, "held_tokens": got.held,
                "age_s": round(self.clock() - got.at, 2), "picks": self.picks(name)}

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _lanes_held(index: PrefixIndex | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if index is None:
        return out
    for prov, _prompt, _tokens in index.lanes.values():
        out[prov] = out.get(prov, 0) + 1
    return out


def apply_balance(balancer: Balancer, plan: Plan, ticket: Ticket | None, index: PrefixIndex | None,
          providers: Mapping[str, Provider], servers: ServerDirectory | None, *, pick: bool = True) -> None:
    """The planner's hook for a balance profile: reorder the plan's candidates, note why, and ask the replicas'
    `/slots` again when due (for the next request: this one is planned on what is known now). `pick`: False for a
    plan that is only shown (a status view): it counts no pick."""
    moved_back = {str(n["provider"]) for n in plan.order_notes if n.get("moved") == "back"}
    # A paid provider is no replica of a local model: it stays behind them, in chain order, as the chain's failover.
    moved_back |= {c for c in plan.candidates if c in providers and providers[c].cfg.paid}
    plan.candidates, notes = balancer.order(plan.candidates, ticket, index, moved_back, pick=pick)
    plan.order_notes.extend(notes)
    if servers is not None:
        balancer.poll({c: providers[c] for c in plan.candidates if c in providers},
                      lambda prov: _as_llama(prov, servers))


def _as_llama(provider: Provider, servers: ServerDirectory) -> LlamaServer | None:
    from ..providers.server_http import llama_server

    info = servers.info(provider)
    return llama_server(provider) if info is not None and info.slots else None
