"""The slot directory, blocking: every function here runs in a thread (kvcache/cache.py calls them through its
one file-system lock), never on the event loop.

A managed llama-server writes its slot files into <state dir>/slots (it was given `--slot-save-path` there:
servers/llamacpp.with_slot_save_path); coderouterd writes a small sidecar next to each file it asked for, and
deletes only the files it named (kvcache/files.is_ours)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from ..providers.limits import MAX_IGNORED_BYTES
from .files import PREFIX, SIDECAR, CacheKey, SlotFile, is_ours, restore_problem, sidecar_matches, to_prune

log = logging.getLogger("coderouterd.kvcache")

SLOT_DIR = "slots"


def slot_dir(state_dir: Path) -> Path:
    return state_dir / SLOT_DIR


def ensure_slot_dir(state_dir: Path) -> None:
    """At start-up: llama-server does not create the directory itself."""
    try:
        d = slot_dir(state_dir)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.chmod(0o700)  # KV caches hold the conversations: private, whatever an older version created
    except OSError:
        pass  # saves then fail, and affinity falls back to plain eviction


def read_sidecar(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            got = orjson.loads(f.read(MAX_IGNORED_BYTES))
        return got if isinstance(got, dict) else None
    except (OSError, orjson.JSONDecodeError):
        return None


def valid_files(directory: Path, names: list[str], key: CacheKey) -> set[str]:
    """The files among `names` that are on disk and were saved under `key`. Their size is checked when one is
    about to be restored (`check_restore`), where a refusal is recorded against the turn it costs."""
    return {n for n in names if (directory / n).is_file() and sidecar_matches(read_sidecar(directory / (n + SIDECAR)),
                                                                               key)}


def check_restore(directory: Path, filename: str) -> tuple[str | None, int]:
    """(why `filename` must not be restored or None, the tokens its sidecar says it holds)."""
    side = read_sidecar(directory / (filename + SIDECAR))
    tokens = side.get("tokens") if side is not None else None
    return restore_problem(side, _size(directory / filename)), tokens if isinstance(tokens, int) else 0


def _size(path: Path) -> int | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size if path.is_file() else None


def write_sidecar(directory: Path, filename: str, meta: dict) -> int | None:
    """The file private and its sidecar (with the file's size) written; returns that size (None: failed)."""
    path = directory / filename
    try:
        os.chmod(path, 0o600)  # llama-server writes it with its umask; the directory is 0700 already
        size = path.stat().st_size
        tmp = directory / (filename + SIDECAR + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps({**meta, "bytes": size}))
        os.replace(tmp, directory / (filename + SIDECAR))
        return size
    except OSError as e:
        log.warning("slot file %s: %s", filename, e)
        return None


def prune_dir(directory: Path, referenced: set[str], budget: int) -> tuple[set[str], int]:
    """(names deleted, bytes left) for coderouterd's files in `directory` (llama-server's own and the user's
    are never touched)."""
    files = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return set(), 0
    by_name = {e.name: e for e in entries}
    for e in entries:
        if not is_ours(e.name) or e.name.endswith(SIDECAR) or e.name.endswith(".tmp"):
            continue
        try:
            st = e.stat()
        except OSError:
            continue
        side = by_name.get(e.name + SIDECAR)
        meta = read_sidecar(Path(side.path)) if side is not None else None
        size = st.st_size + (side.stat().st_size if side is not None else 0)
        tokens = meta.get("tokens") if meta is not None else 0
        files.append(SlotFile(e.name, size, st.st_mtime, tokens if isinstance(tokens, int) else 0,
                              e.name in referenced))
    # Sidecars whose file is gone are debris.
    for e in entries:
        if e.name.startswith(PREFIX) and e.name.endswith(SIDECAR) and e.name[:-len(SIDECAR)] not in by_name:
            _unlink(Path(e.path))
    deleted = set(to_prune(files, budget))
    for name in deleted:
        _unlink(directory / name)
        _unlink(directory / (name + SIDECAR))
    return deleted, sum(f.bytes for f in files if f.name not in deleted)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not delete %s: %s", path, e)
