"""The Gemini API (Google AI Studio): `POST {base}/v1beta/models/{model}:generateContent` and
`:streamGenerateContent?alt=sse`, the key in `x-goog-api-key`, errors as `{"error": {"code", "message", "status"}}`.

Its strategies (providers/gemini_upstream.py) carry the URL's method: the model is in the path, not the body."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote

import orjson

from ...servers import overflow as context_overflow
from ...servers.gemini import API, method_path
from ..errors import OVERFLOW, UpstreamError, http_error, parse_retry_after
from ..limits import MAX_AUX_BYTES, read_capped
from .base import CountedRequest, UpstreamAdapter, error_message

if TYPE_CHECKING:
    from ...translate.chat_request_to_gemini import CallSignatures
    from ..provider import Provider
    from ..strategy import Strategy

_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")  # google.protobuf.Duration in JSON: "22s", "1.5s"


def retry_delay(parsed: object) -> float | None:
    """The wait a Gemini error names in its google.rpc.RetryInfo detail (`retryDelay`), in seconds."""
    err = parsed.get("error") if isinstance(parsed, dict) else None
    for detail in (err.get("details") if isinstance(err, dict) else None) or ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            m = _DELAY.match(str(detail.get("retryDelay") or ""))
            if m:
                return min(float(m.group(1)), 3600.0)
    return None


def _account_refusal(parsed: object) -> int | None:
    """The status a 400 that is about this provider's account, not the request, stands for: Google answers a
    wrong API key with 400 INVALID_ARGUMENT (ErrorInfo reason API_KEY_INVALID) and an account it will not serve
    (free tier not offered in the region, billing off) with 400 FAILED_PRECONDITION. Read as the request's fault,
    the client would be told its request is wrong and no other provider tried."""
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(err, dict):
        return None
    reasons = {d.get("reason") for d in err.get("details") or () if isinstance(d, dict)}
    if "API_KEY_INVALID" in reasons:
        return 401
    if err.get("status") == "FAILED_PRECONDITION":
        return 403
    return None


def gemini_http_error(status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
    """A Gemini error answer as routing reads it. Its HTTP status mostly says the class (429 RESOURCE_EXHAUSTED:
    a rate limit, waited out; 5xx INTERNAL/UNAVAILABLE: the provider's failure; 400 INVALID_ARGUMENT: the
    request's), so the generic reading applies, with the wait taken from RetryInfo when no header gives one;
    a 400 about the account (a wrong key, a precondition) is read as the refusal of credentials it is."""
    message, parsed = error_message(body)
    if status in (400, 500):
        ov = context_overflow.parse(status, parsed if isinstance(parsed, dict) else str(parsed))
        if ov is not None:
            return UpstreamError(OVERFLOW, status=400, message=message, overflow=ov)
    if status == 400:
        status = _account_refusal(parsed) or status
    retry_after = parse_retry_after(headers)
    if retry_after is None:
        retry_after = retry_delay(parsed)
    return http_error(status, message, retry_after=retry_after)


class GeminiAdapter(UpstreamAdapter):
    kind = "gemini"
    wire = "gemini"
    model_backend = "gemini"  # servers/gemini.py: the context window from models.get
    _call_signatures: CallSignatures | None = None

    @property
    def api_base(self) -> str:
        # base_url is the API's origin; one written with the version (".../v1beta") is taken as meant.
        b = self.cfg.base_url
        for tail in (API, "/v1"):
            if b.endswith(tail):
                return b[: -len(tail)]
        return b

    @property
    def root_url(self) -> str:
        return self.api_base

    @property
    def generation_url(self) -> str:
        return f"{self.api_base}{API}/models"

    @property
    def models_url(self) -> str:
        return f"{self.api_base}{API}/models?pageSize=1000"

    @property
    def probe_url(self) -> str:
        return f"{self.api_base}{API}/models?pageSize=1"

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": key} if key else {}

    @staticmethod
    def model_ids(data: object) -> list[str]:
        """`models[].name` without its "models/" prefix (the name a request's path takes)."""
        entries = data.get("models") if isinstance(data, dict) else None
        names = [m.get("name") for m in entries or () if isinstance(m, dict)]
        return [n.removeprefix("models/") for n in names if isinstance(n, str) and n]

    def ping_request(self, model: str) -> tuple[str, dict]:
        return (self.api_base + method_path(model, False),
                {"contents": [{"role": "user", "parts": [{"text": "ping"}]}],
                 "generationConfig": {"maxOutputTokens": 1}})

    def classify_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamError:
        return gemini_http_error(status, body, headers)

    async def count_tokens(self, provider: Provider, req: CountedRequest) -> tuple[int, str] | None:
        """models.countTokens on the request as it would go up (the Anthropic form count_tokens reads, through
        the same chat translation as a real request), with the model routing resolves."""
        from ...translate.anthropic_request_to_openai import request_to_openai
        from ...translate.chat_request_to_gemini import chat_to_gemini

        model = (await provider.resolve_model(req.model)).removeprefix("models/")
        chat, _ = request_to_openai(req.body, model, stream=False)
        body = {"generateContentRequest": {"model": f"models/{model}", **chat_to_gemini(chat, model=model)}}
        url = f"{self.generation_url}/{quote(model, safe='-._')}:countTokens"
        async with provider.session().post(url, data=orjson.dumps(body), headers=self.headers(json=True)) as r:
            if r.status == 200:
                n = orjson.loads(await read_capped(r, MAX_AUX_BYTES, "token count")).get("totalTokens")
                if isinstance(n, int):
                    return n, f"exact:{provider.name}"
        return None

    def strategy_for(self, ingress: str) -> type[Strategy]:
        cls = self._strategies.get(ingress)
        if cls is None:
            from ...translate.chat_request_to_gemini import CallSignatures
            from ..gemini_upstream import gemini_upstream_strategy

            if self._call_signatures is None:
                # The thoughtSignatures this provider's calls came with, for clients of wires that drop them.
                self._call_signatures = CallSignatures()
            cls = self._strategies[ingress] = gemini_upstream_strategy(ingress, self._call_signatures)
        return cls
