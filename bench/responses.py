"""Responses ingress vs chat ingress: the same conversation sent to coderouterd as a Responses body (what Codex
sends) and as its chat-completions equivalent, against the same fast fake OpenAI-compatible upstream.

    .venv/bin/python bench/responses.py [--quick]

Loopback only. The daemon is pinned to core 0; the fake upstreams and this load generator share core 1 (the
same layout as bench/proxy.py). Scenarios: a small body, a Codex-sized body (~40 KB: developer instructions and
Codex's tool list), each non-streaming and streaming (20 text chunks upstream).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.codex_body import as_chat, codex_body, small_body  # noqa: E402
from bench.ingress_vs_chat import Request, compare_with_chat  # noqa: E402


def _request(make: Callable[[bool], dict]) -> Request:
    def request(stream: bool) -> tuple[str, bytes, bytes]:
        body = make(stream)
        return "/v1/responses", orjson.dumps(body), orjson.dumps(as_chat(body))
    return request


if __name__ == "__main__":
    raise SystemExit(compare_with_chat("responses", [("small", _request(small_body)),
                                                     ("Codex-sized", _request(codex_body))]))
