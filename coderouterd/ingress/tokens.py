"""POST /v1/messages/count_tokens: exact where the backend can count, a calibrated estimate otherwise.

Order: a native Anthropic provider counts for us; an OpenAI-compatible backend with a tokenizer endpoint
(llama.cpp's /tokenize) counts the rendered prompt text; else characters divided by the chars-per-token
ratio learned from the usage that backend reported on real requests (default 3.6)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from ..translate.anthropic_to_openai import request_to_openai

_TIMEOUT_S = 10.0


def prompt_text(body: dict) -> str:
    """The text a chat template would see, near enough for counting: system, messages, tool schemas."""
    oa, _ = request_to_openai(body, body.get("model") or "", stream=False)
    parts: list[str] = []
    for m in oa.get("messages", []):
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c if isinstance(p, dict))
        for tc in m.get("tool_calls") or []:
            parts.append(tc["function"]["name"] + tc["function"]["arguments"])
    if oa.get("tools"):
        parts.append(orjson.dumps(oa["tools"]).decode())
    return "\n".join(parts)


async def count_tokens(req, runtime, router, profile: str) -> tuple[int, str]:
    plan = router.plan(profile, runtime.config.profiles[profile], runtime, req)
    names = plan.candidates or list(runtime.config.profiles[profile].providers)
    provider = runtime.providers[names[0]]
    cfg = provider.cfg
    headers = {"content-type": "application/json", **cfg.headers, **provider.auth_headers()}
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            if cfg.kind == "anthropic":
                headers["anthropic-version"] = req.headers.get("anthropic-version", "2023-06-01")
                if req.headers.get("anthropic-beta"):
                    headers["anthropic-beta"] = req.headers["anthropic-beta"]
                body = dict(req.body)
                body["model"] = await provider.resolve_model(req.model)
                async with provider.session().post(f"{cfg.base_url}/messages/count_tokens",
                                                   data=orjson.dumps(body), headers=headers) as r:
                    if r.status == 200:
                        n = orjson.loads(await r.read()).get("input_tokens")
                        if isinstance(n, int):
                            return n, f"exact:{provider.name}"
            elif provider.tokenize_supported is not False:
                text = prompt_text(req.body)
                async with provider.session().post(f"{provider.root_url}/tokenize",
                                                   data=orjson.dumps({"content": text}), headers=headers) as r:
                    if r.status == 200:
                        tokens = orjson.loads(await r.read()).get("tokens")
                        if isinstance(tokens, list):
                            provider.tokenize_supported = True
                            return len(tokens), f"tokenizer:{provider.name}"
                    if r.status in (404, 405, 501):
                        provider.tokenize_supported = False
    except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError, ValueError, KeyError):
        pass
    # Same basis as the ratio learned from real traffic: the size of the request as sent upstream.
    upstream_body, _ = request_to_openai(req.body, req.model, stream=False)
    return provider.estimate_tokens(len(orjson.dumps(upstream_body))), f"estimate:{provider.name}"
