"""What the daemon knows about each kind of model server, one module per kind.

`KINDS` is the registry, in the order recognition asks: the first kind whose `recognise` accepts the probe
answers wins, and `generic` (any OpenAI-compatible server) accepts everything, so it comes last. A new kind
of server is a new module here with a `KIND` and one line in `KINDS`; model control, doctor, the context
gate, prefix affinity's slot discovery and the overflow parser pick it up from the registry.

Light on purpose (no aiohttp, no httpx): corectl's commands and the config loader may import it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from . import gemini, generic, llamacpp, lmstudio, ollama, vllm
from .base import Answers, Get, NoModelControl, Post, ServerKind, Window

KINDS: tuple[ServerKind, ...] = (ollama.KIND, lmstudio.KIND, llamacpp.KIND, vllm.KIND, gemini.KIND, generic.KIND)
GENERIC = generic.KIND
_BY_NAME = {k.name: k for k in KINDS}


def by_name(name: str) -> ServerKind:
    """The kind called `name` ("llama.cpp", "ollama", ...); the generic one for any other name."""
    return _BY_NAME.get(name, GENERIC)


@dataclass(frozen=True, slots=True)
class Detected:
    kind: ServerKind
    answers: Answers  # every probe's answer by path, for the kind to read without asking again


class Unreachable(Exception):
    """No probe got an HTTP answer: nothing listens there (or nothing answered in time)."""


async def detect(get: Get) -> Detected:
    """Which kind of server answers: every kind's probes at once (one GET per distinct path), then the first
    kind in `KINDS` that recognises the answers. Raises Unreachable when no probe got an answer at all."""
    paths = list(dict.fromkeys(p for k in KINDS for p in k.probe_paths))
    results = await asyncio.gather(*(get(p) for p in paths), return_exceptions=True)
    answers: Answers = {}
    failures: list[BaseException] = []
    for path, result in zip(paths, results, strict=True):
        if isinstance(result, asyncio.CancelledError):
            raise result
        if isinstance(result, BaseException):
            failures.append(result)
        else:
            answers[path] = result
    if not answers and failures:
        e = failures[0]
        raise Unreachable(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
    return Detected(next(k for k in KINDS if k.recognise(answers)), answers)


__all__ = ["GENERIC", "KINDS", "Answers", "Detected", "Get", "NoModelControl", "Post", "ServerKind", "Unreachable",
           "Window", "by_name", "detect"]
