"""What routing reads of one configuration generation: the config, its providers and their routing facts.

The generation itself (`runtime.Runtime`) is built above routing: it makes the providers and their pools live
and asks `Router.facts` for their facts. Routing is handed one per request and names it by this protocol, so
the two do not depend on each other both ways."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..config.schema import ConfigModel
    from ..providers.provider import Provider
    from .planner import ProviderFacts


class Generation(Protocol):
    @property
    def config(self) -> ConfigModel: ...

    @property
    def providers(self) -> dict[str, Provider]: ...

    @property
    def facts(self) -> dict[str, ProviderFacts]: ...
