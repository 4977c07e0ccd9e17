"""The model name an answer carries: the one the client asked for (or the provider's configured name), the same
in every ingress, streamed or not. A server's own name for it (llama-server's absolute .gguf path, a dated id)
tells the client nothing it asked about, and two names for one model in a stream and its whole answer break
clients that compare them.

Relayed answers are renamed in their bytes: the "model" key's value is replaced where the server wrote it, and
only a body written some other way (spaces after the colon) is parsed and encoded again."""

from __future__ import annotations

import orjson


def renamed(data: bytes, current: object, name: str, *, inside: str | None = None) -> bytes:
    """`data`, a JSON object whose "model" (at the top, or in its `inside` object) is `current`, naming `name`
    instead. Unchanged when there is nothing to rename."""
    if not isinstance(current, str) or current == name or not name:
        return data
    old = b'"model":' + orjson.dumps(current)
    if old in data:
        # Inside a JSON string every quote is escaped: an unescaped `"model":` is a key.
        return data.replace(old, b'"model":' + orjson.dumps(name), 1)
    obj = orjson.loads(data)
    target = obj.get(inside) if inside is not None else obj
    if isinstance(target, dict):
        target["model"] = name
    return orjson.dumps(obj)


def renamed_text(data: str, current: object, name: str, *, inside: str | None = None) -> str:
    if not isinstance(current, str) or current == name or not name:
        return data
    return renamed(data.encode(), current, name, inside=inside).decode()
