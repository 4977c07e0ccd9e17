"""Ollama: its OpenAI-compatible /v1 routes for generation, its native /api for health and model control."""

from __future__ import annotations

from .openai import OpenAIAdapter


class OllamaAdapter(OpenAIAdapter):
    kind = "ollama"
    fronts_unknown_server = False
    model_backend = "ollama"
    reloads_on_model_switch = True

    @property
    def api_base(self) -> str:
        # base_url may be the server root (http://host:11434) or its /v1; generation goes through /v1.
        b = self.cfg.base_url
        return b if b.endswith("/v1") else b + "/v1"

    @property
    def probe_url(self) -> str:
        return f"{self.root_url}/api/tags"
