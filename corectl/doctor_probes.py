"""The probes behind `corectl doctor`: one ProviderProbe per configured provider, straight from the config.

Each provider gets the same sequence: reachable, auth, model, generation, streaming, tools, thinking, context.
A check is ok | warn (shown as NEEDS TUNING) | fail | skip, with a message and a concrete suggestion.
Providers are probed concurrently; the probes of one provider run in order, because a local server
serialises generations anyway and the later checks read what the earlier ones learned (e.g. the model
is loaded by the generation probe, so its real context window is visible afterwards).

Exit codes: 0 all OK, 2 something needs tuning, 1 could not run (bad config, unknown or unreachable provider).
Talking to the backend (requests, answers read back in either wire) is doctor_client.py's `ProbeClient`.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx
import orjson

from coderouterd import servers
from coderouterd.providers.adapters import error_message
from coderouterd.servers import lmstudio, ollama

from .doctor_client import TOOL_NAME, Answer, Limits, ProbeClient, ProbeFailed, error_text

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
LABELS = {OK: "OK", WARN: "NEEDS TUNING", FAIL: "FAIL", SKIP: "skipped"}
STYLES = {OK: "green", WARN: "bold yellow", FAIL: "bold red", SKIP: "dim"}
# Claude Code's first request alone is ~20k tokens; a smaller window cannot serve a coding agent.
MIN_AGENT_CONTEXT = 16384
OLLAMA_DEFAULT_CONTEXT = ollama.DEFAULT_CONTEXT
PROMPT = "Reply with the single word: ok"
TOOL_PROMPT = "What time is it in UTC? Use the get_current_time tool."
GEN_MAX_TOKENS = 64
VISION_PROMPT = "What colour is this one-pixel image? One word."
# A valid 1x1 PNG: enough for a server to show whether it takes images at all.
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
TOOL_MAX_TOKENS = 256


class DoctorError(ValueError):
    """The doctor cannot run at all (e.g. an unknown provider name)."""


def _check(name: str, status: str, message: str, suggestion: str = "") -> dict:
    return {"name": name, "status": status, "message": message, "suggestion": suggestion}


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class ProviderProbe(ProbeClient):
    def __init__(self, name: str, cfg: Any, client: httpx.AsyncClient, limits: Limits) -> None:
        super().__init__(name, cfg, client, limits)
        self.checks: list[dict] = []
        self.answers: dict = {}  # the servers package's probe answers, by path
        self.answer: Answer | None = None
        self.stream_answer: Answer | None = None

    # -- the checks ---------------------------------------------------------------------------------------

    def key_hint(self) -> str:
        env = self.cfg.api_key_env
        if not env:
            return 'the backend wants a key: set api_key_env = "NAME" on this provider and export NAME'
        if not os.environ.get(env):
            return f"export {env} (it is not set here; for the service, put it in ~/.config/coderouter/env)"
        return f"the key in ${env} was rejected: check its value"

    async def run(self) -> dict:
        try:
            if await self.discover():
                await self.check_generation()
                await self.check_streaming()
                await self.check_tools()
                await self.check_vision()
                self.check_thinking()
                await self.check_context()
        except Exception as e:  # one broken probe must not hide the other providers' reports
            self.checks.append(_check("doctor", FAIL, f"probe crashed: {type(e).__name__}: {e}"))
        return {"provider": self.name, "kind": self.cfg.kind, "backend": self.backend,
                "base_url": self.cfg.base_url, "model": self.model, "checks": self.checks}

    def skip_rest(self, reason: str) -> None:
        done = {c["name"] for c in self.checks}
        for name in ("reachable", "auth", "model", "generation", "streaming", "tools", "vision", "thinking",
                     "context"):
            if name not in done:
                self.checks.append(_check(name, SKIP, reason))

    async def discover(self) -> bool:
        url = self.adapter.probe_url
        detect = asyncio.create_task(self.detect_backend()) if self.adapter.fronts_unknown_server else None
        started = time.perf_counter()
        try:
            status, data, raw = await self.get_json(url)
            took = f"{(time.perf_counter() - started) * 1000:.0f} ms"
        except httpx.TimeoutException:
            status, error = None, f"no answer from {url} within {self.limits.probe:g}s"
        except httpx.HTTPError as e:
            detail = f": {e}" if str(e) else ""
            status, error = None, f"cannot connect to {url}: {type(e).__name__}{detail}"
        if detect is not None:
            await detect
        if status is None:
            self.checks.append(_check("reachable", FAIL, error,
                                      "start the backend (or fix base_url), or add a process block so the "
                                      "daemon starts it"))
            self.skip_rest("provider unreachable")
            return False
        self.checks.append(_check("reachable", OK, f"{self.backend} answers at {self.cfg.base_url} ({took})"))
        if status in (401, 403):
            self.checks.append(_check("auth", FAIL, f"listing models: {error_text(status, raw)}",
                                      self.key_hint()))
            self.skip_rest("authentication failed")
            return False
        env = self.cfg.api_key_env
        if env and os.environ.get(env):
            self.checks.append(_check("auth", OK, f"key from ${env} accepted"))
        else:
            self.checks.append(_check("auth", OK, "no key needed" + (f" (${env} is not set)" if env else "")))
        if status >= 400 or not isinstance(data, dict):
            self.checks.append(_check("model", FAIL, f"listing models failed: {error_text(status, raw)}",
                                      "check that the server has finished starting and base_url is right"))
        else:
            await self.check_model(data)
        if not self.model:
            self.skip_rest("no model to probe")
            return False
        return True

    async def detect_backend(self) -> None:
        """Which server is behind an OpenAI-compatible URL (the servers package's probes, as the daemon
        asks them): decides the context probe and the suggestions."""
        try:
            found = await servers.detect(self.probe_get)
        except servers.Unreachable:
            return  # the reachability check says so
        if found.kind is not servers.GENERIC:
            self.backend, self.answers = found.kind.name, found.answers

    async def check_model(self, data: dict) -> None:
        listed = self.adapter.model_ids(data)
        wanted = self.cfg.model
        if not wanted:
            self.model = self.cfg.default_model or (listed[0] if listed else "")
            if not self.model:
                self.checks.append(_check("model", FAIL, "no model configured and the backend lists none",
                                          "load or pull a model, or set model = \"NAME\""))
                return
            self.checks.append(_check("model", OK, f"no model configured: clients' models pass through; "
                                      f"claude-* names and the probes use {self.model}"))
            return
        aliases = {wanted, f"{wanted}:latest"} if ":" not in wanted else {wanted}
        if not aliases & set(listed):
            pull = f"ollama pull {wanted}" if self.backend == "ollama" else "download or load it"
            shown = ", ".join(listed[:5]) + (" …" if len(listed) > 5 else "")
            self.checks.append(_check("model", FAIL, f"{wanted} is not among the {len(listed)} listed models",
                                      f"{pull}, or set model to one of: {shown or 'none listed'}"))
            return
        self.checks.append(_check("model", OK, f"{wanted} is listed" + await self.loaded_note()))

    async def loaded_note(self) -> str:
        if self.backend == "ollama":
            ps = await self.optional_json("GET", f"{self.root}/api/ps")
            names = {m.get("name") for m in (ps or {}).get("models") or [] if isinstance(m, dict)}
            if ps is not None:
                loaded = bool(names & {self.model, f"{self.model}:latest"})
                return "; loaded" if loaded else "; not loaded yet (the first request loads it)"
        if self.backend == "lmstudio":
            v0 = await self.optional_json("GET", f"{self.root}/api/v0/models")
            for m in (v0 or {}).get("data") or []:
                if isinstance(m, dict) and m.get("id") == self.model:
                    loaded = m.get("state") == "loaded"
                    return "; loaded" if loaded else "; not loaded (JIT loads it on demand)"
        return ""

    async def check_generation(self) -> None:
        try:
            a = self.answer = await self.generate(self.request_body(PROMPT, GEN_MAX_TOKENS))
        except ProbeFailed as e:
            self.checks.append(_check("generation", FAIL, str(e), self.http_hint(e.status)))
            return
        took = f"{a.seconds:.1f}s"
        if a.text:
            self.checks.append(_check("generation", OK, f"answered in {took}: {_short(a.text)!r}"))
        elif a.tool_calls:
            self.checks.append(_check("generation", OK, f"answered in {took} with a tool call, unasked"))
        elif a.reasoning and a.finish == "length":
            self.checks.append(_check("generation", OK, f"answered in {took}, all reasoning and no text: "
                                      "reasoning consumed the budget; raise max_tokens"))
        elif a.reasoning:
            self.checks.append(_check("generation", OK, f"answered in {took} with reasoning only"))
        else:
            self.checks.append(_check("generation", WARN, f"empty answer (finish_reason {a.finish})",
                                      "check the model's chat template; try another model"))

    def http_hint(self, status: int | None) -> str:
        if status in (401, 403):
            return self.key_hint()
        if status == 404:
            return f"check that model {self.model!r} exists on this backend"
        if status in (503, 529):
            return "the backend is busy or still loading: retry in a moment"
        return ""

    async def check_streaming(self) -> None:
        body = self.request_body(PROMPT, GEN_MAX_TOKENS, stream=True)
        pieces, done, usage = 0, False, False
        try:
            async with asyncio.timeout(self.limits.generation):
                async with self.client.stream("POST", self.stream_url, content=self.wire_body(body),
                                              headers=self.headers(), timeout=self.generation_timeout) as r:
                    if r.status_code >= 400:
                        raise ProbeFailed(error_text(r.status_code, await r.aread()), r.status_code)
                    ctype = r.headers.get("content-type", "")
                    if "text/event-stream" not in ctype:
                        raise ProbeFailed(f"asked for a stream, got {ctype or 'no content-type'}")
                    async for line in r.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        obj = orjson.loads(data)
                        if obj.get("type") == "error" or (not self.anthropic and "error" in obj):
                            raise ProbeFailed(f"error event in the stream: {error_message(data.encode())[0]}")
                        if self.anthropic:
                            pieces += obj.get("type") == "content_block_delta"
                            done = obj.get("type") == "message_stop"
                            if done:
                                break
                        elif self.gemini:  # each event a whole response; the last one says why it finished
                            usage = usage or bool(obj.get("usageMetadata"))
                            candidate = (obj.get("candidates") or [{}])[0]
                            pieces += len((candidate.get("content") or {}).get("parts") or [])
                            done = done or bool(candidate.get("finishReason"))
                        else:
                            usage = usage or bool(obj.get("usage"))
                            pieces += sum(1 for c in obj.get("choices") or [] if (c.get("delta") or {}))
        except TimeoutError:
            self.checks.append(_check("streaming", FAIL,
                                      f"stream not finished within {self.limits.generation:g}s"))
            return
        except ProbeFailed as e:
            self.checks.append(_check("streaming", FAIL, str(e), self.http_hint(e.status)))
            return
        except (httpx.HTTPError, orjson.JSONDecodeError) as e:
            self.checks.append(_check("streaming", FAIL, f"stream broke: {type(e).__name__}: {e}"))
            return
        end = "message_stop" if self.anthropic else "a finishReason" if self.gemini else "[DONE]"
        if not done:
            self.checks.append(_check("streaming", FAIL,
                                      f"{pieces} events, but the stream ended without {end}",
                                      "a proxy in between may cut streams; check the backend's log"))
            return
        note = "" if self.anthropic or usage else "; no usage chunk (stream_options.include_usage ignored)"
        self.checks.append(_check("streaming", OK, f"{pieces} events, ended with {end}{note}"))

    def tool_suggestion(self) -> str:
        fix = {
            "llama.cpp": "start llama-server with --jinja and a tool-capable chat template",
            "ollama": "use a model whose `ollama show` capabilities include tools",
            "lmstudio": "load a model trained for tool use (LM Studio shows a tool badge)",
        }.get(self.backend, "use a tool-capable model")
        return f"{fix}; or set capabilities.tools = false so tool requests go elsewhere"

    async def check_tools(self) -> None:
        if not self.cfg.capabilities.tools:
            self.checks.append(_check("tools", SKIP,
                                      "capabilities.tools = false: tool requests skip this provider"))
            return
        try:
            a = await self.generate(self.request_body(TOOL_PROMPT, TOOL_MAX_TOKENS, tools=True))
        except ProbeFailed as e:
            if e.status == 400 and "tool" in str(e).lower():
                self.checks.append(_check("tools", WARN, f"tool request refused: {e}",
                                          self.tool_suggestion()))
            else:
                self.checks.append(_check("tools", FAIL, str(e), self.http_hint(e.status)))
            return
        if a.tool_calls:
            name, args = a.tool_calls[0]
            if isinstance(args, str):
                try:
                    args = orjson.loads(args) if args.strip() else {}
                except orjson.JSONDecodeError:
                    self.checks.append(_check("tools", WARN, f"{name} called with arguments that are not "
                                              f"JSON: {_short(args)!r}", self.tool_suggestion()))
                    return
            if not isinstance(args, dict):
                self.checks.append(_check("tools", WARN, f"{name} called with non-object arguments",
                                          self.tool_suggestion()))
                return
            shown = _short(orjson.dumps(args).decode())
            self.checks.append(_check("tools", OK, f"structured tool call {name}({shown}); "
                                                   "tool-call repair not needed"))
        elif self.check_text_calls(a.text):
            return
        elif not a.text and a.reasoning and a.finish == "length":
            self.checks.append(_check("tools", SKIP, "inconclusive: reasoning consumed the budget before any "
                                      f"tool call ({TOOL_MAX_TOKENS} tokens); raise max_tokens to test it"))
        else:
            show = await self.ollama_show() if self.backend == "ollama" else None
            caps = show.get("capabilities") if show else None
            caps = f" (capabilities: {', '.join(map(str, caps))})" if isinstance(caps, list) else ""
            self.checks.append(_check("tools", WARN, "answered with plain text instead of a tool call"
                                      f"{caps}: {_short(a.text)!r}", self.tool_suggestion()))

    async def check_vision(self) -> None:
        """Send a 1x1 PNG and say which `capabilities.vision` to set: images reach a provider unless it is
        declared false, where they become a text note; a text-only server refuses them with an error."""
        declared = self.cfg.capabilities.vision
        body = self.request_body(VISION_PROMPT, GEN_MAX_TOKENS)
        if self.anthropic:
            body["messages"][0]["content"] = [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1X1}},
                {"type": "text", "text": VISION_PROMPT}]
        else:
            body["messages"][0]["content"] = [
                {"type": "text", "text": VISION_PROMPT},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1X1}"}}]
        try:
            await self.generate(body)
        except ProbeFailed as e:
            if e.status is not None and 400 <= e.status < 500 and e.status not in (401, 403, 404, 429):
                if declared is False:
                    self.checks.append(_check("vision", OK, "refuses images; capabilities.vision = false: images "
                                              "are replaced by a short note"))
                else:
                    self.checks.append(_check("vision", WARN, f"refuses images: {e}",
                                              "set capabilities.vision = false: images are then replaced by a "
                                              "short note instead of failing the request"))
            else:
                self.checks.append(_check("vision", SKIP, f"inconclusive: {e}", self.http_hint(e.status)))
            return
        if declared is False:
            self.checks.append(_check("vision", WARN, "accepts images, but capabilities.vision = false replaces "
                                      "them by a note", "set capabilities.vision = true (or remove the key)"))
        elif declared is None:
            self.checks.append(_check("vision", OK, "accepts images (a 1x1 PNG)",
                                      "set capabilities.vision = true to record it"))
        else:
            self.checks.append(_check("vision", OK, "accepts images (a 1x1 PNG)"))

    def check_text_calls(self, text: str) -> bool:
        """A tool call written as text: say in which format, and whether the daemon's repair will fix it."""
        from coderouterd.translate.tool_repair import ToolSpec, calls_in_text

        calls = calls_in_text(text, {TOOL_NAME: ToolSpec(TOOL_NAME)})
        if not calls:
            return False
        fmt, mode = calls[0].format, self.cfg.tool_repair
        on = mode == "on" or (mode == "auto" and self.cfg.is_local())
        if on:
            self.checks.append(_check("tools", OK, f"writes tool calls as text ({fmt} format); tool-call repair "
                                      f"is needed and on (tool_repair = {mode!r})"))
        else:
            why = "off" if mode == "off" else "auto, and this provider is not local"
            self.checks.append(_check("tools", WARN, f"writes tool calls as text ({fmt} format) and tool-call "
                                      f"repair is {why}: clients will see markup, not calls",
                                      f'set tool_repair = "on" for this provider, or {self.tool_suggestion()}'))
        return True

    def check_thinking(self) -> None:
        a = self.answer
        if a is None:
            self.checks.append(_check("thinking", SKIP, "no answer to inspect"))
            return
        declared = self.cfg.capabilities.thinking
        fix = "set capabilities.thinking = true" if not declared else ""
        if a.think_tags:
            hint = "llama-server --reasoning-format deepseek sends it apart"
            hint = hint if self.backend == "llama.cpp" else ""
            self.checks.append(_check("thinking", OK, "reasoning arrives inline as <think> tags; the router "
                                      "separates it", "; ".join(s for s in (hint, fix) if s)))
        elif a.reasoning and not a.text and a.finish == "length":
            note = f"reasoning consumed the budget ({GEN_MAX_TOKENS} tokens); raise max_tokens"
            self.checks.append(_check("thinking", OK, f"thinking model, the answer was all reasoning: {note}",
                                      fix))
        elif a.reasoning:
            self.checks.append(_check("thinking", OK,
                                      "thinking model: reasoning arrives separately from the text", fix))
        else:
            self.checks.append(_check("thinking", OK, "no reasoning in the answer (not a thinking model, "
                                      "or thinking is off)"))

    # -- context window ---------------------------------------------------------------------------------

    async def check_context(self) -> None:
        real, source, trained = await self.real_context()
        configured = self.cfg.context_window
        if real is None:
            msg = source or "the backend does not report its context window"
            extra = f"; configured context_window = {configured} is trusted" if configured else ""
            self.checks.append(_check("context", SKIP, msg + extra))
            return
        raise_it = {
            "ollama": f"PARAMETER num_ctx {max(32768, configured)} in a Modelfile or "
                      f"OLLAMA_CONTEXT_LENGTH={max(32768, configured)} in the Ollama server's environment",
            "lmstudio": f"lms load {self.model} --context-length {max(32768, configured)}",
            "llama.cpp": f"start llama-server with -c {max(32768, configured)} (split across --parallel)",
        }.get(self.backend, "raise the backend's context size")
        where = f"{real} tokens ({source})"
        if self.backend == "ollama" and real <= OLLAMA_DEFAULT_CONTEXT:
            supports = f"; the model supports {trained}" if trained and trained > real else ""
            self.checks.append(_check("context", WARN, f"Ollama serves {self.model} with {where}: its silent "
                                      f"{OLLAMA_DEFAULT_CONTEXT}-token default is too small for coding agents"
                                      f"{supports}", raise_it))
        elif configured and configured > real:
            self.checks.append(_check("context", WARN, f"real window {where} is smaller than the configured"
                                      f" context_window = {configured}: larger requests fail, not move on",
                                      f"{raise_it}; or set context_window = {real}"))
        elif real < MIN_AGENT_CONTEXT:
            self.checks.append(_check("context", WARN, f"real window {where} is too small for coding agents "
                                      f"(Claude Code sends ~20k-token prompts)", raise_it))
        elif not configured:
            self.checks.append(_check("context", OK, f"real window {where}; context_window is not set",
                                      f"set context_window = {real} so larger requests skip this provider"))
        else:
            self.checks.append(_check("context", OK, f"real window {where}, configured {configured}"))

    async def real_context(self) -> tuple[int | None, str, int | None]:
        if self.backend == "ollama":
            show, ps = await asyncio.gather(self.ollama_show(),
                                            self.optional_json("GET", f"{self.root}/api/ps"))
            w = ollama.window_from(show, ps, self.model)
        elif self.backend == "lmstudio":
            w = lmstudio.window_from(await self.optional_json("GET", f"{self.root}/api/v1/models"), None, self.model)
            if not w.firm:  # not loaded: what it supports is not what it serves
                return None, w.source, None
        else:
            kind = servers.by_name(self.backend)
            if kind is servers.GENERIC:
                return None, "", None
            try:
                w = await kind.window(self.probe_get, self.model, self.answers)
            except httpx.HTTPError:
                return None, "", None
        return w.tokens, w.source, w.trained

