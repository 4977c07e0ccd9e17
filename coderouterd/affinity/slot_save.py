"""A managed llama-server gets `--slot-save-path` (under the state directory) unless its command sets one:
without it, a lane evicted from its slot loses its prefix; with it, the slot is saved and restored when the
session returns, and a new lane copies the shared system prompt and tools instead of prefilling them."""

from __future__ import annotations

import os
from pathlib import Path

SLOT_DIR = "slots"
FLAG = "--slot-save-path"


def is_llama_server(command: list[str]) -> bool:
    return bool(command) and os.path.basename(command[0]).startswith("llama-server")


def with_slot_save_path(command: list[str], directory: Path) -> list[str]:
    if not is_llama_server(command) or any(a == FLAG or a.startswith(FLAG + "=") for a in command):
        return command
    return [*command, FLAG, str(directory)]


def saves_to(command: list[str], directory: Path) -> bool:
    """Whether this command's server writes its slot files into `directory` (coderouterd's own)."""
    for i, a in enumerate(command):
        if a == FLAG and i + 1 < len(command):
            return command[i + 1] == str(directory)
        if a.startswith(FLAG + "="):
            return a[len(FLAG) + 1:] == str(directory)
    return False


def slot_dir(state_dir: Path) -> Path:
    return state_dir / SLOT_DIR


def ensure_slot_dir(state_dir: Path) -> None:
    """Called in a thread at start-up: llama-server does not create the directory itself."""
    try:
        d = slot_dir(state_dir)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.chmod(0o700)  # KV caches hold the conversations: private, whatever an older version created
    except OSError:
        pass  # saves then fail, and affinity falls back to plain eviction
