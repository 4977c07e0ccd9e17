"""POST /v1/messages/count_tokens: exact where the backend can count, a calibrated estimate otherwise.

Order: a native Anthropic provider counts for us; an OpenAI-compatible backend with a tokenizer endpoint
(llama.cpp's /tokenize) counts the rendered prompt text; else characters divided by the chars-per-token
ratio learned from the usage that backend reported on real requests (default 3.6)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
import orjson

from ..translate.anthropic_request_to_openai import request_to_openai

if TYPE_CHECKING:
    from ..routing.request import ClientRequest
    from ..routing.router import Router
    from ..runtime import Runtime

_TIMEOUT_S = 10.0


async def count_tokens(req: ClientRequest, runtime: Runtime, router: Router, profile: str) -> tuple[int, str]:
    plan = router.plan(profile, runtime.config.profiles[profile], runtime, req)
    names = plan.candidates or list(runtime.config.profiles[profile].providers)
    provider = runtime.providers[names[0]]
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            counted = await provider.adapter.count_tokens(provider, req)
            if counted is not None:
                return counted
    except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError, ValueError, KeyError):
        pass
    # Same basis as the ratio learned from real traffic: the size of the request as sent upstream.
    upstream_body, _ = request_to_openai(req.body, req.model, stream=False)
    return provider.estimate_tokens(len(orjson.dumps(upstream_body))), f"estimate:{provider.name}"
