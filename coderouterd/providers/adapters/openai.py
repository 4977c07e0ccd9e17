"""OpenAI-compatible upstreams: OpenAI itself, llama.cpp's llama-server, LM Studio, vLLM and the like."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from ...servers import overflow as context_overflow
from ..errors import OVERFLOW, UpstreamError, http_error, parse_retry_after
from ..limits import MAX_AUX_BYTES, read_capped
from .base import CountedRequest, UpstreamAdapter, error_message

if TYPE_CHECKING:
    from ..provider import Provider


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
        text = prompt_text(req.body)
        async with provider.session().post(f"{self.root_url}/tokenize", data=orjson.dumps({"content": text}),
                                           headers=self.headers(json=True)) as r:
            if r.status == 200:
                tokens = orjson.loads(await read_capped(r, MAX_AUX_BYTES, "token count")).get("tokens")
                if isinstance(tokens, list):
                    provider.tokenize_supported = True
                    return len(tokens), f"tokenizer:{provider.name}"
            if r.status in (404, 405, 501):
                provider.tokenize_supported = False
        return None
