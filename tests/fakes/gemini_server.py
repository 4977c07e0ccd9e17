"""Fake Gemini API (Google AI Studio): ``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` (``?alt=sse``: SSE ``data:`` events framed by CRLF CRLF; without it: one JSON array),
``:countTokens``, ``GET /v1beta/models`` and ``GET /v1beta/models/{model}``. The shapes are held to the public API
reference by tests/unit/test_gemini_fake_contract.py.

Options: ``api_key`` (when set, ``x-goog-api-key`` must carry it: missing is a 403 PERMISSION_DENIED, wrong a 400
API_KEY_INVALID, as Google answers), ``input_limit`` (``inputTokenLimit`` of every model, and the M of
``overflow``), ``cached_tokens`` (reported as ``cachedContentTokenCount``).

Function calls are signed as Gemini 3 signs them: the first ``functionCall`` part of a response carries a
``thoughtSignature`` (an HMAC of the call under a key only this instance knows), and a request whose model turn
holds a function call without a valid signature is refused with Google's 400 ("Function call is missing a
thought_signature in functionCall parts"). Google's documented placeholder for calls made elsewhere
(``skip_thought_signature_validator``) is accepted, as the real API does.

Behaviours (see behaviour.py): ``429`` answers RESOURCE_EXHAUSTED with a google.rpc.RetryInfo ``retryDelay`` of
``retry_after`` seconds, ``500`` INTERNAL, ``529``/``503_loading`` UNAVAILABLE, ``400`` INVALID_ARGUMENT,
``overflow`` the input-token-count 400, ``slow_stream``/``slow_first_byte``, ``disconnect_mid_stream`` (cut),
``error_mid_stream`` (an error event in the stream), ``cut_mid_block`` (the body ends without a finishReason).
"""

import base64
import hashlib
import hmac
import os

import orjson
from aiohttp import web

from .behaviour import (
    Call,
    FakeBase,
    Plan,
    dumps,
    json_response,
    make_plan,
    next_id,
    structured,
    whole_answer_failure,
    write_frames,
)

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
SKIP_SIGNATURE = "skip_thought_signature_validator"
FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}
MISSING_SIGNATURE = ("Function call is missing a thought_signature in functionCall parts. This is required for tools "
                     "to work correctly, and missing thought_signature may lead to degraded model performance. "
                     "Additional data, function call `{name}` , position {pos}. Please refer to "
                     "https://ai.google.dev/gemini-api/docs/thought-signatures for more details.")
# HTTP status -> google.rpc.Code name, as the Gemini API answers errors.
STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def gemini_error(status: int, message: str, *, details: list | None = None) -> web.Response:
    err: dict = {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}
    if details:
        err["details"] = details
    return json_response({"error": err}, status)


def function_names(body: dict) -> list[str]:
    names = []
    for tool in body.get("tools") or ():
        for decl in (tool.get("functionDeclarations") or tool.get("function_declarations") or ()) \
                if isinstance(tool, dict) else ():
            if isinstance(decl, dict) and isinstance(decl.get("name"), str):
                names.append(decl["name"])
    return names


def _parts(content: object) -> list[dict]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts or () if isinstance(p, dict)]


def last_function_response(body: dict) -> str | None:
    """The text of the last functionResponse the client sent (its `output`, else its JSON)."""
    for content in reversed(body.get("contents") or ()):
        for part in reversed(_parts(content)):
            fr = part.get("functionResponse") or part.get("function_response")
            if isinstance(fr, dict):
                response = fr.get("response")
                if isinstance(response, dict) and isinstance(response.get("output"), str):
                    return response["output"]
                return dumps(response).decode()
    return None


def _signature(part: dict) -> object:
    return part.get("thoughtSignature", part.get("thought_signature"))


def _signature_bytes(sig: str) -> bytes:
    """A signature's bytes: proto JSON writes bytes fields as base64, and readers take either alphabet
    (google-genai sends them back URL-safe)."""
    try:
        return base64.b64decode(sig.replace("-", "+").replace("_", "/") + "=" * (-len(sig) % 4), validate=True)
    except ValueError:
        return b""


