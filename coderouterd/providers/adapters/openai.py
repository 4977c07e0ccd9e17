"""OpenAI-compatible upstreams: OpenAI itself, llama.cpp's llama-server, LM Studio, vLLM and the like."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from ...servers import overflow as context_overflow
from ..errors import OVERFLOW, UpstreamError, http_error, parse_retry_after
from .base import CountedRequest, UpstreamAdapter, error_message

if TYPE_CHECKING:
    from ..provider import Provider

TOKENIZE_TIMEOUT_S = 10.0  # the caller (ingress/tokens.py) bounds the whole count more tightly


def prompt_text(body: dict) -> str:
    """The text a chat template would see, near enough for counting: system, messages, tool schemas."""
    from ...translate.anthropic_request_to_openai import request_to_openai

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


def openai_http_error(status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
    message, parsed = error_message(body)
    if status in (400, 413, 422, 500):
        ov = context_overflow.parse(status, parsed if isinstance(parsed, dict) else str(parsed))
        if ov is not None:
            return UpstreamError(OVERFLOW, status=400, message=message, overflow=ov)
    return http_error(status, message, retry_after=parse_retry_after(headers))


class OpenAIAdapter(UpstreamAdapter):
    kind = "openai"
    wire = "openai"
    generation_path = "/chat/completions"
    fronts_unknown_server = True

    def classify_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
        return openai_http_error(status, body, headers)

    async def count_tokens(self, provider: Provider, req: CountedRequest) -> tuple[int, str] | None:
        """llama.cpp's /tokenize on the rendered prompt text; a backend without it is remembered as such."""
        if provider.tokenize_supported is False:
            return None
        from ..server_http import llama_server

        status, tokens = await llama_server(provider).tokenize(prompt_text(req.body), TOKENIZE_TIMEOUT_S)
        if tokens is not None:
            provider.tokenize_supported = True
            return tokens, f"tokenizer:{provider.name}"
        if status in (404, 405, 501):
            provider.tokenize_supported = False
        return None
