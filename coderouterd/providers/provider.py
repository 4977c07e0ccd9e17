"""A configured upstream at run time: its connection pool, credentials and model discovery."""

from __future__ import annotations

import asyncio
import functools
import time

import orjson

from ..config.schema import ProviderConfig
from .adapters import adapter_for
from .errors import CONNECT, MODEL_DISCOVERY, UpstreamError, redirect_error
from .limits import MAX_AUX_BYTES, BodyTooLarge, read_capped
from .pinning import PinLookup
from .pool import Pool
from .upstream_session import UpstreamSession

MODEL_CACHE_TTL_S = 300.0


class Provider:
    """One named upstream. Its connection pool lives as long as the provider's endpoint settings do: a config
    reload that leaves them unchanged hands the same Pool (and its warm connections) to the new Provider."""

    def __init__(self, name: str, cfg: ProviderConfig, pool: Pool | None = None, *,
                 previous: Provider | None = None, pins: PinLookup | None = None) -> None:
        """`previous`: this provider in the configuration a reload replaces; when its endpoint settings are
        unchanged, its pool and what was learnt about the backend carry over. `pins`: what each managed server's
        last READY verified (the daemon's supervisor); a managed provider's pool connects only there."""
        self.name = name
        self.cfg = cfg
        self.adapter = adapter_for(cfg)  # what this provider's kind means for URLs, headers and errors
        self._models: list[str] | None = None
        self._models_at = 0.0
        self._models_lock: asyncio.Lock | None = None
        # Characters per token observed on this backend (prompt size vs reported prompt tokens), for estimates.
        self.chars_per_token = 3.6
        self.ratio_learned = False  # chars_per_token has been taught by this backend's reports
        self.tokenize_supported: bool | None = None
        self.template_count_supported: bool | None = None  # llama.cpp's /apply-template + /tokenize
        if previous is not None and previous.pool_key() == self.pool_key():
            pool = previous.pool
            self._models, self._models_at = previous._models, previous._models_at
            self.chars_per_token = previous.chars_per_token
            self.ratio_learned = previous.ratio_learned
            self.tokenize_supported = previous.tokenize_supported
            self.template_count_supported = previous.template_count_supported
        if pool is None:
            managed = pins is not None and cfg.process is not None
            pool = Pool(cfg.timeouts.connect, pinned=(name, functools.partial(pins, name)) if managed and pins else None)
        self.pool: Pool = pool

    def pool_key(self) -> tuple:
        c = self.cfg
        # Managed or not decides whether the pool's connections are pinned (pinning.py).
        return (c.kind, c.base_url, c.timeouts.connect, c.api_key_env, tuple(sorted(c.headers.items())),
                c.process is not None)

    def session(self) -> UpstreamSession:
        return self.pool.session()

    async def close(self) -> None:
        await self.pool.drain()

    def api_key(self) -> str | None:
        return self.adapter.api_key()

    @property
    def root_url(self) -> str:
        """base_url without a trailing /v1 (where llama.cpp's /tokenize and Ollama's /api live)."""
        return self.adapter.root_url

    def auth_headers(self) -> dict[str, str]:
        return self.adapter.auth_headers(self.api_key())

    # -- models ---------------------------------------------------------------------------------------------

    async def list_models(self, *, refresh: bool = False) -> list[str]:
        import aiohttp  # loaded after start-up; see Daemon._start_background
        now = time.monotonic()
        if not refresh and self._models is not None and now - self._models_at < MODEL_CACHE_TTL_S:
            return self._models
        if self._models_lock is None:
            self._models_lock = asyncio.Lock()
        async with self._models_lock:
            if not refresh and self._models is not None and time.monotonic() - self._models_at < MODEL_CACHE_TTL_S:
                return self._models
            headers = self.adapter.headers()
            try:
                async with asyncio.timeout(self.cfg.timeouts.connect + 5):
                    async with self.session().get(self.adapter.models_url, headers=headers) as r:
                        if 300 <= r.status < 400:  # not followed (upstream_session.py)
                            raise redirect_error(r.status, r.headers.get("location"))
                        if r.status >= 400:
                            raise UpstreamError(MODEL_DISCOVERY, status=r.status,
                                                message=f"listing models failed with HTTP {r.status}")
                        data = orjson.loads(await read_capped(r, MAX_AUX_BYTES, "model list"))
            except BodyTooLarge as e:
                raise UpstreamError(MODEL_DISCOVERY, message=str(e)) from None
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                raise UpstreamError(CONNECT, message=f"listing models: {type(e).__name__}: {e}") from None
            except orjson.JSONDecodeError:
                raise UpstreamError(MODEL_DISCOVERY, message="model list is not JSON") from None
            self._models = self.adapter.model_ids(data)
            self._models_at = time.monotonic()
            return self._models

    async def resolve_model(self, requested: str) -> str:
        """SPEC model mapping: configured model wins; else the client's, except claude-* names on a
        non-Anthropic backend, which get the backend's default model (configured, else the first it lists)."""
        if self.cfg.model:
            return self.cfg.model
        if not self.adapter.serves_claude_models and (not requested or requested.startswith("claude")):
            if self.cfg.default_model:
                return self.cfg.default_model
            models = await self.list_models()
            if not models:
                raise UpstreamError(MODEL_DISCOVERY, message="the backend lists no models")
            return models[0]
        return requested

    def learn_ratio(self, chars: int, prompt_tokens: int) -> None:
        if chars > 200 and prompt_tokens > 20:
            observed = chars / prompt_tokens
            # The first report replaces the default outright: a chat template that renders no tool schemas makes
            # the real ratio several times the usual one, and a slow start would gate a fitting prompt meanwhile.
            self.chars_per_token = 0.8 * self.chars_per_token + 0.2 * observed if self.ratio_learned else observed
            self.ratio_learned = True

    def estimate_tokens(self, chars: int) -> int:
        return int(chars / self.chars_per_token) + 1
