"""An in-memory stand-in for Store, for a daemon running with [state] enabled = false."""

from __future__ import annotations


class MemoryStore:
    healthy = True
    problem = None
    dropped_this_outage = 0  # nothing to write, so nothing is ever dropped (Store's counter, for status)

    def __init__(self) -> None:
        self._data: dict[str, dict] = {}

    def get(self, namespace: str, key: str, default=None):
        return self._data.get(namespace, {}).get(key, default)

    def set(self, namespace: str, key: str, value) -> None:
        self._data.setdefault(namespace, {})[key] = value

    def delete(self, namespace: str, key: str) -> None:
        self._data.get(namespace, {}).pop(key, None)

    def items(self, namespace: str) -> dict:
        return dict(self._data.get(namespace, {}))

    def flush(self) -> None:
        pass
