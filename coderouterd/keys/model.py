"""A team key as every layer sees it: who it is (its name, never its secret), what it may use and how much.

Immutable: a change made with `corectl keys update` (here or on another instance) replaces the object, so a
request holds the version of the key it was admitted under."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

# Every secret starts with this, so a leaked one is recognisable (secret scanners, a user reading a log).
SECRET_PREFIX = "crk_"


@dataclass(frozen=True, slots=True)
class TeamKey:
    name: str  # a short identifier: what the journal, metrics, audit and refusals name
    prefix: str  # the secret's first characters, for display ("crk_3fA9"): never enough to use it
    monthly_usd: float | None = None  # None: no budget of its own (the global and provider caps still apply)
    rpm: int | None = None  # requests in any 60-second window
    tpm: int | None = None  # input + output tokens in any 60-second window
    concurrency: int | None = None  # requests in flight at once
    profiles: tuple[str, ...] = ()  # () = any profile
    models: tuple[str, ...] = ()  # fnmatch globs over the model the client asked for; () = any model
    expires_at: float | None = None  # epoch seconds; None = never
    note: str = ""
    created_at: float = 0.0
    revoked_at: float | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def allows_profile(self, profile: str) -> bool:
        return not self.profiles or profile in self.profiles

    def allows_model(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, g) for g in self.models)

    def scope_words(self) -> str:
        """What the key may use, for a 403: "profiles coding, fast; models qwen*"."""
        parts = []
        if self.profiles:
            parts.append("profiles " + ", ".join(self.profiles))
        if self.models:
            parts.append("models " + ", ".join(self.models))
        return "; ".join(parts) or "anything"
