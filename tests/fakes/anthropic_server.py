"""Fake Anthropic Messages API: ``/v1/messages`` (SSE and non-stream), ``count_tokens``, ``/v1/models``.

Option ``max_context`` (default 200000) is the M of the ``overflow`` message.

Thinking blocks are signed and checked as the real API does: a signature is an HMAC of the thinking text under a
key only this instance knows, and a request carrying a thinking block it did not sign is refused with a 400.
With manual thinking on, a last assistant turn that called a tool must open with a thinking block, and
`clear_thinking` context edits need thinking on.
"""

import base64
import hashlib
import hmac
import os
import time

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
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def event(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def block_start(index: int, block: dict) -> bytes:
    return event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def block_delta(index: int, delta: dict) -> bytes:
    return event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def block_stop(index: int) -> bytes:
    return event("content_block_stop", {"type": "content_block_stop", "index": index})


def last_tool_result(body: dict) -> str | None:
    """The text of the last tool_result block the client sent, if any."""
    for msg in reversed(body.get("messages") or ()):
        for block in reversed(msg.get("content") if isinstance(msg, dict) and isinstance(msg.get("content"), list)
                              else ()):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                c = block.get("content")
                if isinstance(c, list):
                    return "".join(p.get("text", "") for p in c if isinstance(p, dict))
                return c if isinstance(c, str) else None
    return None


def anthropic_tool_names(body: dict | None) -> list[str]:
    names = []
    for tool in (body or {}).get("tools") or ():
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return names


class AnthropicFake(FakeBase):
    kind = "anthropic"

    def configure(self) -> None:
        self.max_context = int(self.options.get("max_context", 200_000))
        self.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._frame_cache: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[bytes]] = {}
        self._signing_key = os.urandom(32)

    def sign(self, thinking: str) -> str:
        mac = hmac.new(self._signing_key, thinking.encode(), hashlib.sha256).digest()
        return base64.b64encode(mac).decode()

    def thinking_refusal(self, body: dict) -> str | None:
        """Why the real API would refuse the thinking in `body`, or None."""
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        last_assistant = None
        for i, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if not isinstance(content, list) or msg.get("role") != "assistant":
                continue
            last_assistant = (i, content)
            for j, b in enumerate(content):
                if isinstance(b, dict) and b.get("type") == "thinking":
                    sig, text = b.get("signature"), b.get("thinking")
                    if not (isinstance(sig, str) and isinstance(text, str) and hmac.compare_digest(sig, self.sign(text))):
                        return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
        thinking = body.get("thinking")
        on = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
        cm = body.get("context_management")
        edits = cm.get("edits") if isinstance(cm, dict) else None
        if not on and isinstance(edits, list) and any(
                isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking") for e in edits):
            return "context_management: the clear_thinking strategy requires thinking to be enabled"
        # Manual thinking only: in adaptive mode Claude may answer a turn without thinking, so such a turn is
        # valid history (and a local Anthropic-wire backend played by this fake never thinks on its own).
        if on and thinking.get("type") == "enabled" and last_assistant is not None:
            i, content = last_assistant
            calls = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
            first = content[0] if content and isinstance(content[0], dict) else {}
            if calls and first.get("type") not in ("thinking", "redacted_thinking"):
                return (f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                        f"`{first.get('type')}`. When `thinking` is enabled, a final `assistant` message must start "
                        "with a thinking block")
        return None

    def setup_routes(self) -> None:
        self.route("POST", "/v1/messages", self.messages, generation=True)
        self.route("POST", "/v1/messages/count_tokens", self.count_tokens)
        self.route("GET", "/v1/models", self.list_models)

    def error_response(self, call: Call, name: str | None = None) -> web.StreamResponse:
        b = call.behaviour
        name = name or b.name
        headers = {"request-id": f"req_fake{next_id():012d}"}
        if name == "503_loading":
            # llama.cpp's /v1/messages answers with its own shape while the model loads.
            return json_response({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                                 503, headers)
        if name == "overflow":
            limit = b.integer("max", self.max_context)
            tokens = b.integer("tokens", max(call.prompt_tokens, limit + 1))
            status, kind, message = 400, "invalid_request_error", f"prompt is too long: {tokens} tokens > {limit} maximum"
        elif name == "429":
            headers["retry-after"] = b.get("retry_after", "1")
            status, kind, message = 429, "rate_limit_error", "Number of request tokens has exceeded your rate limit"
        elif name == "401":
            status, kind, message = 401, "authentication_error", "invalid x-api-key"
        elif name == "404_model":
            status, kind, message = 404, "not_found_error", f"model: {call.model(self.models[0])}"
        elif name == "529":
            status, kind, message = 529, "overloaded_error", "Overloaded"
        elif name == "400":
            status, kind, message = 400, "invalid_request_error", "messages: field required"
        else:
            status, kind, message = 500, "api_error", "Internal server error"
        return json_response({"type": "error", "error": {"type": kind, "message": message},
                              "request_id": headers["request-id"]}, status, headers)

    async def list_models(self, call: Call) -> web.StreamResponse:
        data = [{"type": "model", "id": m, "display_name": m, "created_at": self.created_at} for m in self.models]
        return json_response({"data": data, "has_more": False, "first_id": self.models[0],
                              "last_id": self.models[-1]})

    async def count_tokens(self, call: Call) -> web.StreamResponse:
        return json_response({"input_tokens": call.prompt_tokens})

    async def messages(self, call: Call) -> web.StreamResponse:
        body = call.body
        if not isinstance(body, dict):
            return self.error_response(call, "400")
        refusal = self.thinking_refusal(body)
        if refusal is not None:
            return json_response({"type": "error", "error": {"type": "invalid_request_error", "message": refusal},
                                  "request_id": f"req_fake{next_id():012d}"}, 400)
        # served_model: the server names the model its own way (llama-server: the .gguf path)
        model = str(self.options.get("served_model") or call.model(self.models[0]))
        plan = make_plan(call.behaviour, self.name, anthropic_tool_names(body), split_default=3,
                         tool_result=last_tool_result(body),
                         id_prefix="toolu_fake")
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "tool":  # a forced tool is called, with its schema
            schema = next((t.get("input_schema") for t in body.get("tools") or () if isinstance(t, dict)
                           and t.get("name") == choice.get("name")), None)
            structured(plan, call.behaviour, schema, tool=str(choice.get("name")), id_prefix="toolu_fake")
        if body.get("stream"):
            return await self._stream(call, plan, model)
        return await self._complete(call, plan, model)

    def _frames(self, plan: Plan, complete: bool) -> list[bytes]:
        """Content events; when not ``complete`` the last open block is left unclosed (cut stream)."""
        frames: list[bytes] = []
        index = 0
        if plan.reasoning:
            frames.append(block_start(index, {"type": "thinking", "thinking": "", "signature": ""}))
            frames += [block_delta(index, {"type": "thinking_delta", "thinking": p}) for p in plan.reasoning]
            frames.append(block_delta(index, {"type": "signature_delta",
                                              "signature": self.sign("".join(plan.reasoning))}))
            frames.append(block_stop(index))
            index += 1
        if plan.content:
            frames.append(block_start(index, {"type": "text", "text": ""}))
            frames += [block_delta(index, {"type": "text_delta", "text": p}) for p in plan.content]
            if complete:
                frames.append(block_stop(index))
            index += 1
        for tc in plan.tool_calls:
            frames.append(block_start(index, {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}}))
            frames += [block_delta(index, {"type": "input_json_delta", "partial_json": f}) for f in tc.fragments]
            frames.append(block_stop(index))
            index += 1
        return frames

    def _cached_frames(self, call: Call, plan: Plan) -> list[bytes]:
        # Tool-use blocks carry fresh ids, and text_tools depends on the request. The rest is keyed by what the
        # frames say, not only by behaviour: an answer built from the request (echo_tool_result) must never be
        # served from another request's cache entry.
        if plan.tool_calls or call.behaviour.name == "text_tools":
            return self._frames(plan, complete=plan.fail is None)
        key = (call.behaviour.spec, tuple(plan.reasoning), tuple(plan.content))
        frames = self._frame_cache.get(key)
        if frames is None:
            if len(self._frame_cache) > 256:
                self._frame_cache.clear()
            frames = self._frame_cache[key] = self._frames(plan, complete=plan.fail is None)
        return frames

    def _message(self, call: Call, model: str, content: list, stop_reason: str | None, output: int) -> dict:
        return {"id": f"msg_fake{next_id():012d}", "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": call.prompt_tokens, "output_tokens": output,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}

    async def _stream(self, call: Call, plan: Plan, model: str) -> web.StreamResponse:
        start = event("message_start", {"type": "message_start",
                                        "message": self._message(call, model, [], None, 1)})
        frames = [start, PING, *self._cached_frames(call, plan)]
        if plan.fail == "cut" and call.behaviour.get("end", "chunked") == "close":
            return self._unframed_close(call, frames)
        resp = web.StreamResponse(status=200, headers={**SSE_HEADERS, "request-id": f"req_fake{next_id():012d}"})
        await resp.prepare(call.request)
        if plan.fail == "cut":  # a text block started and never closed, then the chunked terminator
            await write_frames(resp, frames, plan.delay)
            return resp
        if plan.fail == "disconnect":
            await write_frames(resp, frames, plan.delay)
            call.close_connection()
            return resp
        if plan.fail == "error":
            frames.append(event("error", {"type": "error",
                                          "error": {"type": "overloaded_error", "message": "Overloaded"}}))
            await write_frames(resp, frames, plan.delay)
            return resp
        frames.append(event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[plan.finish], "stop_sequence": None},
            "usage": {"output_tokens": plan.output_tokens},
        }))
        frames.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        await write_frames(resp, frames, plan.delay)
        return resp

    def _unframed_close(self, call: Call, frames: list[bytes]) -> web.StreamResponse:
        """A response with neither content-length nor chunked framing: its body ends when the connection closes,
        which the client reads as a clean end of the body (aiohttp's server always frames, so it is written raw)."""
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        transport = call.request.transport
        if transport is not None:
            transport.write(head + b"".join(frames))
        call.close_connection()  # the transport flushes what was written, then closes
        return web.Response(status=200)  # never sent: the connection is gone

    async def _complete(self, call: Call, plan: Plan, model: str) -> web.StreamResponse:
        failed = await whole_answer_failure(call, plan, lambda: self.error_response(call, "529"))
        if failed is not None:
            return failed
        content: list[dict] = []
        if plan.reasoning:
            text = "".join(plan.reasoning)
            content.append({"type": "thinking", "thinking": text, "signature": self.sign(text)})
        if plan.content:
            content.append({"type": "text", "text": plan.text})
        for tc in plan.tool_calls:
            content.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": orjson.loads(tc.arguments)})
        message = self._message(call, model, content, STOP_REASONS[plan.finish], plan.output_tokens)
        return json_response(message, headers={"request-id": f"req_fake{next_id():012d}"})
