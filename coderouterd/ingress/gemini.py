"""The Gemini API ingress (`/v1beta/models/{model}:generateContent` and friends, what Gemini CLI and google-genai
speak), under both /v1beta/ and /v1/: paths, keys, admission, the responder that writes Gemini's shapes, and the
routes that are not generation (countTokens, the model list, a clear 501 for embeddings).

Generation goes through the proxy's own path (`ProxyApp.proxy` → `_admit` → Exchange), like every ingress, so the
journal, metrics, guards, budget and affinity see it as they see the others. Everything protocol-specific is in
translate/gemini_*.py and providers/gemini_strategies.py; this module only wires it to the HTTP side."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs

import orjson

from ..ids import new_id
from ..routing.request import ClientRequest
from ..translate.gemini_request import GeminiRequest, GeminiRequestError, camel_keys, translate_request
from ..translate.openai_request_to_anthropic import openai_request_to_anthropic
from .errors import gemini_http_status, gemini_status, status_of_kind
from .model_list import model_ids
from .responder import Responder
from .validate import depth_problem
from .validate_gemini import validate_gemini

if TYPE_CHECKING:
    from ..keys.model import TeamKey
    from ..runtime import Runtime
    from .asgi import Receive, Scope, Send


class ProxyApp(Protocol):
    """What this module uses of the proxy (ingress/dispatch.py's ProxyApp, which routes the Gemini paths here)."""

    daemon: Any

    async def admit_key(self, scope: Scope, headers: dict[str, str],
                        r: Responder) -> tuple[bool, TeamKey | None]: ...

    async def _admit(self, scope: Scope, receive: Receive, send: Send, ingress: str, runtime: Runtime, *,
                     count_tokens: bool = False) -> tuple[ClientRequest, Responder, str] | None: ...

    async def proxy(self, scope: Scope, receive: Receive, send: Send, ingress: str) -> None: ...

PREFIXES = ("/v1beta/", "/v1/")
_GENERATION = ("generateContent", "streamGenerateContent")
_NOT_SERVED = ("embedContent", "batchEmbedContents", "predict", "predictLongRunning", "batchGenerateContent",
               "asyncBatchEmbedContent", "generateAnswer", "bidiGenerateContent")
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_JSON_STREAM = [(b"content-type", b"application/json; charset=UTF-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]
_EVENT_END = b"\r\n\r\n"
_DATA = b"data: "
_METHODS = ["generateContent", "streamGenerateContent", "countTokens"]


def error_body(status: int, message: str, *, reason: str | None = None, extra: dict | None = None) -> dict:
    """`{"error": {"code", "message", "status"}}`, with an ErrorInfo detail when there is a machine reason."""
    status = gemini_http_status(status)
    err: dict = {"code": status, "message": message, "status": gemini_status(status, reason)}
    if reason or extra:
        info: dict = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason or "",
                      "domain": "coderouter"}
        if extra:
            info["metadata"] = {k: v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in extra.items()}
        err["details"] = [info]
    return {"error": err}


def is_gemini_call(path: str) -> bool:
    """A Gemini API path by its shape alone: under /v1beta/, or a `models/{m}:method` call under /v1/."""
    return path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path)


def is_gemini(path: str, scope: Scope) -> bool:
    """Whether a request is the Gemini API's: anything under /v1beta/, and under /v1/ a `models/{m}:method` call,
    or a model list asked for with Google's key (the OpenAI and Anthropic lists share /v1/models)."""
    if path.startswith("/v1beta/"):
        return True
    if not (path == "/v1/models" or path.startswith("/v1/models/")):
        return False
    if path.startswith("/v1/models/") and ":" in path:
        return True
    return any(k == b"x-goog-api-key" for k, _v in scope["headers"]) or b"key=" in scope.get("query_string", b"")


def _query(scope: Scope) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


def with_query_key(scope: Scope) -> Scope:
    """`?key=` as the x-goog-api-key header it stands for, so the one key check (auth.presented_key) reads it."""
    key = (_query(scope).get("key") or [""])[0]
    if not key or any(k == b"x-goog-api-key" for k, _v in scope["headers"]):
        return scope
    # UTF-8: parse_qs decoded its %-escapes as UTF-8, and no valid key is outside ASCII (a wrong one is a 401).
    return {**scope, "headers": [*scope["headers"], (b"x-goog-api-key", key.encode("utf-8", "surrogateescape"))]}


def model_path(path: str) -> str:
    """What follows `models/` in `/v1beta/models/{model}[:{method}]` ("" for other paths). Model names may hold
    colons (`qwen3:30b`) and slashes: a POST's method is after the last colon."""
    rest = path.split("/", 2)[2]  # after /v1beta/
    return rest[len("models/"):] if rest.startswith("models/") else ""


class GeminiResponder(Responder):
    """A Responder for Gemini clients: errors in Google's shape; a stream as SSE `data:` lines (`alt=sse`) or as
    one JSON array written element by element. Strategies write SSE events; the array form is made here, so it
    holds across a fallback from one provider to the next."""

    def __init__(self, send: Send, request_id: str, *, sse: bool = True) -> None:
        super().__init__(send, "gemini", request_id)
        self.opens_stream_itself = False  # every Gemini chunk is a whole response: no opening event
        self.rq: GeminiRequest | None = None
        self.sse = sse
        self._elements = 0  # array form: elements written

    async def error(self, status: int, message: str, *, kind: str | None = None, error_type: str | None = None,
                    extra: dict | None = None, headers: Mapping[str, str] | None = None, param: str | None = None,
                    code: str | None = None) -> None:
        if self.headers_sent:
            if not self.finished:
                await self._stream_error(status, message, code)
            return
        self._add_headers(headers)
        await self.json(gemini_http_status(status), orjson.dumps(error_body(status, message, reason=code,
                                                                                   extra=extra)))

    async def start_stream(self, headers: Mapping[str, str] | None = None, opening: Any = None) -> None:
        self._add_headers(headers)
        await self._start(200, list(_SSE if self.sse else _JSON_STREAM))

    def _array(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for event in data.split(_EVENT_END):
            if not event.startswith(_DATA):
                continue
            out.append(b"[" if self._elements == 0 else b",\r\n")
            out.append(event[len(_DATA):])
            self._elements += 1
        return b"".join(out)

    async def event(self, data: bytes) -> None:
        if data and not self.sse:
            data = self._array(data)
        if data:
            await self._body(data, True)

    async def ping(self) -> None:
        # Whitespace: the SDKs' SSE readers skip blank lines (a `: comment` line breaks both google-genai and
        # @google/genai), and JSON allows it between array elements.
        await self._body(b"\n", True)

    async def stream_error(self, error_type: str, message: str, *, code: str | None = None,
                           status: int | None = None) -> None:
        await self._stream_error(status or status_of_kind(error_type), message, code)

    async def _stream_error(self, status: int, message: str, code: str | None) -> None:
        """After the stream began: the error object on its own (google-genai raises on a chunk that is one, and
        @google/genai on a read that parses as one), or as the array's last element; then the end."""
        err = orjson.dumps(error_body(status, message, reason=code))
        if self.sse:
            data = err + b"\n"
        else:
            data = (b"[" if self._elements == 0 else b",\r\n") + err + b"]"
            self._elements += 1
        await self._body(data, False)

    async def end(self) -> None:
        if self.sse:
            await self._body(b"", False)
        else:
            await self._body(b"[]" if self._elements == 0 else b"]", False)


def admit_gemini(body: Any, raw: bytes, scope: Scope, *,
                 count_tokens: bool = False) -> tuple[GeminiRequest | None, str | None, str | None]:
    """(translated request, None, None), or (None, problem, param) for a 400 naming the field."""
    path = scope["path"]
    model = model_path(path).rpartition(":")[0]
    if type(body) is dict:
        problem = depth_problem(body, raw)
        if problem:
            return None, problem, "request body"
        body = camel_keys(body, raw)
    if count_tokens and isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]  # the long form: a whole generateContent request to count
    problem = validate_gemini(body, model, count_tokens=count_tokens)
    if problem:
        return None, problem, problem.split(":")[0]
    method = path.rpartition(":")[2]
    stream = method == "streamGenerateContent"
    sse = (_query(scope).get("alt") or [""])[0] == "sse"
    try:
        rq = translate_request(body, model, stream=stream, sse=sse, raw=raw)
    except GeminiRequestError as e:
        return None, e.message, e.param
    rq.raw = raw
    return rq, None, None


async def serve(app: ProxyApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Every Gemini API path (the caller checked `is_gemini`)."""
    scope = with_query_key(scope)
    path, method = scope["path"], scope["method"]
    tail = model_path(path)
    if method == "POST" and ":" in tail:
        verb = tail.rpartition(":")[2]
        if verb in _GENERATION:
            return await app.proxy(scope, receive, send, "gemini")
        if verb == "countTokens":
            return await count_tokens(app, scope, receive, send)
    r = GeminiResponder(send, new_id("req"))
    admitted, key = await app.admit_key(scope, _headers(scope), r)
    if not admitted:
        return
    if method in ("GET", "HEAD") and path.split("/", 2)[2] == "models":
        ids = model_ids(app.daemon.runtime, key)
        return await r.json(200, orjson.dumps({"models": [_model_entry(i, src) for i, src in ids]}))
    if method in ("GET", "HEAD") and tail:
        known = dict(model_ids(app.daemon.runtime, key))
        return await r.json(200, orjson.dumps(_model_entry(tail, known.get(tail, "routes"))))
    if method == "POST" and ":" in tail and tail.rpartition(":")[2] in _NOT_SERVED:
        verb = tail.rpartition(":")[2]
        return await r.error(501, f"{verb} is not served by coderouterd: it routes generation (generateContent, "
                                  "streamGenerateContent) and counts tokens (countTokens) only")
    if method == "POST" and ":" in tail:
        return await r.error(404, f"no such method: {tail.rpartition(':')[2]!r} (coderouterd serves "
                                  f"{', '.join(_METHODS)})")
    await r.error(404 if method in ("GET", "HEAD", "POST") else 405, f"no such endpoint: {method} {path}")


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _model_entry(model: str, source: str) -> dict:
    return {"name": f"models/{model}", "version": "coderouter", "displayName": f"{model} (coderouter {source})",
            "description": "served by coderouterd: routed like any model name ([[routes]])",
            "supportedGenerationMethods": list(_METHODS)}


async def count_tokens(app: ProxyApp, scope: Scope, receive: Receive, send: Send) -> None:
    """`:countTokens`, from the same counting as Anthropic's count_tokens (ingress/tokens.py): the request as an
    Anthropic one, so a native Anthropic provider counts exactly and the others count or estimate as there."""
    runtime = app.daemon.runtime
    admitted = await app._admit(scope, receive, send, "gemini", runtime, count_tokens=True)
    if admitted is None:
        return
    req, r, profile = admitted
    from .tokens import count_tokens as count

    body = openai_request_to_anthropic(req.body, req.model)
    for key in ("max_tokens", "stream"):
        body.pop(key, None)
    counted = ClientRequest(ingress="anthropic", body=body, raw=orjson.dumps(body), headers=req.headers,
                            stream=False, model=req.model, request_id=req.request_id)
    n, source = await count(counted, runtime, app.daemon.router, profile)
    r.add_header("x-coderouter-token-count", source)
    await r.json(200, orjson.dumps({"totalTokens": n}))
