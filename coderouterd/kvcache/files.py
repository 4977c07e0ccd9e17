"""Slot files on disk, pure: what a file is valid for (its key), whether a file may be restored (its size
against its sidecar's), which slots to save first, which files to delete to stay within the disk budget. No
I/O here: kvcache/disk.py reads and writes, in threads, for kvcache/cache.py.

A llama-server slot file holds a slot's KV cache. It is only meaningful to a server running the same model
file, with the same context per slot, built from the same llama.cpp (the state format changes between
versions). A file saved under another key must never be restored: the key's digest is in the file's name
(so a server never even looks for another key's files) and in a small sidecar next to it (checked before a
restore is trusted).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from .pool import FilePool

PREFIX = "cr-"  # every file coderouterd names starts with this: the only ones it may delete
LEGACY = ("coderouter-lane-", "coderouter-copy-")  # names before the key was in them: never restored, pruned


SIDECAR = ".json"


def is_ours(name: str) -> bool:
    return name.startswith(PREFIX) or name.startswith(LEGACY)


@dataclass(frozen=True, slots=True)
class CacheKey:
    model: str          # the model file the server loaded (/props model_path)
    size: int | None    # its size and modification time: the same path with another file behind it is not it
    mtime_ns: int | None
    n_ctx: int          # tokens per slot
    build: str          # the server's version (/props build_info)

    def digest(self) -> str:
        raw = orjson.dumps([self.model, self.size, self.mtime_ns, self.n_ctx, self.build])
        return hashlib.sha256(raw).hexdigest()[:12]

    def file_prefix(self, owner: str = "") -> str:
        """`owner`: the provider whose slots these are. Two servers of the same model and context have the same
        key, and share the save directory: without the owner in the name one would overwrite the other's lanes."""
        return f"{PREFIX}{self.digest()}-{owner_tag(owner)}"

    def as_dict(self) -> dict:
        return {"model": self.model, "size": self.size, "mtime_ns": self.mtime_ns, "n_ctx": self.n_ctx,
                "build": self.build, "digest": self.digest()}


def owner_tag(owner: str) -> str:
    """A provider's part of its slot files' names (its name may hold any character; the digest is file-safe)."""
    return hashlib.sha256(owner.encode()).hexdigest()[:8] + "-" if owner else ""


def key_from_props(props: dict, size: int | None, mtime_ns: int | None) -> CacheKey | None:
    """The key from llama-server's /props (and the model file's stat); None when /props does not say enough
    to tell this server's files from another's (no context size)."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        return None
    model = props.get("model_path")
    build = props.get("build_info")
    return CacheKey(model if isinstance(model, str) else "", size, mtime_ns, n_ctx,
                    build if isinstance(build, str) else "")


def sidecar_matches(sidecar: dict | None, key: CacheKey) -> bool:
    return isinstance(sidecar, dict) and sidecar.get("key") == key.as_dict()


def restore_problem(sidecar: dict | None, size: int | None) -> str | None:
    """Why a slot file must not be restored, from its sidecar and its size on disk now (None: the file is gone),
    else None. A file whose size is not the one it was saved with was truncated or rewritten: in the attack a
    truncated file crashed the real llama-server on restore (a 502 and a restart), so it never reaches it."""
    if size is None:
        return "the file is gone"
    if not isinstance(sidecar, dict):
        return "it has no sidecar"
    saved = sidecar.get("bytes")
    if not isinstance(saved, int) or isinstance(saved, bool):
        return "its sidecar gives no size"
    if size != saved:
        return f"{'truncated' if size < saved else 'grown'}: {size} bytes, saved as {saved}"
    return None


class SlotView(Protocol):
    """What kvcache reads of one slot of affinity's slot table (affinity/slots.py)."""

    @property
    def id(self) -> int: ...
    @property
    def busy(self) -> int: ...
    @property
    def lane(self) -> str | None: ...
    @property
    def digests(self) -> tuple[bytes, ...]: ...
    @property
    def ends(self) -> tuple[int, ...]: ...
    @property
    def last_used(self) -> float: ...


class TableView(Protocol):
    """A server's slot table as kvcache sees it: its slots and its file pool."""

    @property
    def slots(self) -> Sequence[SlotView]: ...
    @property
    def files(self) -> FilePool: ...


def to_save(table: TableView, *, now: float, idle_after_s: float | None = None) -> list[int]:
    """Slots holding a lane's prefix that is not on disk as it is now, most valuable first: the longest
    prefix (what a cold turn would re-process), then the most recently used. `idle_after_s`: only slots
    unused that long (the background saves); None: every idle one (before a planned stop). Busy slots are
    left alone: what they hold is changing."""
    out = []
    for s in table.slots:
        if s.busy or not s.lane or not s.digests:
            continue
        if idle_after_s is not None and now - s.last_used < idle_after_s:
            continue
        saved = table.files.saved.get(s.lane)
        if saved is not None and saved.digests == s.digests:
            continue  # already saved as it is
        out.append(s)
    out.sort(key=lambda s: (-(s.ends[-1] if s.ends else 0), -s.last_used))
    return [s.id for s in out]


@dataclass(frozen=True, slots=True)
class SlotFile:
    name: str
    bytes: int      # the file and its sidecar
    saved_at: float  # wall clock (the file's mtime)
    tokens: int     # what it holds, from its sidecar (0 unknown)
    referenced: bool  # some lane's saved prefix (any server's table)


def to_prune(files: list[SlotFile], budget_bytes: int) -> list[str]:
    """Files to delete so the rest fit `budget_bytes`: files no lane refers to first (stale keys, scratch
    copies, leftovers of a lost state), then the oldest, then the least valuable (fewest tokens)."""
    total = sum(f.bytes for f in files)
    out = []
    for f in sorted(files, key=lambda f: (f.referenced, f.saved_at, f.tokens)):
        if total <= budget_bytes:
            break
        out.append(f.name)
        total -= f.bytes
    return out
