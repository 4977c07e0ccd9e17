"""One server's slot files: which lane's saved state is in which file (the lane -> file map), and the fixed pool
of names they come from. Pure. Affinity's slot table (affinity/slots.py) holds one and asks it for a lane's
saved state and for a file to save an evicted lane to; kvcache/cache.py names the files by the server's key
(`prefix`), drops the states whose file is not valid, and turns saving off when the server refuses it.

Each file holds a slot's whole KV cache (gigabytes for a large model and a long prompt), so the names come
from a fixed pool: the oldest saved lane's file is overwritten."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_SAVED = 8


@dataclass(slots=True)
class Saved:
    filename: str
    digests: tuple[bytes, ...]  # the prompt the file holds, as affinity digests it
    ends: tuple[int, ...]


class FilePool:
    def __init__(self, *, can_save: bool = False, max_saved: int = DEFAULT_MAX_SAVED) -> None:
        self.saved: OrderedDict[str, Saved] = OrderedDict()  # lane -> its saved state, oldest first
        # False once the server refused a save with 501 (started without --slot-save-path), or when saving is off.
        self.can_save = can_save
        self.max_saved = max_saved
        # The files' names start with it: kvcache puts the server's key in it (model file, context, version), so
        # no server ever restores a file saved for another.
        self.prefix = "coderouter-"

    def get(self, lane: str) -> Saved | None:
        return self.saved.get(lane) if self.can_save else None

    def remember(self, lane: str, digests: tuple[bytes, ...], ends: tuple[int, ...]) -> str:
        """Record the lane's saved state; returns the file to save it to (from the fixed pool)."""
        old = self.saved.pop(lane, None)
        if old is not None:
            fname = old.filename
        elif len(self.saved) < self.max_saved:
            used = {sv.filename for sv in self.saved.values()}
            fname = next(f for i in range(self.max_saved + 1)
                         if (f := f"{self.prefix}lane-{i}.bin") not in used)
        else:
            _, oldest = self.saved.popitem(last=False)
            fname = oldest.filename
        self.saved[lane] = Saved(fname, digests, ends)
        return fname

    def copy_name(self, slot: int) -> str:
        """The scratch file a shared prefix is copied through into `slot` (one per target slot, overwritten)."""
        return f"{self.prefix}copy-{slot}.bin"

    def lane_of(self, filename: str) -> str | None:
        return next((lane for lane, sv in self.saved.items() if sv.filename == filename), None)

    def keep(self, valid: Callable[[str], bool]) -> list[str]:
        """Drop the saved states whose file `valid(filename)` refuses (another server's key, gone from disk);
        returns their names."""
        dropped = [sv.filename for sv in self.saved.values() if not valid(sv.filename)]
        for fname in dropped:
            self.forget(fname)
        return dropped

    def forget(self, filename: str) -> None:
        for lane, sv in list(self.saved.items()):
            if sv.filename == filename:
                del self.saved[lane]

    def snapshot(self) -> list:
        return [[lane, sv.filename, [d.hex() for d in sv.digests], list(sv.ends)] for lane, sv in self.saved.items()]

    def restore(self, rows: list[list] | None) -> None:
        """From `snapshot()` (raises ValueError/TypeError on a damaged one: the caller starts over)."""
        for lane, fname, digests, ends in (rows or ())[-self.max_saved:] if self.max_saved else ():
            self.saved[lane] = Saved(fname, tuple(bytes.fromhex(d) for d in digests), tuple(int(e) for e in ends))
