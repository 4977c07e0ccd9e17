"""Ollama keeps one model loaded per set of load-time options; a request that asks for another model (or
another context size) on the same server unloads it, and the prompt cache goes with it.

coderouterd sends Ollama no per-request options (num_ctx and the like come from the server or the model),
so a session's options cannot drift. What still reloads a model is a profile that alternates between
providers on one Ollama server with different models: that is what this warns about at start and reload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..providers.adapters import adapter_for

if TYPE_CHECKING:
    from ..config.schema import ConfigModel


def reload_risks(config: ConfigModel) -> list[str]:
    """One warning per profile that may switch models on a single Ollama server."""
    warnings = []
    for pname, prof in config.profiles.items():
        servers: dict[str, dict[str, str]] = {}
        for name in prof.providers:
            p = config.providers.get(name)
            if p is None or not adapter_for(p).reloads_on_model_switch or not p.affinity:
                continue
            servers.setdefault(p.base_url.rstrip("/"), {})[name] = p.model or "(client's model)"
        for url, members in servers.items():
            if len(set(members.values())) > 1 or (len(members) > 1 and "(client's model)" in members.values()):
                listed = ", ".join(f"{n} ({m})" for n, m in members.items())
                how = ("races" if prof.mode == "race" else "balances" if prof.mode == "balance"
                       else "adapts its order" if prof.adaptive else "falls back")
                warnings.append(f"profile {pname!r} {how} between {listed} on one Ollama server ({url}): each "
                                f"switch may reload the model and drop its prompt cache; give each model its own "
                                f"server or keep one model per profile")
    return warnings
