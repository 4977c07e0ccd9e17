"""Anthropic Messages upstreams: the Anthropic API, and local servers that speak its wire."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson

from ...translate.unsigned_thinking import may_carry_unsigned, without_unsigned_thinking
from ..errors import OVERFLOW, UpstreamError, http_error, parse_retry_after
from ..limits import MAX_AUX_BYTES, read_capped
from .base import ANTHROPIC_VERSION, CountedRequest, UpstreamAdapter, error_message

if TYPE_CHECKING:
    from ..provider import Provider

# The Anthropic API's two overflows: the prompt over the window, and a prompt that fits with max_tokens that do not
# (servers/overflow.py says both to clients in each wire's words).
_OVERFLOW = re.compile(r"prompt is too long:\s*(\d+)\s*tokens\s*>\s*(\d+)|input length and `max_tokens` exceed "
                       r"context limit:\s*(\d+)\s*\+\s*\d+\s*>\s*(\d+)")
# Client headers forwarded as they came (passthrough keeps the client's betas and API version).
_FORWARDED = ("anthropic-version", "anthropic-beta")


def anthropic_http_error(status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
    message, parsed = error_message(body)
    m = _OVERFLOW.search(message)
    if status == 400 and m:
        prompt, limit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return UpstreamError(OVERFLOW, status=400, message=message, overflow=(int(prompt), int(limit)))
    err_type = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        err_type = parsed["error"].get("type")
    e = http_error(status, message, retry_after=parse_retry_after(headers))
    e.error_type = err_type
    return e


class AnthropicAdapter(UpstreamAdapter):
    kind = "anthropic"
    wire = "anthropic"
    generation_path = "/messages"
    serves_claude_models = True

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"x-api-key": key} if key else {}

    def add_wire_headers(self, headers: dict[str, str], client: Mapping[str, str] | None) -> None:
        if client:
            for name in _FORWARDED:
                v = client.get(name)
                if v:
                    headers[name] = v
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)

    def classify_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
        return anthropic_http_error(status, body, headers)

    async def count_tokens(self, provider: Provider, req: CountedRequest) -> tuple[int, str] | None:
        """The Messages API counts for us (same model mapping as a real request)."""
        body = (without_unsigned_thinking(req.body) if may_carry_unsigned(req.raw) else None) or dict(req.body)
        body["model"] = await provider.resolve_model(req.model)
        async with provider.session().post(f"{self.cfg.base_url}/messages/count_tokens", data=orjson.dumps(body),
                                           headers=self.headers(client=req.headers, json=True)) as r:
            if r.status == 200:
                n = orjson.loads(await read_capped(r, MAX_AUX_BYTES, "token count")).get("input_tokens")
                if isinstance(n, int):
                    return n, f"exact:{provider.name}"
        return None

    def keeps_billing_header(self) -> bool:
        # Only the real Anthropic API reads it; a local Anthropic-compatible server gets the canonical prompt.
        host = urlsplit(self.cfg.base_url).hostname or ""
        return host == "anthropic.com" or host.endswith(".anthropic.com")
