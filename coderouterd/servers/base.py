"""What a server kind module provides, and the shapes it answers in.

A kind module knows one model server (llama.cpp's llama-server, Ollama, LM Studio, vLLM, or any other
OpenAI-compatible server): how to recognise it, its model list and model control, its context window and
slots, where it reports cached prompt tokens, and how its context-overflow errors read. It performs no I/O of
its own: it is handed an async GET (and POST) so the daemon (aiohttp), corectl doctor (httpx) and the unit
tests (plain dicts) share the same knowledge. Nothing here imports the rest of the daemon."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# GET a path under the server's root (base_url without /v1): (HTTP status, parsed JSON or None when the body
# is not JSON). Raises when nothing answers (refused, timed out), so "not this kind" and "not there" differ.
Get = Callable[[str], Awaitable[tuple[int, Any]]]
# POST JSON to a path under the root with a timeout: the parsed answer; raises on an HTTP error.
Post = Callable[[str, dict, float], Awaitable[Any]]
# The answers to every kind's recognition probes, by path: (status, JSON or None); absent = no answer.
Answers = dict[str, tuple[int, Any]]


class NoModelControl(Exception):
    """This kind of server has no API to load or unload models."""


@dataclass(frozen=True, slots=True)
class Window:
    """A context window as a server reports it. `tokens` is what one request may use (per slot on
    llama-server), None when unknown. `firm` is False for a guess (Ollama's default when nothing says
    otherwise): shown to the user, never used to turn a request away. `trained` is the model's own maximum."""

    tokens: int | None
    source: str = ""
    trained: int | None = None
    firm: bool = True


def positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def wording(pattern: str) -> re.Pattern:
    """An overflow message pattern with named groups `prompt` and/or `limit` (matched on the lower-cased
    message; numbers may carry thousands separators)."""
    return re.compile(pattern)


class ServerKind:
    name = ""            # the backend label in answers and doctor ("llama.cpp", "ollama", ...)
    label = ""           # what users call it
    default_port = 0     # where `corectl init` looks for it on loopback (0: nowhere)
    models_path = "/v1/models"  # its model list, for `corectl init`
    probe_paths: tuple[str, ...] = ()  # GETs under the root that `recognise` reads
    # Where it reports the prompt tokens it took from its cache (documentation for readers of usage).
    cached_tokens = "usage.prompt_tokens_details.cached_tokens, when the server fills it"
    # How its context-overflow errors read: substrings that say "overflow" and full wordings with numbers.
    overflow_markers: tuple[str, ...] = ()
    overflow_wordings: tuple[re.Pattern, ...] = ()
    # Reads OpenAI's named tool choice (`{"type": "function", "function": {"name": ...}}`). A server that reads
    # only the strings gets "required" with the named tool alone offered: the same constraint.
    named_tool_choice = True

    def recognise(self, answers: Answers) -> bool:
        return False

    def typed_overflow(self, err: dict) -> tuple[int, int] | None:
        """(prompt tokens, limit) from machine-readable fields of an error object, when the kind has them."""
        return None

    def slots(self, answers: Answers) -> int:
        """How many request slots the server has and lets a client choose (0: not a slot server)."""
        return 0

    async def window(self, get: Get, model: str, answers: Answers, post: Post | None = None) -> Window:
        """The context one request may use with `model` (the configured one; "" when clients choose)."""
        return Window(None)

    async def list_models(self, get: Get) -> list[dict] | None:
        """Available models with their load state; None: only the OpenAI model list is known."""
        return None

    async def load(self, get: Get, post: Post, model: str, timeout: float) -> dict:
        raise NoModelControl(self.name)

    async def unload(self, get: Get, post: Post, model: str, timeout: float) -> dict:
        raise NoModelControl(self.name)
