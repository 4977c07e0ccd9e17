"""One provider's backend as `corectl doctor` talks to it: the daemon's own adapter (the same URLs, headers and
error reading as real traffic), JSON GETs for discovery, the probe requests in either wire and their answers
read back (`Answer`). What the answers mean is doctor_probes.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from coderouterd.providers.adapters import adapter_for, error_message
from coderouterd.servers.gemini import method_path
from coderouterd.translate.chat_request_to_gemini import chat_to_gemini
from coderouterd.translate.gemini_answer_to_chat import gemini_response_to_chat
from coderouterd.translate.reasoning import CLOSE_TAG, OPEN_TAG, split_think_tags

TOOL_NAME = "get_current_time"
TOOL_SCHEMA = {"type": "object", "required": ["timezone"],
               "properties": {"timezone": {"type": "string", "description": "IANA zone, e.g. UTC"}}}


@dataclass(frozen=True)
class Limits:
    """Seconds. Discovery is a cheap GET; generation may include a cold model load on a local server."""

    probe: float = 5.0
    generation: float = 60.0


@dataclass
class Answer:
    text: str = ""
    reasoning: str = ""
    think_tags: bool = False
    finish: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments as sent)
    seconds: float = 0.0


class ProbeFailed(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def error_text(status: int, body: bytes) -> str:
    message = error_message(body)[0]
    return f"HTTP {status}" + (f": {message}" if message else "")


def split_think(text: str) -> tuple[str, str, bool]:
    """(visible text, reasoning, had tags) for servers that leave reasoning inline as <think>...</think>,
    split the way the router splits it."""
    if OPEN_TAG not in text and CLOSE_TAG not in text:
        return text, "", False
    reasoning, visible = split_think_tags(text)
    return visible, reasoning, True


class ProbeClient:
    def __init__(self, name: str, cfg: Any, client: httpx.AsyncClient, limits: Limits) -> None:
        self.name, self.cfg, self.client, self.limits = name, cfg, client, limits
        # The daemon's own adapter: the same URLs, headers and error reading as real traffic.
        self.adapter = adapter_for(cfg)
        self.api = self.adapter.api_base
        self.root = self.adapter.root_url
        self.anthropic = self.adapter.wire == "anthropic"
        # The Gemini API: asked in the chat form's terms, translated as the daemon translates (the model is in the URL).
        self.gemini = self.adapter.wire == "gemini"
        self.backend = cfg.kind  # refined by detect_backend() when the URL hides an unknown server
        self.model = cfg.model or cfg.default_model
        self.show: dict | None = None  # Ollama /api/show, fetched once

    def headers(self) -> dict[str, str]:
        return self.adapter.headers(json=True)

    async def get_json(self, url: str) -> tuple[int, Any, bytes]:
        r = await self.client.get(url, headers=self.headers(), timeout=self.limits.probe)
        try:
            return r.status_code, orjson.loads(r.content), r.content
        except orjson.JSONDecodeError:
            return r.status_code, None, r.content

    async def optional_json(self, method: str, url: str, body: dict | None = None) -> Any:
        """A discovery endpoint that only some backends have: its JSON, or None."""
        try:
            r = await self.client.request(method, url, headers=self.headers(), timeout=self.limits.probe,
                                          content=orjson.dumps(body) if body is not None else None)
            return orjson.loads(r.content) if r.status_code == 200 else None
        except (httpx.HTTPError, orjson.JSONDecodeError):
            return None

    async def probe_get(self, path: str) -> tuple[int, Any]:
        """A GET under the server's root for the servers package: (status, JSON or None); raises on no answer."""
        r = await self.client.get(self.root + path, headers=self.headers(), timeout=self.limits.probe)
        try:
            return r.status_code, orjson.loads(r.content) if r.status_code < 400 else None
        except orjson.JSONDecodeError:
            return r.status_code, None

    def request_body(self, content: str, max_tokens: int, *, tools: bool = False,
                     stream: bool = False) -> dict:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                "messages": [{"role": "user", "content": content}]}
        if stream:
            body["stream"] = True
            if not self.anthropic:
                body["stream_options"] = {"include_usage": True}
        if tools and self.anthropic:
            body["tools"] = [{"name": TOOL_NAME, "description": "Current time in a time zone.",
                              "input_schema": TOOL_SCHEMA}]
            body["tool_choice"] = {"type": "any"}
        elif tools:
            body["tools"] = [{"type": "function", "function": {
                "name": TOOL_NAME, "description": "Current time in a time zone.", "parameters": TOOL_SCHEMA}}]
            # Ollama does not support tool_choice; everyone else gets "required" to make the test decisive.
            if self.backend != "ollama":
                body["tool_choice"] = "required"
        return body

    @property
    def generation_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.limits.generation, connect=self.limits.probe)

    @property
    def gen_url(self) -> str:
        return self.api + method_path(self.model, False) if self.gemini else self.adapter.generation_url

    @property
    def stream_url(self) -> str:
        return self.api + method_path(self.model, True) if self.gemini else self.adapter.generation_url

    def wire_body(self, body: dict) -> bytes:
        """A probe's body (Anthropic's or chat's) as the upstream's wire takes it."""
        return orjson.dumps(chat_to_gemini(body) if self.gemini else body)

    async def generate(self, body: dict) -> Answer:
        started = time.perf_counter()
        try:
            r = await self.client.post(self.gen_url, content=self.wire_body(body), headers=self.headers(),
                                       timeout=self.generation_timeout)
        except httpx.TimeoutException:
            raise ProbeFailed(f"no answer within {self.limits.generation:g}s") from None
        except httpx.HTTPError as e:
            raise ProbeFailed(f"{type(e).__name__}: {e}") from None
        if r.status_code >= 400:
            raise ProbeFailed(error_text(r.status_code, r.content), r.status_code)
        try:
            data = orjson.loads(r.content)
        except orjson.JSONDecodeError:
            raise ProbeFailed("the answer is not JSON") from None
        if self.gemini and isinstance(data, dict):
            data = gemini_response_to_chat(data, self.model)
        answer = self.parse_anthropic(data) if self.anthropic else self.parse_openai(data)
        answer.seconds = time.perf_counter() - started
        return answer

    def parse_openai(self, data: dict) -> Answer:
        choices = data.get("choices") or []
        if not choices:
            raise ProbeFailed("the answer has no choices")
        msg = choices[0].get("message") or {}
        content = msg.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text, inline, tags = split_think(content)
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or inline
        calls = [((c.get("function") or {}).get("name", ""), (c.get("function") or {}).get("arguments"))
                 for c in msg.get("tool_calls") or []]
        return Answer(text, reasoning if isinstance(reasoning, str) else "", tags,
                      choices[0].get("finish_reason"), calls)

    def parse_anthropic(self, data: dict) -> Answer:
        stop = data.get("stop_reason")
        finish = {"max_tokens": "length", "tool_use": "tool_calls", "end_turn": "stop"}.get(stop, stop) \
            if isinstance(stop, str) else stop
        a = Answer(finish=finish)
        for block in data.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                a.text += block.get("text", "")
            elif kind == "thinking":
                a.reasoning += block.get("thinking", "")
            elif kind == "tool_use":
                a.tool_calls.append((block.get("name", ""), block.get("input")))
        a.text, inline, a.think_tags = split_think(a.text)
        a.reasoning = a.reasoning or inline
        return a

    async def ollama_show(self) -> dict | None:
        if self.show is None:
            show = await self.optional_json("POST", f"{self.root}/api/show", {"model": self.model})
            self.show = show if isinstance(show, dict) else {}
        return self.show or None
