"""One generation of configuration made live: providers (with their pools), routes, facts.

A config reload builds a new Runtime and swaps it in one assignment; requests already running keep the one
they started with. Providers whose endpoint settings did not change keep their connection pools."""

from __future__ import annotations

import asyncio
import fnmatch

from .config import LoadedConfig
from .providers.runtime import Provider
from .routing.router import Router

# Pools of providers dropped by a reload are closed after this long, so streams still using them can finish.
RETIRED_POOL_GRACE_S = 600.0


class UnknownProfile(Exception):
    def __init__(self, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown profile {name!r}; valid profiles: {', '.join(valid)}")
        self.name = name
        self.valid = valid


class Runtime:
    def __init__(self, loaded: LoadedConfig, providers: dict[str, Provider]) -> None:
        self.loaded = loaded
        self.config = loaded.model
        self.path = loaded.path
        self.providers = providers
        self.facts = Router.facts(self)
        self.routes = [(r.model.lower(), r.profile) for r in self.config.routes]
        self.profile_names = sorted(self.config.profiles)

    def select_profile(self, header: str | None, model: str, active: str) -> str:
        """X-CodeRouter-Profile header, else the first matching [[routes]] glob, else the active profile."""
        profiles = self.config.profiles
        if header:
            if header not in profiles:
                raise UnknownProfile(header, self.profile_names)
            return header
        if self.routes and model:
            m = model.lower()
            for glob, profile in self.routes:
                if fnmatch.fnmatchcase(m, glob):
                    return profile
        if active in profiles:
            return active
        return self.config.server.default_profile


def build_runtime(loaded: LoadedConfig, previous: Runtime | None = None) -> Runtime:
    providers: dict[str, Provider] = {}
    reused: set[str] = set()
    for name, cfg in loaded.model.providers.items():
        p = Provider(name, cfg)
        old = previous.providers.get(name) if previous else None
        if old is not None and old.pool_key() == p.pool_key():
            p._session = old._session
            p._models, p._models_at = old._models, old._models_at
            p.chars_per_token = old.chars_per_token
            p.tokenize_supported = old.tokenize_supported
            reused.add(name)
        providers[name] = p
    if previous is not None:
        retired = [p for n, p in previous.providers.items() if n not in reused]
        if retired:
            loop = asyncio.get_running_loop()
            for p in retired:
                loop.call_later(RETIRED_POOL_GRACE_S, lambda p=p: asyncio.ensure_future(p.close()))
    return Runtime(loaded, providers)
