"""The per-request hook: after every request, from its record (routing/record.py): the journal's events
(metrics, stats), the drift detector's sample, the decision trace kept for `corectl explain`, and the one log
line. None of them writes to the record, so their order does not matter; the cost is computed once, here, and
handed to the journal and the trace."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .request_record import RequestRecorder, request_cost
from .traces import RecentTraces

if TYPE_CHECKING:
    from ..routing.record import RequestRecord

req_log = logging.getLogger("coderouterd.request")


class RequestFinisher:
    def __init__(self, recorder: RequestRecorder, traces: RecentTraces, *, drift=None) -> None:
        self.recorder = recorder
        self.traces = traces
        self.drift = drift  # quality.drift_actions.DriftManager, fed every finished request

    def __call__(self, record: RequestRecord) -> None:
        req = record.req
        latency = time.monotonic() - req.started
        cost = request_cost(record)
        self.recorder.record(record, latency, cost)
        if self.drift is not None:
            self.drift.record(record)
        self.traces.add(req.request_id, record.trace(latency, cost_usd=cost))
        if record.status >= 400 or len(record.attempts) > 1 or record.skips:
            # "provider=-" when nobody served it (not "None").
            req_log.info("%s %s profile=%s provider=%s status=%s attempts=%s", req.request_id, req.ingress,
                         record.profile_name, record.served_by or record.answered_by or "-", record.status,
                         record.attempts_header())
        elif req_log.isEnabledFor(logging.DEBUG):
            req_log.debug("%s %s profile=%s provider=%s status=%s", req.request_id, req.ingress,
                          record.profile_name, record.served_by, record.status)
