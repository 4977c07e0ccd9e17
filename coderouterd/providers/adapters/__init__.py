"""One adapter per upstream kind: everything that differs between an OpenAI-compatible server, the
Anthropic API, Ollama and the Gemini API (URLs, auth and version headers, model listing, token counting, the probe
request, error classification, which strategy speaks its wire) lives in that kind's adapter.

`adapter_for(cfg)` is the one place that looks at `cfg.kind`; everything else asks the adapter. A new
upstream kind is a new module here plus one line in `_BY_KIND` (and the `kind` Literal in the config
schema). Kept light (no aiohttp, no translators at import): the config schema and corectl import it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .anthropic import AnthropicAdapter
from .base import ANTHROPIC_VERSION, UpstreamAdapter, error_message
from .gemini import GeminiAdapter
from .ollama import OllamaAdapter
from .openai import OpenAIAdapter

if TYPE_CHECKING:
    from ...config.schema import ProviderConfig

_BY_KIND: dict[str, type[UpstreamAdapter]] = {
    "openai": OpenAIAdapter,
    "anthropic": AnthropicAdapter,
    "ollama": OllamaAdapter,
    "gemini": GeminiAdapter,
}


def adapter_for(cfg: ProviderConfig) -> UpstreamAdapter:
    """The adapter for one provider's config (a ProviderConfig, or anything with its fields)."""
    try:
        cls = _BY_KIND[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {cfg.kind!r}") from None
    return cls(cfg)


__all__ = ["ANTHROPIC_VERSION", "AnthropicAdapter", "GeminiAdapter", "OllamaAdapter", "OpenAIAdapter", "UpstreamAdapter",
           "adapter_for", "error_message"]
