"""GET /metrics: the Prometheus registry, built on first use, behind the optional bearer token."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .metrics import Metrics, MetricsSource

_DENIED = b'{"error":"metrics need the configured bearer token"}'
_TEXT = b"text/plain; version=0.0.4; charset=utf-8"


class LazyMetrics:
    """The Prometheus registry, built on first use: its first events arrive in the bus's writer thread, so
    importing prometheus_client there keeps it out of the daemon's start-up time."""

    def __init__(self, daemon: MetricsSource) -> None:
        self._daemon = daemon
        self._metrics: Metrics | None = None
        self._lock = threading.Lock()

    def get(self) -> Metrics:
        if self._metrics is None:
            with self._lock:
                if self._metrics is None:
                    from .metrics import Metrics

                    self._metrics = Metrics(self._daemon)
        return self._metrics

    def sink(self, events: list) -> None:
        self.get().sink(events)

    def authorized(self, scope) -> bool:
        return self.get().authorized(scope)

    def render(self) -> bytes:
        return self.get().render()

    async def endpoint(self, scope, send) -> None:
        """The ASGI answer to a scrape."""
        if not self.authorized(scope):
            status, body, ctype = 401, _DENIED, b"application/json"
        else:
            status, body, ctype = 200, self.render(), _TEXT
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": body})
