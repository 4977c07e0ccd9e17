"""A lane's saved slot state follows it to another server of this machine (issue 44 section 1: a balance profile's
replica went down and its lanes move to the others).

Only between two servers this daemon manages (they save into its one slot directory: the file moves by a rename,
never a copy of gigabytes) and only when both have the same key (model file, context per slot, llama.cpp build): a
file never crosses to another. The rename is blocking and goes through kvcache's one file-system lock.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .files import SIDECAR

if TYPE_CHECKING:
    from .cache import KVCache

log = logging.getLogger("coderouterd.kvcache")


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
    """Move `lane`'s saved state from server `src`'s files to `dst`'s. Returns the tokens it holds as far as known
    (0 when unknown), or None when it does not move (not both managed here, keys differ or unknown, nothing saved,
    `dst` cannot save)."""
    if src == dst or not (kv.manages(src) and kv.manages(dst)) or kv.directory is None:
        return None
    ks, kd = kv._keys.get(src), kv._keys.get(dst)
    if ks is None or kd is None or not ks.model or ks.digest() != kd.digest():
        return None
    st, dt = kv.host.table(src), kv.host.table(dst)
    if st is None or dt is None or not dt.files.can_save:
        return None
    saved = st.files.saved.get(lane)
    if saved is None:
        return None
    new = dt.files.remember(lane, saved.digests, saved.ends)
    if not await kv._fs(_rename, kv.directory, saved.filename, new):
        dt.files.saved.pop(lane, None)
        return None
    st.files.saved.pop(lane, None)
    kv.host.persist_soon(src)
    kv.host.persist_soon(dst)
    log.info("lane's saved slot state moved from %s to %s (same machine, same model, context and build)", src, dst)
    return saved.ends[-1] if saved.ends else 0
