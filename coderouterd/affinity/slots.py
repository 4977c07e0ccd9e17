"""Which llama-server slot a lane's turn goes to. Pure: the service supplies the clock and the costs.

The server's own choice (the idle slot with the longest common prefix above `--slot-prompt-similarity`, else
the least recently used) goes wrong for agents: every Claude Code session shares a long system prompt and
tool list, so a new session matches a slot that holds another session's history and overwrites it. Here a
lane keeps the slot it has; a lane without one takes a free slot (the one holding its longest prefix, else
the least recently used), and only when none is free evicts a side lane, else the least recently used — saving that
slot first when the server can (`--slot-save-path`), and restoring a returning lane's saved state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..kvcache.pool import DEFAULT_MAX_SAVED, FilePool, Saved
from .canonical import Prompt, common_prefix


@dataclass(slots=True)
class Slot:
    id: int
    digests: tuple[bytes, ...] = ()
    ends: tuple[int, ...] = ()
    lane: str | None = None
    last_used: float = 0.0
    busy: int = 0
    busy_since: float = 0.0

    def reuse(self, prompt: Prompt) -> int:
        """Bytes of `prompt` this slot already holds."""
        return prompt.upto(common_prefix(self.digests, prompt.digests))


@dataclass(slots=True)
class Choice:
    slot: int
    predicted: int  # bytes of the prompt expected to be reused
    wait: bool = False  # the lane's own slot is busy and waiting for it is cheaper than moving
    saves: list[tuple[int, str]] = field(default_factory=list)  # (slot, filename) to save first, in order
    restore: str | None = None  # then restore this file into `slot`
    evicted: str | None = None  # the lane that loses `slot`
    why: str = ""


class SlotTable:
    def __init__(self, n: int, *, can_save: bool = False, clone_min_bytes: int = 8192,
                 max_saved: int = DEFAULT_MAX_SAVED) -> None:
        self.slots = [Slot(i) for i in range(n)]
        self.clone_min_bytes = clone_min_bytes
        # The lane -> file map and the file names are kvcache's (kvcache/pool.py): this table asks it.
        self.files = FilePool(can_save=can_save, max_saved=max_saved)
        self.configured = False  # the affinity settings applied once the server's slot count is known
        self._spare: Callable[[str | None], bool] | None = None  # for the current `choose`

    @property
    def can_save(self) -> bool:
        return self.files.can_save

    @property
    def saved(self) -> dict[str, Saved]:
        """Each lane's saved state (read only: kvcache/pool.py keeps it)."""
        return self.files.saved

    def resize(self, n: int) -> None:
        if n == len(self.slots):
            return
        self.slots = self.slots[:n] + [Slot(i) for i in range(len(self.slots), n)]

    def owned(self, lane: str) -> Slot | None:
        for s in self.slots:
            if s.lane == lane:
                return s
        return None

    # -- choosing -------------------------------------------------------------------------------------------

    def choose(self, lane: str, prompt: Prompt, *, wait_s: float = 0.0, s_per_byte: float = 0.0,
               spare: Callable[[str | None], bool] | None = None) -> Choice:
        """`wait_s`: expected time until the lane's own slot is free if busy; `s_per_byte`: prefill cost, so
        a busy slot is waited for only when waiting costs less than re-processing what moving would lose.
        `spare(lane)`: a lane to evict before the others (lanes.LaneIndex.spare: a session's side lane)."""
        self._spare = spare
        own = self.owned(lane)
        if own is not None:
            kept = own.reuse(prompt)
            if not own.busy:
                choice = Choice(own.id, kept, why="lane's own slot")
                # Its slot lost what it held (the server restarted, or a failure left it unknown): its saved
                # state when it has one, else (another slot holds the shared system prompt and tools) a copy of
                # those rather than prefilling them again.
                if not self._restore_saved(choice, own, lane, prompt):
                    self._copy_longer_prefix(choice, own, prompt)
                return choice
            alt = self._free_or_lru(prompt, exclude=own.id, idle_only=True)
            if alt is None:
                return Choice(own.id, kept, wait=True, why="lane's own slot (busy; no idle slot to move to)")
            alt_reuse = alt.reuse(prompt)
            if wait_s <= (kept - alt_reuse) * s_per_byte:
                return Choice(own.id, kept, wait=True, why="lane's own slot (busy; waiting is cheaper than moving)")
            own.lane = None
            return self._take(alt, lane, prompt, why="moved: own slot busy and moving is cheaper than waiting")
        target = self._free_or_lru(prompt, exclude=None, idle_only=True) or self._free_or_lru(
            prompt, exclude=None, idle_only=False)
        assert target is not None
        return self._take(target, lane, prompt, why="free slot" if target.lane is None else "least recently used")

    def _free_or_lru(self, prompt: Prompt, *, exclude: int | None, idle_only: bool) -> Slot | None:
        pool = [s for s in self.slots if s.id != exclude and (not idle_only or not s.busy)]
        if not pool:
            return None
        free = [s for s in pool if s.lane is None]
        if free:
            # Longest prefix first, then least recently used.
            return max(free, key=lambda s: (s.reuse(prompt), -s.last_used))
        # Evict a spare lane first (a session's side lane: title calls, a short prompt never continued), then
        # the least recently used.
        spare = self._spare
        return min(pool, key=lambda s: (spare is None or not spare(s.lane), s.last_used))

    def _take(self, slot: Slot, lane: str, prompt: Prompt, *, why: str) -> Choice:
        choice = Choice(slot.id, slot.reuse(prompt), why=why)
        if slot.lane is not None and slot.lane != lane:
            choice.evicted = slot.lane
            if self.can_save and slot.digests and self.files.max_saved > 0:
                fname = self.files.remember(slot.lane, slot.digests, slot.ends)
                choice.saves.append((slot.id, fname))
        self._restore_saved(choice, slot, lane, prompt)
        if choice.restore is None:
            # A new lane whose longest prefix (typically the shared system prompt and tools) sits in another
            # lane's slot: copy that slot here rather than prefill it again.
            self._copy_longer_prefix(choice, slot, prompt)
        slot.lane = lane
        return choice

    def _restore_saved(self, choice: Choice, slot: Slot, lane: str, prompt: Prompt) -> bool:
        """Restore the lane's saved state into `slot` when it holds more of `prompt` than the slot does."""
        saved = self.files.get(lane)
        if saved is None:
            return False
        got = prompt.upto(common_prefix(saved.digests, prompt.digests))
        if got <= choice.predicted:
            return False
        choice.restore = saved.filename
        choice.predicted = got
        choice.why += "; restored the lane's saved state"
        slot.digests, slot.ends = saved.digests, saved.ends
        return True

    def _copy_longer_prefix(self, choice: Choice, slot: Slot, prompt: Prompt) -> None:
        """When another idle slot holds a prefix of `prompt` longer by `clone_min_bytes` than what `slot` would
        reuse, save it and restore it into `slot` (one scratch file per target slot, overwritten)."""
        if not self.can_save:
            return
        donor = max((s for s in self.slots if s.id != slot.id), key=lambda s: s.reuse(prompt), default=None)
        if donor is None or donor.busy:
            return
        got = donor.reuse(prompt)
        if got - choice.predicted < self.clone_min_bytes:
            return
        fname = self.files.copy_name(slot.id)
        choice.saves.append((donor.id, fname))
        choice.restore = fname
        choice.predicted = got
        choice.why += f"; copied the shared prefix from slot {donor.id}"
        slot.digests, slot.ends = donor.digests, donor.ends

    # -- outcomes -------------------------------------------------------------------------------------------

    def begin(self, slot: int, now: float) -> None:
        s = self.slots[slot]
        s.busy += 1
        s.busy_since = now

    def finish(self, slot: int, lane: str, prompt: Prompt | None, now: float) -> None:
        """After the answer the slot holds this prompt; after a failure its content is unknown (None)."""
        s = self.slots[slot]
        s.busy = max(0, s.busy - 1)
        s.last_used = now
        if prompt is None:
            s.digests, s.ends = (), ()
        else:
            s.digests, s.ends = prompt.digests, prompt.ends
            if s.lane is None and self.owned(lane) is None:
                s.lane = lane

    def forget_contents(self) -> None:
        """The server restarted: every slot is empty. Lanes keep their slots (a pin costs nothing), and saved
        states stay known: their files outlive the process."""
        for s in self.slots:
            s.digests, s.ends, s.busy = (), (), 0

    def remember_save(self, slot: int) -> str:
        """A background or before-stop save of `slot`'s lane: recorded as that lane's saved state; returns the
        file to save it to."""
        s = self.slots[slot]
        assert s.lane is not None
        return self.files.remember(s.lane, s.digests, s.ends)

    # -- persistence ----------------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        return {
            "slots": [{"lane": s.lane, "last_used": s.last_used, "digests": [d.hex() for d in s.digests],
                       "ends": list(s.ends)} for s in self.slots],
            "saved": self.files.snapshot(),
        }

    def restore(self, snap: dict) -> None:
        try:
            rows = snap.get("slots") or ()
            # Monotonic times mean nothing after a restart: keep their order, below any new time.
            top = max((float(d.get("last_used") or 0.0) for d in rows), default=0.0)
            for s, data in zip(self.slots, rows, strict=False):
                s.lane = data.get("lane")
                s.last_used = float(data.get("last_used") or 0.0) - top - 1.0
                s.digests = tuple(bytes.fromhex(d) for d in data.get("digests") or ())
                s.ends = tuple(int(e) for e in data.get("ends") or ())
            self.files.restore(snap.get("saved"))
        except (ValueError, TypeError, AttributeError):
            # A damaged snapshot costs one cold turn per lane, nothing more.
            for s in self.slots:
                s.lane, s.digests, s.ends = None, (), ()
            self.files.saved.clear()
