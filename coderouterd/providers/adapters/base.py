"""What every upstream adapter shares, and the defaults the kinds override."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import orjson

from ...config.kinds import ALWAYS_LOCAL, SERVES_RESPONSES
from ..errors import UpstreamError

if TYPE_CHECKING:
    from ...config.schema import ProviderConfig
    from ..provider import Provider
    from ..strategy import Strategy

# The Messages API version sent to an Anthropic-wire upstream when the client did not name one.
ANTHROPIC_VERSION = "2023-06-01"


def error_message(body: bytes) -> tuple[str, object]:
    """(the human part of an upstream error body, the parsed body) for any of the shapes in the wild:
    OpenAI/Anthropic `{"error": {"message": ...}}`, Ollama/llama.cpp `{"error": "..."}`, a bare `message`,
    or not JSON at all (its start, as text)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:500].decode("utf-8", "replace").strip(), body.decode("utf-8", "replace")
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err), data
        if isinstance(err, str):
            return err, data
        if "message" in data:
            return str(data["message"]), data
    return body[:500].decode("utf-8", "replace"), data


class CountedRequest(Protocol):
    """A request as a backend's token count reads it (routing's ClientRequest: providers do not import routing)."""

    @property
    def body(self) -> dict: ...

    @property
    def raw(self) -> bytes: ...

    @property
    def model(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


class UpstreamAdapter(ABC):
    """One provider's upstream as its kind sees it. Built from the provider's config; holds no state."""

    kind = ""
    # The message format spoken upstream: "openai" (chat completions) or "anthropic" (Messages). Strategies
    # and usage readers key on the wire; several kinds share one.
    wire = ""
    generation_path = ""
    # Clients' claude-* model names are real models here (elsewhere they map to the backend's default).
    serves_claude_models = False
    # May forward Responses requests untranslated (config `serves_responses`): from config/kinds.py, which
    # the config schema reads too (set for each kind in __init_subclass__).
    may_serve_responses = False
    # The server behind the URL is unknown (llama.cpp, LM Studio, Ollama's /v1, a cloud API): worth asking
    # its own endpoints (model control, doctor) and looking for llama-server slots (prefix affinity).
    fronts_unknown_server = False
    # The model-control backend when the kind already says it; None = detect by probing.
    model_backend: str | None = None
    # One loaded model per server: alternating models between providers on one server reloads it.
    reloads_on_model_switch = False
    # The kind alone says the backend runs here (config `local` unset): memory pressure, drift, tool repair.
    # From config/kinds.py, like may_serve_responses.
    always_local = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.may_serve_responses = cls.kind in SERVES_RESPONSES
        cls.always_local = cls.kind in ALWAYS_LOCAL

    def __init__(self, cfg: ProviderConfig) -> None:
        self.cfg = cfg
        # ingress -> Strategy class: a function of the ingress, the wire and the config, asked on every attempt.
        self._strategies: dict[str, type[Strategy]] = {}

    # -- where ----------------------------------------------------------------------------------------------

    @property
    def api_base(self) -> str:
        """Where the generation API lives (base_url, or what the kind adds to it)."""
        return self.cfg.base_url

    @property
    def root_url(self) -> str:
        """base_url without a trailing /v1 (where llama.cpp's /tokenize and Ollama's /api live)."""
        b = self.cfg.base_url
        return b[:-3] if b.endswith("/v1") else b

    @property
    def generation_url(self) -> str:
        return self.api_base + self.generation_path

    @property
    def models_url(self) -> str:
        """The model list the daemon reads for model resolution."""
        return f"{self.cfg.base_url}/models"

    @property
    def probe_url(self) -> str:
        """The cheap GET behind the health probe and doctor's reachability check."""
        return f"{self.cfg.base_url}/models"

    # -- who ------------------------------------------------------------------------------------------------

    def api_key(self) -> str | None:
        env = self.cfg.api_key_env
        return os.environ.get(env) or None if env else None

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def add_wire_headers(self, headers: dict[str, str], client: Mapping[str, str] | None) -> None:
        """Headers the wire needs on every call (API version and the like), the client's taking precedence."""
        return None  # the OpenAI-compatible wire needs none; the Anthropic adapter adds its version header

    def headers(self, *, client: Mapping[str, str] | None = None, forward_client_key: bool = False,
                json: bool = False, stream: bool = False) -> dict[str, str]:
        """Every request's headers, in one order: configured headers, wire headers (the client's first),
        the client's own key when configured to forward it, then our key (which wins)."""
        h = {"content-type": "application/json"} if json else {}
        h.update(self.cfg.headers)
        self.add_wire_headers(h, client)
        if forward_client_key and client:
            for name in ("x-api-key", "authorization"):
                v = client.get(name)
                if v:
                    h[name] = v
        h.update(self.auth_headers(self.api_key()))
        if stream:
            h["accept"] = "text/event-stream"
        return h

    # -- what -----------------------------------------------------------------------------------------------

    @staticmethod
    def model_ids(data: object) -> list[str]:
        """Model names from a model list in any of the shapes (OpenAI `data[].id`, Ollama `models[].name`)."""
        if not isinstance(data, dict):
            return []
        entries = data.get("data") or data.get("models") or []
        ids = [m.get("id") or m.get("name") for m in entries if isinstance(m, dict)]
        return [m for m in ids if isinstance(m, str) and m]

    def ping_request(self, model: str) -> tuple[str, dict]:
        """The smallest real generation (one token): the adaptive-routing latency probe."""
        return self.generation_url, {"model": model, "max_tokens": 1,
                                     "messages": [{"role": "user", "content": "ping"}]}

    def strategy_for(self, ingress: str) -> type[Strategy]:
        """The Strategy class that turns a client's `ingress` wire into this upstream's and back."""
        cls = self._strategies.get(ingress)
        if cls is not None:
            return cls
        # Translators load with the request path, not with config.
        if ingress == "responses":
            from ..responses_strategies import responses_strategy_for

            cls = responses_strategy_for(self.wire, self.cfg.serves_responses)
        elif ingress == "gemini":
            from ..gemini_strategies import gemini_strategy_for

            cls = gemini_strategy_for(self.wire)
        else:
            from ..strategies import strategy_for

            cls = strategy_for(ingress, self.wire)
        self._strategies[ingress] = cls
        return cls

    @abstractmethod
    def classify_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
        """An HTTP error answer as routing should see it (overflow, retry-after, failover or not)."""

    async def count_tokens(self, provider: Provider, req: CountedRequest) -> tuple[int, str] | None:
        """The prompt's exact token count from the backend, with its source label; None when it cannot say.
        Network errors propagate (the caller falls back to an estimate)."""
        return None

    @cached_property
    def signer(self) -> str:
        """Who signs this upstream's thinking blocks: its origin (providers at one origin share signatures).
        An adapter lives as long as its provider's config, so this is worked out once."""
        parts = urlsplit(self.cfg.base_url)
        return f"{parts.scheme}://{parts.netloc}".lower()

    def keeps_billing_header(self) -> bool:
        """Whether this upstream reads Claude Code's billing header (else prefix affinity canonicalises it)."""
        return False
