"""State that must survive a restart, mirrored into the store as it changes (written by the store's own
thread within its flush interval, so a kill -9 loses at most that): breakers and health of the routing
state, the prefix-affinity index, the active profile."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .state import BreakerTransition, HealthTransition

if TYPE_CHECKING:
    from .upstream.breaker import BreakerSnapshot

NS_BREAKERS = "breakers"
NS_HEALTH = "health"
NS_DAEMON = "daemon"
NS_AFFINITY = "affinity"


class PersistedState:
    def __init__(self, store, publish: Callable[[object], None]) -> None:
        self.store = store
        self._publish = publish

    # -- routing state: hooks given to RoutingState's constructor --------------------------------------------

    def breaker_moved(self, name: str, snapshot: BreakerSnapshot, old, new, reason: str) -> None:
        self.store.set(NS_BREAKERS, name, snapshot)
        self._publish(BreakerTransition(provider=name, old=str(old), new=str(new), reason=reason))

    def health_moved(self, provider: str, old: str, new: str, reason: str) -> None:
        self.store.set(NS_HEALTH, provider, new)
        self._publish(HealthTransition(provider=provider, old=old, new=new, reason=reason))

    def restore_routing(self, state, managed: set[str] | frozenset = frozenset()) -> None:
        """Load the breakers and health a previous process persisted into the routing state. Not the health of
        `managed` providers: theirs restarts from their own process's readiness (out of routing until it is
        ready, then probed at once); a saved UNHEALTHY from before a crash would otherwise outlive the restart
        until the next probe tick."""
        health = {}
        for name, value in self.store.items(NS_HEALTH).items():
            if name in managed:
                self.store.delete(NS_HEALTH, name)
            else:
                health[name] = value
        for name in state.restore(self.store.items(NS_BREAKERS), health):
            self.store.delete(NS_BREAKERS, name)

    # -- prefix affinity: its persist hook, and its index at start -------------------------------------------

    def affinity_changed(self, provider: str, snapshot) -> None:
        self.store.set(NS_AFFINITY, provider, snapshot)

    def restore_affinity(self, affinity) -> None:
        affinity.restore(self.store.items(NS_AFFINITY))

    # -- the active profile chosen by `corectl profile use` ----------------------------------------------------

    def active_profile(self) -> str | None:
        name = self.store.get(NS_DAEMON, "active_profile")
        return name if isinstance(name, str) and name else None

    def set_active_profile(self, name: str) -> None:
        self.store.set(NS_DAEMON, "active_profile", name)
