"""What a managed process's event says beyond routing (which the upstreams registry hears first: upstream/): the audit
line per provider it serves, and the hooks for a fresh start (its KV cache is gone) and for readiness (ask the server
what it is). Built with the daemon, before self-healing, so nothing of a process's first moments is lost; light to
import (the daemon builds it before the proxy answers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..state import ProcessEvent
from ..state.events import ProcessEventName

E = ProcessEventName
UP = frozenset({E.READY, E.ADOPTED})  # the process answers


class ProcessNews:
    """What every process event says beyond routing (which the upstreams registry hears first): the audit line per
    provider, and the hooks for a fresh start (its KV cache is gone) and for readiness (ask the server what it is).
    Built with the daemon, before self-healing: nothing of a process's first moments is lost."""

    def __init__(self, *, supervisor: Callable[[], Any], publish: Callable[[ProcessEvent], object] | None = None,
                 fresh_start: Callable[[list[str]], None] | None = None,
                 ready: Callable[[list[str]], None] | None = None) -> None:
        self._supervisor = supervisor
        self.publish = publish
        self._fresh_start = fresh_start
        self._ready = ready

    def providers(self, name: str) -> list[str]:
        sup = self._supervisor()
        return list(sup.providers_of(name)) if sup is not None else []

    def __call__(self, name: str, event: ProcessEventName, pid: int | None, detail: str) -> None:
        providers = self.providers(name)
        if self.publish is not None:
            for i, p in enumerate(providers or [name]):
                self.publish(ProcessEvent(provider=p, process=name, event=event, pid=pid, detail=detail,
                                          primary=i == 0))
        if event is E.STARTED and providers and self._fresh_start is not None:
            self._fresh_start(providers)
        if event in UP and providers and self._ready is not None:
            self._ready(providers)