class GeminiFake(FakeBase):
    kind = "gemini"

    def configure(self) -> None:
        self.input_limit = int(self.options.get("input_limit", 1_048_576))
        self.cached_tokens = int(self.options.get("cached_tokens", 0))
        self.api_key = self.options.get("api_key")
        self._signing_key = os.urandom(32)

    def setup_routes(self) -> None:
        # countTokens first: it is no generation (it must not take a scripted behaviour).
        self.route("POST", "/v1beta/models/{model}:countTokens", self.count_tokens)
        self.route("POST", "/v1beta/models/{call}", self.generate, generation=True)
        self.route("GET", "/v1beta/models", self.list_models)
        self.route("GET", "/v1beta/models/{name}", self.get_model)

    # -- signatures ----------------------------------------------------------------------------------

    def sign(self, name: str, args: object) -> str:
        mac = hmac.new(self._signing_key, name.encode() + b"\0" + orjson.dumps(args, option=orjson.OPT_SORT_KEYS),
                       hashlib.sha256).digest()
        return base64.b64encode(mac).decode()

    def signature_refusal(self, body: dict) -> str | None:
        """Why the real API would refuse the function calls in `body`'s history, or None."""
        for i, content in enumerate(body.get("contents") or ()):
            if not isinstance(content, dict) or content.get("role") != "model":
                continue
            calls = [(j, p) for j, p in enumerate(_parts(content))
                     if isinstance(p.get("functionCall") or p.get("function_call"), dict)]
            if not calls:
                continue
            j, first = calls[0]
            fc = first.get("functionCall") or first.get("function_call")
            sig = _signature(first)
            if not isinstance(sig, str) or not sig:
                return MISSING_SIGNATURE.format(name=fc.get("name"), pos=f"{i}.{j}")
            if sig != SKIP_SIGNATURE and not hmac.compare_digest(_signature_bytes(sig), _signature_bytes(
                    self.sign(str(fc.get("name")), fc.get("args") or {}))):
                return f"Thought signature is not valid. contents[{i}].parts[{j}]"
        return None

    # -- errors ---------------------------------------------------------------------------------------

    def error_response(self, call: Call, name: str | None = None) -> web.StreamResponse:
        b = call.behaviour
        name = name or b.name
        if name == "429":
            delay = b.get("retry_after", "1")
            return gemini_error(429, "You exceeded your current quota, please check your plan and billing details.",
                                details=[{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                                          "violations": [{"quotaMetric": "generativelanguage.googleapis.com/"
                                                                         "generate_content_requests"}]},
                                         {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                          "retryDelay": f"{delay}s"}])
        if name in ("529", "503_loading"):
            return gemini_error(503, "The model is overloaded. Please try again later.")
        if name == "overflow":
            limit = b.integer("max", self.input_limit)
            tokens = b.integer("tokens", max(call.prompt_tokens, limit + 1))
            return gemini_error(400, f"The input token count ({tokens}) exceeds the maximum number of tokens "
                                     f"allowed ({limit}).")
        if name == "400":
            return gemini_error(400, "Invalid JSON payload received. Unknown name \"bogus\": Cannot find field.")
        if name == "401":
            return gemini_error(403, "Method doesn't allow unregistered callers (callers without established "
                                     "identity). Please use API Key or other form of API consumer identity to call "
                                     "this API.")
        if name == "404_model":
            return gemini_error(404, f"models/{self._model(call)} is not found for API version v1beta, or is not "
                                     "supported for generateContent.")
        return gemini_error(500, "An internal error has occurred. Please retry or report in "
                                 "https://developers.generativeai.google/guide/troubleshooting")

    def _key_refusal(self, call: Call) -> web.Response | None:
        if not self.api_key:
            return None
        given = call.request.headers.get("x-goog-api-key") or call.request.query.get("key")
        if not given:
            return gemini_error(403, "Method doesn't allow unregistered callers (callers without established "
                                     "identity). Please use API Key or other form of API consumer identity to call "
                                     "this API.")
        if given != self.api_key:
            return gemini_error(400, "API key not valid. Please pass a valid API key.",
                                details=[{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                          "reason": "API_KEY_INVALID", "domain": "googleapis.com"}])
        return None

    # -- models ---------------------------------------------------------------------------------------

    def _model_entry(self, model: str) -> dict:
        return {"name": f"models/{model}", "version": "001", "displayName": model,
                "description": f"fake {model}", "inputTokenLimit": self.input_limit, "outputTokenLimit": 65536,
                "supportedGenerationMethods": ["generateContent", "countTokens"], "temperature": 1.0,
                "topP": 0.95, "topK": 64, "maxTemperature": 2.0, "thinking": True}

    @staticmethod
    def _model(call: Call) -> str:
        return call.request.match_info.get("call", "").rpartition(":")[0] or "unknown"

    async def list_models(self, call: Call) -> web.StreamResponse:
        refused = self._key_refusal(call)
        return refused or json_response({"models": [self._model_entry(m) for m in self.models]})

    async def get_model(self, call: Call) -> web.StreamResponse:
        refused = self._key_refusal(call)
        if refused:
            return refused
        name = call.request.match_info["name"]
        if name not in self.models:
            return gemini_error(404, f"models/{name} is not found for API version v1beta")
        return json_response(self._model_entry(name))

    # -- generation -----------------------------------------------------------------------------------

    async def count_tokens(self, call: Call) -> web.StreamResponse:
        """Either `contents`, or a whole `generateContentRequest` (which must name its model), never both."""
        refused = self._key_refusal(call)
        if refused:
            return refused
        body = call.body if isinstance(call.body, dict) else {}
        request = body.get("generateContentRequest")
        if ("contents" in body) == (request is not None):
            return gemini_error(400, "Exactly one of contents or generateContentRequest must be set")
        if request is not None and not (isinstance(request, dict) and str(request.get("model", "")).startswith(
                "models/") and isinstance(request.get("contents"), list)):
            return gemini_error(400, "* GenerateContentRequest.model: model is required, as models/{model}")
        # The size of what is counted (the prompt's estimate the fake bills with for the same request).
        counted = dumps(request if request is not None else body)
        return json_response({"totalTokens": max(1, len(counted) // 4)})

    async def generate(self, call: Call) -> web.StreamResponse:
        refused = self._key_refusal(call)
        if refused:
            return refused
        model, _, method = call.request.match_info["call"].rpartition(":")
        body = call.body
        if method not in ("generateContent", "streamGenerateContent"):
            return gemini_error(404, f"Method not found: {method}")
        if not isinstance(body, dict) or not isinstance(body.get("contents"), list):
            return gemini_error(400, "* GenerateContentRequest.contents: contents is not specified")
        refusal = self.signature_refusal(body)
        if refusal is not None:
            return gemini_error(400, refusal)
        gen = body.get("generationConfig") or body.get("generation_config") or {}
        plan = make_plan(call.behaviour, self.name, function_names(body), split_default=None, id_prefix="fc_",
                         tool_result=last_function_response(body))
        if gen.get("responseMimeType") == "application/json" and isinstance(gen.get("responseJsonSchema"), dict):
            structured(plan, call.behaviour, gen["responseJsonSchema"])
        thinking = gen.get("thinkingConfig") or {}
        shown = isinstance(thinking, dict) and thinking.get("includeThoughts") is True
        responses = self._responses(call, plan, model, shown)
        if method == "generateContent":
            return await self._whole(call, plan, responses)
        if call.request.query.get("alt") == "sse":
            return await self._sse(call, plan, responses)
        return await self._array(call, plan, responses)

    def _usage(self, call: Call, candidates: int, thoughts: int) -> dict:
        prompt = call.prompt_tokens
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": candidates,
                 "totalTokenCount": prompt + candidates + thoughts,
                 "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}]}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        if self.cached_tokens:
            usage["cachedContentTokenCount"] = min(self.cached_tokens, prompt)
        return usage

    def _responses(self, call: Call, plan: Plan, model: str, shown: bool) -> list[dict]:
        """The answer as the stream's responses (the whole answer is their parts together). Usage is cumulative on
        each; the last carries finishReason."""
        rid = f"fakeresp{next_id():010d}"
        pieces: list[dict] = [{"text": p, "thought": True} for p in plan.reasoning] if shown else []
        pieces += [{"text": p} for p in plan.content]
        calls = []
        for tc in plan.tool_calls:
            args = orjson.loads(tc.arguments)
            calls.append({"functionCall": {"name": tc.name, "args": args}})
        if calls:
            calls[0]["thoughtSignature"] = self.sign(calls[0]["functionCall"]["name"], calls[0]["functionCall"]["args"])
        thoughts = len(plan.reasoning)
        out: list[dict] = []
        produced = 0
        groups: list[list[dict]] = [[p] for p in pieces] + ([calls] if calls else [])
        if not groups:
            groups = [[{"text": ""}]]
        for k, parts in enumerate(groups):
            produced += sum(1 for p in parts if not p.get("thought"))
            candidate: dict = {"content": {"parts": parts, "role": "model"}, "index": 0}
            if k == len(groups) - 1 and plan.fail is None:
                candidate["finishReason"] = FINISH[plan.finish]
            out.append({"candidates": [candidate], "usageMetadata": self._usage(call, produced, thoughts),
                        "modelVersion": model, "responseId": rid})
        return out

    async def _whole(self, call: Call, plan: Plan, responses: list[dict]) -> web.StreamResponse:
        failed = await whole_answer_failure(call, plan, lambda: self.error_response(call, "529"))
        if failed is not None:
            return failed
        last = responses[-1]
        parts = [p for r in responses for p in r["candidates"][0]["content"]["parts"]]
        whole = {**last, "candidates": [{**last["candidates"][0], "content": {"parts": parts, "role": "model"}}]}
        return json_response(whole)

    async def _sse(self, call: Call, plan: Plan, responses: list[dict]) -> web.StreamResponse:
        frames = [b"data: " + dumps(r) + b"\r\n\r\n" for r in responses]
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(call.request)
        if plan.fail == "error":
            frames.append(b"data: " + dumps({"error": {"code": 503, "message": "The model is overloaded. Please try "
                                                       "again later.", "status": "UNAVAILABLE"}}) + b"\r\n\r\n")
        await write_frames(resp, frames, plan.delay)
        if plan.fail == "disconnect":
            call.close_connection()
        return resp

    async def _array(self, call: Call, plan: Plan, responses: list[dict]) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"content-type": "application/json"})
        await resp.prepare(call.request)
        frames = [(b"[" if i == 0 else b",\r\n") + dumps(r) for i, r in enumerate(responses)]
        await write_frames(resp, frames, plan.delay)
        if plan.fail == "disconnect":
            call.close_connection()
            return resp
        await resp.write(b"]")
        return resp
