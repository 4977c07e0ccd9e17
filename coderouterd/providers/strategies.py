"""Which strategy serves a client of a chat ingress (Anthropic Messages, OpenAI chat completions) for an upstream
wire. The strategies themselves: the base in strategy.py, the pairs in anthropic_strategies.py and
openai_strategies.py (their names are importable from here too, as they were when they lived here)."""

from __future__ import annotations

from .anthropic_strategies import AnthropicPassthrough, AnthropicToOpenAIUpstream
from .openai_strategies import OpenAIPassthrough, OpenAIToAnthropicUpstream
from .strategy import Strategy

__all__ = ["AnthropicPassthrough", "AnthropicToOpenAIUpstream", "OpenAIPassthrough", "OpenAIToAnthropicUpstream",
           "Strategy", "strategy_for"]


def strategy_for(ingress: str, upstream_wire: str) -> type[Strategy]:
    """By (client wire, upstream wire) for the chat ingresses; callers go through their provider's adapter
    (`adapter.strategy_for`), which takes Responses and Gemini clients to responses_strategies.py and
    gemini_strategies.py (this module does not import them)."""
    if ingress in ("responses", "gemini"):
        raise ValueError(f"{ingress} clients: {ingress}_strategies.{ingress}_strategy_for")
    if ingress == "anthropic":
        return AnthropicPassthrough if upstream_wire == "anthropic" else AnthropicToOpenAIUpstream
    return OpenAIToAnthropicUpstream if upstream_wire == "anthropic" else OpenAIPassthrough
