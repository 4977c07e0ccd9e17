"""What the model lists of every wire (OpenAI's and Anthropic's /v1/models, Gemini's models) name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..keys.model import TeamKey
    from ..runtime import Runtime


def model_ids(runtime: Runtime, key: TeamKey | None) -> list[tuple[str, str]]:
    """(model id, where it comes from) for the model lists of every wire: each provider's model, each profile as
    `profile:NAME`. A scoped key lists what it may ask for: its models, and its profiles by name."""
    ids = [(p.cfg.model or name, name) for name, p in runtime.providers.items()]
    ids += [(f"profile:{n}", n) for n in runtime.profile_names]
    if key is not None and (key.profiles or key.models):
        ids = [(i, src) for i, src in ids
               if (key.allows_profile(src) if i.startswith("profile:") else key.allows_model(i))]
    return ids
