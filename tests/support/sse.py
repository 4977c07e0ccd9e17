"""Reading Anthropic SSE bodies in tests."""

from __future__ import annotations

import orjson


def event_names(sse: str) -> list[str]:
    return [ln[7:] for ln in sse.splitlines() if ln.startswith("event: ")]


def streamed_text(sse: str) -> str:
    """The text the client would show: every text_delta, joined."""
    out = []
    for ln in sse.splitlines():
        if ln.startswith("data: ") and '"text_delta"' in ln:
            out.append(orjson.loads(ln[6:])["delta"]["text"])
    return "".join(out)
