"""A lane's saved slot state follows it to another server of this machine (issue 44 section 1: a balance profile's
replica went down and its lanes move to the others).

Only between two servers this daemon manages (they save into its one slot directory: the file moves by a rename,
never a copy of gigabytes) and only when the file was saved under the key of the server it moves to (model file,
context per slot, llama.cpp build): a file never crosses to another. The key checked is the one in the file's
sidecar, which is what the file is valid for, not what the server it came from last said: that server may be gone
(killed, its key forgotten at its restart). The check and the rename are blocking and go through kvcache's one
file-system lock, and only once the new server's key is known (its first placement learns it: the caller moves
the file after that, before the slot is chosen).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .disk import read_sidecar
from .files import SIDECAR, CacheKey, sidecar_matches

if TYPE_CHECKING:
    from .cache import KVCache

log = logging.getLogger("coderouterd.kvcache")


def _valid_for(directory: Path, filename: str, key: CacheKey) -> int | None:
    """The tokens `filename` holds (its sidecar's word, 0 when unknown) when it is on disk and was saved under
    `key`, else None."""
    side = read_sidecar(directory / (filename + SIDECAR))
    if not (directory / filename).is_file() or not sidecar_matches(side, key):
        return None
    tokens = side.get("tokens") if side is not None else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


def _rename(directory: Path, old: str, new: str) -> bool:
    """The slot file and its sidecar under their new name; False (nothing moved) when the file is not there."""
    try:
        os.replace(directory / old, directory / new)
    except OSError:
        return False
    try:
        os.replace(directory / (old + SIDECAR), directory / (new + SIDECAR))
    except OSError:
        # Without its sidecar the file is never trusted (files.sidecar_matches): as good as gone.
        return False
    return True


async def move_lane(kv: KVCache, lane: str, src: str, dst: str) -> int | None:
    """Move `lane`'s saved state from server `src`'s files to `dst`'s. Returns the tokens it holds, as its sidecar
    says (0 when unknown), or None when it does not move (not both managed here, `dst`'s key unknown or not the file's,
    nothing saved, `dst` cannot save)."""
    if src == dst or not (kv.manages(src) and kv.manages(dst)) or kv.directory is None:
        return None
    kd = kv._keys.get(dst)
    if kd is None or not kd.model:
        return None  # (an unkeyed server: nothing tells which files are valid for it)
    ks = kv._keys.get(src)
    if ks is not None and ks.digest() != kd.digest():
        return None
    st, dt = kv.host.table(src), kv.host.table(dst)
    if st is None or dt is None or not dt.files.can_save:
        return None
    saved = st.files.saved.get(lane)
    if saved is None:
        return None
    pending = kv._pending.get(saved.filename)
    if pending is not None:
        await asyncio.shield(pending)  # its sidecar is being written (a save on a request's path)
    tokens = await kv._fs(_valid_for, kv.directory, saved.filename, kd)
    if tokens is None:
        log.info("lane's saved slot state not moved from %s to %s: the file is not valid for %s (another model, "
                 "context or build, or it is gone)", src, dst, dst)
        return None
    new = dt.files.remember(lane, saved.digests, saved.ends)
    if not await kv._fs(_rename, kv.directory, saved.filename, new):
        dt.files.saved.pop(lane, None)
        return None
    st.files.saved.pop(lane, None)
    kv.host.persist_soon(src)
    kv.host.persist_soon(dst)
    log.info("lane's saved slot state moved from %s to %s (same machine, same model, context and build)", src, dst)
    return tokens
