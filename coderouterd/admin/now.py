"""The dashboard's "now" answer (GET /ui/api/now): the admin API's status sections, plus what the page needs to
say why something is down and what needs attention: each managed process's last exit and last log line, the
shared database's state, and the newest notable events (ui/feed.py). Built as admin/apitype.DashboardNow.

A process's last log line is read from the end of its log file, in a worker thread (never on the loop), at most
`_TAIL_BYTES` of it, and clipped: the log is the backend's own output (a model server's), so one line, bounded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from ..supervise.spec import describe_exit
from . import apitype, views

if TYPE_CHECKING:  # the daemon hands itself in; this module reads it, never imports it at run time
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

_TAIL_BYTES = 4096
_MAX_LINE = 300


def last_line(path: str | Path) -> str | None:
    """The last non-empty line of a file (its final `_TAIL_BYTES`), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read(_TAIL_BYTES)
    except OSError:
        return None
    lines = [ln for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip()[:_MAX_LINE] if lines else None


async def now(d: Daemon) -> apitype.DashboardNow:
    procs = views.processes(d)
    logs: dict[str, str] = {n: str(log) for n, p in procs.items() if (log := getattr(p, "log", None))}

    def tails() -> dict[str, str | None]:
        return {n: last_line(p) for n, p in logs.items()}

    lines = await asyncio.to_thread(tails) if logs else {}
    for name, p in procs.items():
        p.last_exit = describe_exit(p.last_exit_code) if p.last_exit_code is not None else None
        p.last_log_line = lines.get(name)
    return apitype.DashboardNow(
        daemon=views.daemon_info(d), providers=views.provider_rows(d), processes=procs, store=views.store(d),
        shared=views.shared(d), in_flight=dict(d.in_flight), viewers=d.live.viewers,
        events=[apitype.FeedEvent.model_validate(e) for e in d.live.recent()],
        budget_warn_ratio=d.runtime.config.budget.warn_ratio, budget_global=views.budget(d).global_,
        models=views.models_memory(d))
