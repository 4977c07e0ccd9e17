"""One generation of configuration made live: providers (with their pools), routes, facts.

A config reload builds a new Runtime and swaps it in one assignment; requests already running keep the one
they started with. Providers whose endpoint settings did not change keep their connection pools."""

from __future__ import annotations

import asyncio
import fnmatch

from .config import LoadedConfig
from .ids import clip
from .providers.pinning import PinLookup
from .providers.pool import Pool
from .providers.provider import Provider
from .routing.router import Router


class UnknownProfile(Exception):
    def __init__(self, name: str, valid: list[str]) -> None:
        super().__init__(f"unknown profile {clip(name)!r}; valid profiles: {', '.join(valid)}")
        self.name = name
        self.valid = valid


class Runtime:
    def __init__(self, loaded: LoadedConfig, providers: dict[str, Provider], *,
                 retired_pools: list[Pool] | None = None) -> None:
        self.loaded = loaded
        self.retired_pools = retired_pools or []
        self.config = loaded.model
        self.path = loaded.path
        self.providers = providers
        self.facts = Router.facts(providers)
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


def build_runtime(loaded: LoadedConfig, previous: Runtime | None = None, *, pins: PinLookup | None = None) -> Runtime:
    """`pins`: what each managed server's last READY verified, for its providers' pools (providers/pinning.py)."""
    providers: dict[str, Provider] = {}
    kept: set[int] = set()
    for name, cfg in loaded.model.providers.items():
        old = previous.providers.get(name) if previous else None
        p = Provider(name, cfg, previous=old, pins=pins)
        if old is not None and p.pool is old.pool:
            kept.add(id(old.pool))
        providers[name] = p
    retired: list[Pool] = []
    if previous is not None:
        # A replaced pool closes when its last call ends (requests of the old generation may still stream
        # through it); the ones not closed yet are remembered so shutdown can close them too.
        retired = [pool for pool in previous.retired_pools if pool.open]
        for p in previous.providers.values():
            if id(p.pool) not in kept:
                p.pool.retire()
                retired.append(p.pool)
    return Runtime(loaded, providers, retired_pools=retired)


async def close_pools(runtime: Runtime) -> None:
    """Shutdown: every pool the daemon still holds, current and retired, closed once."""
    pools = {id(p.pool): p.pool for p in runtime.providers.values()}
    pools.update((id(pool), pool) for pool in runtime.retired_pools)
    await asyncio.gather(*(pool.drain() for pool in pools.values()), return_exceptions=True)
