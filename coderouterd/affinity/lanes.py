"""Which lane a request belongs to: the lane whose last prompt it extends, by the longest shared prefix.

A lane is a run of requests that each extend the one before (a conversation's turns, a subagent's turns): it
keeps one backend slot so each turn finds its prefix cached. Request shape (tools or not, the model named) says
nothing reliable about that: a client run without tools, or Claude Code's compaction call, looks like a side
call. So the prompt decides:

- the longest prefix the request shares with any lane's last prompt wins, when it reaches past the system
  prompt and tools (`Prompt.lead`): those are shared by every session of a client and name none of them;
- among lanes sharing that prefix, one whose last prompt the request extends whole wins, then the request's
  own session, tools, model, the most recent (tie-breaks only);
- a request that only partly shares another named session's lane forks a lane of its own (two conversations
  that began alike);
- a request that shares no more than the system prompt and tools but carries the same first message and at
  least the history of one of its session's lanes is that lane's next turn with a changed system prompt or
  tools: it stays in the lane, so the change is named as a cache bust rather than hidden as a new lane. Claude
  Code's compaction call (the whole history, no tools) is one: whether the server can reuse that history
  depends on where its chat template renders tools (docs/decisions.md, "Lanes by prefix"), and the lane's
  history is dead after it;
- a request whose longest shared prefix no continued lane holds (a title call's own system prompt), held by a
  spare lane of its session, is that side lane's next call: saved and restored like a conversation, evicted
  first (`spare`);
- anything else starts a lane: a new session, a subagent, a session's first title call.

Lanes hold whole-segment digests (`Prompt.whole`); one adopted from a restored slot table holds its slot's,
cut finer, until its next turn: both are the same running hash at segment ends, so the search still finds it.
The lookup costs a binary search over the request's prefix digests (chained: prefix k is shared exactly when
the k-th digests are equal) in a map from prefix digest to the lanes holding it, bounded in lanes and entries.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .canonical import Prompt, common_prefix

MAX_LANES = 256
MAX_ENTRIES = 65_536  # prefix digests indexed over all lanes (~100 bytes each)
MAX_LANE_SEGMENTS = 4096  # a longer prompt is indexed on its first segments: it still finds its lane


@dataclass(slots=True)
class Lane:
    name: str
    session: str | None  # the session key that started it; None when adopted from a restored slot table
    named: bool  # the session was named by the client (header, metadata, prompt_cache_key), not a fingerprint
    digests: tuple[bytes, ...] = ()
    head_key: tuple[str, str] | None = None  # (session, first message) of its last prompt
    tools: bool | None = None
    model: str | None = None
    messages: int = -1  # message segments of its last prompt (-1: unknown)
    message_bytes: int = -1
    size: int = 0  # bytes of its last prompt
    continued: int = 0  # requests that continued its history (0: a side lane, one-off calls only)
    seq: int = 0


class LaneIndex:
    def __init__(self, *, max_lanes: int = MAX_LANES, max_entries: int = MAX_ENTRIES) -> None:
        self.lanes: OrderedDict[str, Lane] = OrderedDict()  # least recently used first
        self.max_lanes = max_lanes
        self.max_entries = max_entries
        # prefix digest -> the lane holding it, or a dict of them when several do (most share nothing)
        self._by_digest: dict[bytes, str | dict[str, None]] = {}
        self._by_head: dict[tuple[str, str], str] = {}  # (session, first message) -> lane
        self._sessions: dict[str, dict[str, None]] = {}  # session -> its lanes
        self._entries = 0
        self._seq = 0

    # -- choosing -------------------------------------------------------------------------------------------

    def resolve(self, prompt: Prompt, *, session: str, named: bool, tools: bool, model: str | None) -> \
            tuple[str, str, bool]:
        """(lane, why, whether the request continues the lane's history) for this request; the lane now ends
        with `prompt`. Only a continuation can be a cache bust: a side lane's next call is not one. Whole
        segments only (`Prompt.whole`): a long first message that begins like another session's names nothing."""
        prompt = prompt.whole
        lane, why, continues = self._match(prompt, session, named, tools, model)
        if lane is None:
            lane = self._new_name(session, prompt)
            self.lanes[lane] = Lane(lane, session, named)
        ln = self.lanes[lane]
        ln.continued += continues
        self._update(ln, prompt, session=session, named=named, tools=tools, model=model)
        return lane, why, continues

    def _match(self, p: Prompt, session: str, named: bool, tools: bool, model: str | None) -> \
            tuple[str | None, str, bool]:
        """(lane or None for a new one, why, whether the request continues that lane's history)."""
        k = self._longest(p.digests)
        if k > p.lead:
            held = self._by_digest[p.digests[k - 1]]
            names = (held,) if isinstance(held, str) else tuple(held)
            best = max((self.lanes[n] for n in names), key=lambda ln: (
                len(ln.digests) == k, ln.session == session, ln.tools == tools, ln.model == model, ln.seq))
            extends = len(best.digests) == k
            if extends or best.session == session or not (named and best.named):
                return best.name, "extends its last prompt" if extends else "shares its history", True
            # Another named session's lane, shared only in part: two conversations that began alike. The
            # request's own lane (a shorter match) if it has one, else a lane of its own.
            name = self._by_head.get((session, p.head))
            own = self.lanes.get(name) if name is not None else None
            if own is not None and common_prefix(own.digests, p.digests) > p.lead:
                return own.name, "shares its history", True
            return None, "new: forks another session's history", False
        name = self._by_head.get((session, p.head))
        ln = self.lanes.get(name) if name is not None else None
        if ln is not None and ln.messages >= 0 and len(p.digests) - p.lead >= ln.messages \
                and p.size - p.upto(p.lead) >= ln.message_bytes:
            return ln.name, "its next turn, system prompt or tools changed", True
        if k == 0:
            return None, "new: shares no history with any lane", False
        held = self._by_digest[p.digests[k - 1]]
        holders = [self.lanes[n] for n in ((held,) if isinstance(held, str) else held)]
        if all(o.continued == 0 for o in holders):
            # Only a spare lane: a conversation's first turn (the longest lane of its session) is never taken
            # by its subagent's first turn, which shares its system prompt and tools.
            side = [o for o in holders if o.session == session and self.spare(o.name)]
            if side:
                return max(side, key=lambda o: o.seq).name, "its session's side lane", False
        return None, "new: shares only the system prompt and tools", False

    def _longest(self, digests: tuple[bytes, ...]) -> int:
        """The longest prefix of `digests` some lane holds: every lane indexes a prefix of its digests, so
        holding prefix k implies holding k-1, and a binary search is exact."""
        lo, hi = 0, min(len(digests), MAX_LANE_SEGMENTS)
        index = self._by_digest
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if digests[mid - 1] in index:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _new_name(self, session: str, p: Prompt) -> str:
        base = f"{session}|{p.digests[-1].hex()[:12] if p.digests else 'empty'}"
        name, n = base, 1
        while name in self.lanes:
            n += 1
            name = f"{base}.{n}"
        return name

    # -- what a lane holds ----------------------------------------------------------------------------------

    def _update(self, ln: Lane, p: Prompt, *, session: str, named: bool, tools: bool, model: str | None) -> None:
        self._reindex(ln, p.digests)
        self._unhead(ln)
        ln.head_key = (session, p.head)
        self._by_head[ln.head_key] = ln.name
        ln.tools, ln.model = tools, model
        ln.messages, ln.message_bytes = len(p.digests) - p.lead, p.size - p.upto(p.lead)
        ln.size = p.size
        if ln.session is None:
            ln.session, ln.named = session, named
        self._sessions.setdefault(ln.session, {})[ln.name] = None
        self._seq += 1
        ln.seq = self._seq
        self.lanes.move_to_end(ln.name)
        self._bound(keep=ln.name)

    def _unhead(self, ln: Lane) -> None:
        if ln.head_key is not None and self._by_head.get(ln.head_key) == ln.name:
            del self._by_head[ln.head_key]

    def adopt(self, lane: str, digests: tuple[bytes, ...]) -> None:
        """A lane known from a restored slot table (the daemon restarted): its turns find it again by prefix."""
        if lane in self.lanes or not digests:
            return
        ln = self.lanes[lane] = Lane(lane, None, False, continued=1)  # not known as a side lane: not spare
        self.lanes.move_to_end(lane, last=False)  # below anything seen since the start
        self._reindex(ln, digests)
        self._bound(keep=None)

    def _reindex(self, ln: Lane, digests: tuple[bytes, ...]) -> None:
        old = ln.digests
        c = common_prefix(old, digests)
        for d in old[c:MAX_LANE_SEGMENTS]:
            self._remove(d, ln.name)
        for d in digests[c:MAX_LANE_SEGMENTS]:
            self._add(d, ln.name)
        ln.digests = digests

    def _add(self, d: bytes, lane: str) -> None:
        held = self._by_digest.get(d)
        if held is None:
            self._by_digest[d] = lane
        elif isinstance(held, str):
            if held == lane:
                return
            self._by_digest[d] = {held: None, lane: None}
        elif lane in held:
            return
        else:
            held[lane] = None
        self._entries += 1

    def _remove(self, d: bytes, lane: str) -> None:
        held = self._by_digest.get(d)
        if held is None:
            return
        if isinstance(held, str):
            if held != lane:
                return
            del self._by_digest[d]
        else:
            if lane not in held:
                return
            del held[lane]
            if len(held) == 1:
                self._by_digest[d] = next(iter(held))
        self._entries -= 1

    def forget(self, lane: str) -> None:
        ln = self.lanes.pop(lane, None)
        if ln is None:
            return
        for d in ln.digests[:MAX_LANE_SEGMENTS]:
            self._remove(d, lane)
        self._unhead(ln)
        mine = self._sessions.get(ln.session) if ln.session is not None else None
        if mine is not None:
            mine.pop(lane, None)
            if not mine:
                del self._sessions[ln.session]  # type: ignore[arg-type]

    def _bound(self, keep: str | None) -> None:
        while len(self.lanes) > self.max_lanes or self._entries > self.max_entries:
            oldest = next(iter(self.lanes))
            if oldest == keep:
                break
            self.forget(oldest)

    # -- for the slot table ---------------------------------------------------------------------------------

    def spare(self, lane: str | None) -> bool:
        """A lane to evict before any other: a side lane (never continued: title or summary calls) of a session
        that also has a lane it has continued or with a longer prompt (its conversation, even while that
        conversation's first turn runs). A new session's first turn is not one: nothing says it will not
        continue. Asked only when a slot must be taken from a lane."""
        ln = self.lanes.get(lane) if lane is not None else None
        if ln is None or ln.continued or ln.session is None:
            return False
        lanes = self.lanes
        return any((o := lanes.get(n)) is not None and o is not ln and (o.continued > 0 or o.size > ln.size)
                   for n in self._sessions.get(ln.session, ()))
