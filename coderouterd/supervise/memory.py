"""What a managed model server holds once loaded, estimated from its command line: the model file named by
-m/--model plus the KV cache for its context (from the GGUF header: layers, KV heads, head size). Also what
`--check` needs to say a command cannot start: a missing binary or model file.

Blocking (stat, a read of the file's header): callers run it in a thread.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..servers import llamacpp

if TYPE_CHECKING:
    from ..config.schema import ConfigModel, ProcessConfig

_KV_BYTES = 2  # f16 K and V, llama-server's default cache type
_MB = 1024 * 1024

# The flags are llama-server's (servers/llamacpp.py reads its command line).
model_path = llamacpp.model_file
context_size = llamacpp.ctx_size


def missing(command: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Why this command cannot start, before trying: its binary not found or not executable, its model file
    absent. Empty: nothing known to be wrong."""
    problems = []
    binary = command[0]
    path = (env or {}).get("PATH") or os.environ.get("PATH")
    if os.sep in binary:
        target = Path(binary) if os.path.isabs(binary) or not cwd else Path(cwd) / binary
        if not target.is_file():
            problems.append(f"binary {binary!r} not found" if not target.exists()
                            else f"binary {binary!r} is not a file")
        elif not os.access(target, os.X_OK):
            problems.append(f"binary {binary!r} is not executable")
    elif shutil.which(binary, path=path) is None:
        problems.append(f"binary {binary!r} not found on PATH")
    model = model_path(command, cwd)
    if model is not None and not model.is_file():
        problems.append(f"model file {str(model)!r} not found")
    return problems


def estimate_mb(command: list[str], cwd: str | None = None) -> float:
    """Model file + KV cache, in MB; 0 when the command names no readable model file."""
    model = model_path(command, cwd)
    if model is None:
        return 0.0
    try:
        size = model.stat().st_size
    except OSError:
        return 0.0
    kv = 0
    try:
        with open(model, "rb") as f:
            meta = read_gguf_metadata(f)
    except (OSError, ValueError, struct.error):
        meta = {}
    if meta:
        kv = kv_cache_bytes(meta, context_size(command))
    return round((size + kv) / _MB, 1)


def slot_file_estimate(command: list[str], cwd: str | None = None) -> tuple[int, int]:
    """(bytes, tokens) of one slot file of a llama-server with its slot full: the KV cache of a slot's context
    (-c divided by -np); (0, 0) when the command names no readable model."""
    model = model_path(command, cwd)
    if model is None:
        return 0, 0
    try:
        with open(model, "rb") as f:
            meta = read_gguf_metadata(f)
    except (OSError, ValueError, struct.error):
        return 0, 0
    arch = meta.get("general.architecture")
    trained = meta.get(f"{arch}.context_length") if isinstance(arch, str) else None
    ctx = context_size(command) or (trained if isinstance(trained, int) else 0)
    tokens = ctx // max(1, llamacpp.parallel(command) or 1)
    return (kv_cache_bytes(meta, tokens), tokens) if tokens else (0, 0)


def kv_cache_bytes(meta: dict[str, object], ctx: int) -> int:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return 0

    def num(key: str) -> int:
        v = meta.get(f"{arch}.{key}")
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0

    layers, embd, heads = num("block_count"), num("embedding_length"), num("attention.head_count")
    kv_heads = num("attention.head_count_kv") or heads
    ctx = ctx or num("context_length")
    if not (layers and embd and heads and ctx):
        return 0
    head_dim = num("attention.key_length") or embd // heads
    return 2 * layers * ctx * kv_heads * head_dim * _KV_BYTES


# GGUF value types: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (facts of the format)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 100_000


def read_gguf_metadata(f: BinaryIO) -> dict[str, object]:
    """The scalar and string key/values of a GGUF file's header (arrays are skipped). ValueError if not GGUF."""
    if f.read(4) != b"GGUF":
        raise ValueError("not a GGUF file")
    (version,) = struct.unpack("<I", f.read(4))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not read")
    _tensors, count = struct.unpack("<QQ", f.read(16))
    if count > _MAX_KEYS:
        raise ValueError("implausible GGUF key count")
    out: dict[str, object] = {}
    for _ in range(count):
        key = _read_string(f)
        (vtype,) = struct.unpack("<I", f.read(4))
        if vtype == _ARRAY:
            (etype,) = struct.unpack("<I", f.read(4))
            (n,) = struct.unpack("<Q", f.read(8))
            _skip_array(f, etype, n)
        else:
            out[key] = _read_value(f, vtype)
    return out


def _read_string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > 1 << 24:
        raise ValueError("implausible GGUF string length")
    return f.read(n).decode("utf-8", "replace")


def _read_value(f: BinaryIO, vtype: int) -> object:
    if vtype == _STRING:
        return _read_string(f)
    fmt = _SCALARS.get(vtype)
    if fmt is None:
        raise ValueError(f"unknown GGUF value type {vtype}")
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _skip_array(f: BinaryIO, etype: int, n: int) -> None:
    if etype == _STRING:
        for _ in range(n):
            (length,) = struct.unpack("<Q", f.read(8))
            f.seek(length, os.SEEK_CUR)
        return
    fmt = _SCALARS.get(etype)
    if fmt is None:
        raise ValueError(f"GGUF array of type {etype} is not read")
    f.seek(struct.calcsize(fmt) * n, os.SEEK_CUR)


def _processes(cfg: ConfigModel) -> list[tuple[str, ProcessConfig]]:
    """Each managed process once (a shared [processes.NAME] serves several providers)."""
    seen: dict[str, ProcessConfig] = {}
    for provider in cfg.providers:
        found = cfg.process_for(provider)
        if found is not None and found[0] not in seen:
            seen[found[0]] = found[1]
    return list(seen.items())


def unstartable_processes(cfg: ConfigModel) -> dict[str, list[str]]:
    """process -> why it cannot start (binary or -m/--model file missing, or more memory than the whole
    [models] memory_budget_mb: the scheduler never starts it), for --check and `config check`. Reads the
    filesystem: not for the event loop."""
    out: dict[str, list[str]] = {}
    budget = cfg.models.memory_budget_mb
    for name, p in _processes(cfg):
        problems = missing(list(p.command), p.cwd or None, p.env)
        if budget > 0:
            need = p.memory_mb or estimate_mb(list(p.command), p.cwd or None)
            if need > budget:
                how = "memory_mb" if p.memory_mb else "its estimated memory (model file + KV cache)"
                problems.append(f"{how} {need:,.0f} MB exceeds [models] memory_budget_mb = {budget:,.0f}, so it "
                                "is never started (raise the budget, or lower memory_mb or the context size)")
        if problems:
            out[name] = problems
    return out


def uncounted_processes(cfg: ConfigModel) -> list[str]:
    """With a memory budget, processes whose memory is neither set nor estimable (no -m/--model .gguf): they
    count as nothing against it. For --check and `config check`; reads no file."""
    if cfg.models.memory_budget_mb <= 0:
        return []
    return [f"process {name}: memory_mb is 0 and its command names no .gguf to estimate it from; it counts as "
            "nothing against [models] memory_budget_mb (set memory_mb)"
            for name, p in _processes(cfg) if not p.memory_mb and model_path(list(p.command), p.cwd or None) is None]
