"""Per-provider tool-call repair figures since start: answers that went through repair, how many of them had
calls repaired, and in which formats. Fed from the event bus (writer thread), read by `corectl status`/`top`."""

from __future__ import annotations

from collections import Counter


class RepairStats:
    def __init__(self) -> None:
        self._answers: Counter[str] = Counter()
        self._repaired: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()
        self._formats: dict[str, Counter[str]] = {}

    def sink(self, events: list) -> None:
        for ev in events:
            kind = ev.kind
            if kind == "request_finished" and ev.tool_repair and ev.provider:
                self._answers[ev.provider] += 1
            elif kind == "tool_repaired":
                self._repaired[ev.provider] += 1
                self._calls[ev.provider] += ev.calls
                self._formats.setdefault(ev.provider, Counter()).update(ev.formats)

    def snapshot(self, provider: str) -> dict:
        answers = self._answers.get(provider, 0)
        repaired = self._repaired.get(provider, 0)
        formats = self._formats.get(provider)
        return {"answers": answers, "repaired": repaired, "calls": self._calls.get(provider, 0),
                "rate": repaired / answers if answers else None,
                "formats": dict(formats) if formats else {}}
