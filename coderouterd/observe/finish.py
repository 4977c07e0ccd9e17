"""The per-request hook: after every request, its record (journal, metrics, stats), the drift detector's
sample, the decision trace kept for `corectl explain`, and the one log line."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .request_record import RequestRecorder
from .traces import RecentTraces

if TYPE_CHECKING:
    from ..routing.executor import Exchange

req_log = logging.getLogger("coderouterd.request")


class RequestFinisher:
    def __init__(self, recorder: RequestRecorder, traces: RecentTraces, *, drift=None) -> None:
        self.recorder = recorder
        self.traces = traces
        self.drift = drift  # health.drift_actions.DriftManager, fed every finished request

    def __call__(self, ex: Exchange) -> None:
        latency = time.monotonic() - ex.req.started
        self.recorder.record(ex, latency)
        if self.drift is not None:
            self.drift.record(ex)
        self.traces.add(ex.req.request_id, ex.trace(latency))
        if ex.status >= 400 or len(ex.attempts) > 1 or ex.skips:
            # "provider=-" when nobody served it (not "None").
            req_log.info("%s %s profile=%s provider=%s status=%s attempts=%s", ex.req.request_id, ex.req.ingress,
                         ex.profile_name, ex.served_by or "-", ex.status, ex.attempts_header())
        elif req_log.isEnabledFor(logging.DEBUG):
            req_log.debug("%s %s profile=%s provider=%s status=%s", ex.req.request_id, ex.req.ingress,
                          ex.profile_name, ex.served_by, ex.status)
