"""Scenario selection, request recording and the wire-neutral answer plan shared by every fake.

A behaviour spec is ``name[;key=value;...]``. It is chosen per request, first match wins:

1. the ``x-fake-behaviour`` request header (never consumes the script);
2. the script queue (``POST /_fake/script`` / ``script([...])``), consumed only by generation endpoints
   (chat, messages, Ollama chat/generate), so discovery and health probes don't eat scripted failures;
3. the server default. On non-generation endpoints the default applies only when it describes a server
   that is broken as a whole (``GLOBAL_BEHAVIOURS``): a server that 500s on chat still lists its models.
"""

import asyncio
import itertools
import os
import re
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache

import orjson
from aiohttp import web

from .misbehave import MISBEHAVIOURS, misbehave

BEHAVIOURS = frozenset({
    "ok", "500", "503_loading", "429", "401", "404_model", "400", "overflow", "529",
    "slow_first_byte", "slow_stream", "disconnect_mid_stream", "hang", "tools", "reasoning",
    "text_only_for_tools", "all_reasoning", "error_mid_stream", "chunks", "echo_tool_result",
    "text_tools", "empty", "loop", "long", "oom", "cut_mid_block",
}) | MISBEHAVIOURS  # wire-neutral hostile answers, served by misbehave.py
ERROR_BEHAVIOURS = frozenset({"500", "503_loading", "429", "401", "404_model", "400", "overflow", "529", "oom"})
GLOBAL_BEHAVIOURS = frozenset({"503_loading", "hang", "401", "redirect", "endless_error"})
NUMERIC_PARAMS = frozenset({"delay", "chunk_delay", "linger", "retry_after", "n_prompt", "n_ctx", "tokens", "max", "split",
                            "parallel", "n", "after", "think_tags", "text", "reason", "mb", "status", "size",
                            "usage_each"})
# `usage_each=1` (OpenAI fake, streams): every chunk carries the usage so far, as vLLM's continuous_usage_stats.
# `tool`/`cmd`: call that tool with {"cmd": cmd} (a shell tool such as Codex's exec_command).
# `end` (cut_mid_block): how the body ends, "chunked" (the chunked terminator) or "close" (no framing: the
# connection closes, which is a clean end of an unframed HTTP/1.1 body).
# `to`, `ctype`, `hex`: misbehave.py's redirect target, and the raw answer's content type and bytes.
# `args` (tools): the call's arguments instead, a JSON object written without ";" or "=" (Gemini CLI's read_file:
# {"file_path":"notes.txt"}).
TEXT_PARAMS = frozenset({"field", "tool", "cmd", "args", "format", "end", "to", "ctype", "hex"})

# Fixed tool-call arguments: quotes, a backslash escape, non-ASCII and a multi-byte symbol, so that any
# fragment boundary falls inside an escape or a character somewhere and reassembly can be checked byte-exact.
TOOL_ARGUMENTS = '{"command":"echo \\"héllo\\" && ls -la /tmp","description":"List ✓"}'
TOOL_ARGUMENTS_2 = '{"file_path":"/tmp/a b\\\\c.txt","note":"tab\\there — 日本"}'
REASONING_TEXT = "The user wants a greeting. I will answer briefly."
THINKING_SIGNATURE = "ZmFrZS1zaWduYXR1cmUtZm9yLXRoaW5raW5n"
DEFAULT_MODELS = ("fake-model",)
# text_tools: tool calls written as text, the way local models without a tool-call parser answer.
TEXT_TOOL_COMMAND = "echo repaired-ok"
TEXT_TOOL_FORMATS = {
    "hermes": 'I\'ll run it.\n\n<tool_call>\n{{"name": "{name}", "arguments": {{"command": "{cmd}"}}}}\n</tool_call>',
    "qwen_xml": "<tool_call>\n<function={name}>\n<parameter=command>\n{cmd}\n</parameter>\n</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS][{{"name": "{name}", "arguments": {{"command": "{cmd}"}}}}]',
    "quoted": 'A call looks like this:\n```\n<tool_call>\n{{"name": "{name}", "arguments": {{"command": "{cmd}"}}}}\n'
              '</tool_call>\n```\nNothing was run.',
}

JSON_HEADERS = {"content-type": "application/json"}
# An image part in any wire: OpenAI image_url, Anthropic image blocks, Ollama's images list.
_IMAGE = re.compile(rb'"type"\s*:\s*"image(_url)?"|"images"\s*:\s*\[\s*"')
_ids = itertools.count(1)
SELF_CLOSED = web.RequestKey("fake_self_closed", bool)


def next_id() -> int:
    return next(_ids)


def dumps(obj: object) -> bytes:
    return orjson.dumps(obj)


def json_response(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    hdrs = JSON_HEADERS if headers is None else {**JSON_HEADERS, **headers}
    return web.Response(body=orjson.dumps(obj), status=status, headers=hdrs)


def estimate_tokens(raw: bytes) -> int:
    """Deterministic stand-in for a tokenizer: about four bytes per token."""
    return max(1, len(raw) // 4)


def split_text(text: str, size: int | None) -> list[str]:
    if not size or size <= 0 or size >= len(text):
        return [text]
    return [text[i:i + size] for i in range(0, len(text), size)]


def words(text: str) -> list[str]:
    """Split into word pieces that keep their leading space, like a tokenizer's stream."""
    parts = text.split(" ")
    return [parts[0]] + [" " + p for p in parts[1:]]


@dataclass(frozen=True, slots=True)
class Behaviour:
    name: str
    params: dict[str, str]
    spec: str

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.params.get(key, default)

    def number(self, key: str, default: float) -> float:
        value = self.params.get(key)
        return default if value is None else float(value)

    def integer(self, key: str, default: int) -> int:
        value = self.params.get(key)
        return default if value is None else int(value)

    def flag(self, key: str) -> bool:
        return float(self.params.get(key, "0")) != 0


@lru_cache(maxsize=512)
def parse_behaviour(spec: str) -> Behaviour:
    """Parse ``name;k=v;...``; raises ValueError for an unknown name or a malformed parameter."""
    name, *rest = [part.strip() for part in spec.split(";")]
    if name not in BEHAVIOURS:
        raise ValueError(f"unknown fake behaviour {name!r}")
    params: dict[str, str] = {}
    for item in rest:
        if not item:
            continue
        key, sep, value = (p.strip() for p in item.partition("="))
        if not sep:
            raise ValueError(f"behaviour parameter {item!r} is not key=value")
        # Reject typos here: a bad parameter would otherwise surface as a confusing 500 from the fake.
        if key in NUMERIC_PARAMS:
            float(value)
        elif key not in TEXT_PARAMS:
            raise ValueError(f"unknown behaviour parameter {key!r}")
        params[key] = value
    return Behaviour(name, params, spec)


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    fragments: list[str]


@dataclass(slots=True)
class Plan:
    """What to answer, independent of the wire format each fake renders it into."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish: str = "stop"  # OpenAI vocabulary: stop | length | tool_calls
    fail: str | None = None  # None | "disconnect" | "error" | "cut" (a clean end mid-block; Anthropic fake only)
    delay: float = 0.0  # seconds between streamed pieces
    linger: float = 0.0  # seconds the HTTP body stays open after the stream's last event (param `linger`)
    reasoning_field: str | None = None  # OpenAI delta field override (behaviour param `field`)

    @property
    def output_tokens(self) -> int:
        return max(1, len(self.reasoning) + len(self.content) + sum(len(c.fragments) for c in self.tool_calls))

    @property
    def text(self) -> str:
        return "".join(self.content)


def make_plan(b: Behaviour, server_name: str, tool_names: list[str], *, split_default: int | None,
              id_prefix: str, tool_result: str | None = None) -> Plan:
    """Build the answer for a successful (non-error) behaviour.

    ``split_default`` is the server's natural tool-argument fragment size (None: whole arguments in one
    piece, as Ollama does); ``id_prefix`` is the tool-call id style (``call_`` / ``toolu_``).
    """
    name = b.name
    greeting = f"Hello from {server_name}"
    plan = Plan(delay=b.number("delay", 0.05) if name == "slow_stream" else b.number("chunk_delay", 0.0))
    plan.reasoning_field = b.get("field")
    plan.linger = b.number("linger", 0.0)
    if "n" in b.params or name == "chunks":
        plan.content = [f"tok{i} " for i in range(b.integer("n", 20))]
        if "size" in b.params:  # deltas of `size` characters each: a big answer in few events
            plan.content = [piece.ljust(b.integer("size", 0), "x") for piece in plan.content]
    else:
        plan.content = words(greeting)
    if name == "tools":
        split = b.integer("split", split_default) if ("split" in b.params or split_default) else None
        names = [b.get("tool")] if b.get("tool") else (tool_names or ["Bash", "Read"])
        args = [dumps({"cmd": b.get("cmd")}).decode()] if b.get("cmd") else [TOOL_ARGUMENTS, TOOL_ARGUMENTS_2]
        if b.get("args"):
            args = [b.get("args") or "{}"]
        count = max(1, b.integer("parallel", 1))
        for i in range(count):
            arguments = args[i % len(args)]
            call_name = names[i] if i < len(names) else names[0]
            plan.tool_calls.append(ToolCall(f"{id_prefix}{next_id():08d}", call_name, arguments,
                                            split_text(arguments, split)))
        if not b.flag("text"):
            plan.content = []
        if b.flag("reason"):  # a thinking model: reasoning before the calls
            plan.reasoning = words(REASONING_TEXT)
        plan.finish = "tool_calls"
    elif name == "echo_tool_result":
        # The answer quotes the last tool result the client sent back: proof the tool loop closed.
        plan.content = words(f"Tool said: {(tool_result or 'nothing').strip()}")
    elif name == "text_tools":
        if tool_result is not None:
            plan.content = words(f"The tool said: {tool_result.strip()}")
        elif tool_names:
            fmt = TEXT_TOOL_FORMATS[b.get("format", "hermes")]
            call_name = "Bash" if "Bash" in tool_names else tool_names[0]
            plan.content = split_text(fmt.format(name=call_name, cmd=TEXT_TOOL_COMMAND), b.integer("split", 4))
    elif name == "empty":  # a degraded local model: a well-formed answer with nothing in it
        plan.content = []
    elif name == "loop":  # ... or one that repeats the same lines until it is cut off
        plan.content = ["I will check the file again.\n"] * 40
        plan.finish = "length"
    elif name == "long":  # a healthy, substantial answer (a baseline for length collapse)
        plan.content = words(f"{greeting}. " + "This answer explains the change step by step. " * 12)
    elif name == "text_only_for_tools":
        plan.content = words(f"{greeting}: no tool is needed for this.")
    elif name in ("reasoning", "all_reasoning"):
        plan.reasoning = words(REASONING_TEXT)
        if name == "all_reasoning":
            plan.content = []
            plan.finish = "length"
        if b.flag("think_tags"):
            plan.content = ["<think>", *plan.reasoning, "</think>", "\n\n", *plan.content]
            plan.reasoning = []
    elif name == "disconnect_mid_stream":
        plan.fail = "disconnect"
    elif name == "error_mid_stream":
        plan.fail = "error"
    elif name == "cut_mid_block":
        plan.fail = "cut"
    if plan.fail:
        plan.content = plan.content[:max(0, b.integer("after", 2))]
    return plan


def schema_instance(schema: object, depth: int = 0) -> object:
    """The smallest value a JSON Schema accepts, roughly as a grammar-constrained server would write it: the first
    enum value, required properties only, one item where items are required. Enough for a client that parses the
    answer (Gemini CLI's routing classifier); not a validator."""
    if not isinstance(schema, dict) or depth > 50:  # hostile schemas (the fuzz tests) stay cheap
        return {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_instance(schema[key][0], depth + 1)
    t = schema.get("type")
    t = t[0] if isinstance(t, list) and t else t
    if t == "object" or (t is None and isinstance(schema.get("properties"), dict)):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else list(props)
        return {k: schema_instance(props.get(k), depth + 1) for k in required if isinstance(k, str)}
    if t == "array":
        n = schema.get("minItems")
        return [schema_instance(schema.get("items"), depth + 1)] * (min(n, 3) if type(n) is int and n > 1 else 1)
    if t in ("integer", "number"):
        low = schema.get("minimum")
        return low if isinstance(low, (int, float)) else 1
    if t == "boolean":
        return True
    if t == "null":
        return None
    return "fake"


def structured(plan: Plan, b: Behaviour, schema: object, *, tool: str | None = None, id_prefix: str = "") -> None:
    """An answer asked for by schema (a plain `ok` answer only): the schema's smallest instance as the text, or
    as the call of the forced `tool`."""
    if b.name != "ok":
        return
    value = dumps(schema_instance(schema)).decode()
    if tool is None:
        plan.content = [value]
        return
    plan.content = []
    plan.tool_calls = [ToolCall(f"{id_prefix}{next_id():08d}", tool, value, split_text(value, 3))]
    plan.finish = "tool_calls"


class FakeState:
    """Everything a fake records, plus the behaviour selection. Mutated only on the server's loop thread,
    read from test threads (plain attribute reads/appends are atomic under the GIL)."""

    def __init__(self, default: str, record: bool) -> None:
        self.initial = default
        self.default = parse_behaviour(default)
        self.record = record
        self.queue: deque[Behaviour] = deque()
        self.requests: list[dict] = []
        self.paths: Counter[str] = Counter()
        self.disconnects = 0
        self.active = 0
        self.generations = 0
        self.hung = False
        self.closing = False
        self.saw_api_key = False
        self.endless_sent = 0  # bytes of endless bodies (misbehave.py) written: how much a reader took in

    def script(self, specs: list[str]) -> None:
        parsed = [parse_behaviour(s) for s in specs]
        self.queue.extend(parsed)

    def set_behaviour(self, spec: str) -> None:
        self.default = parse_behaviour(spec)

    def reset(self) -> None:
        self.default = parse_behaviour(self.initial)
        self.queue.clear()
        self.requests.clear()
        self.paths.clear()
        self.disconnects = 0
        self.generations = 0
        self.hung = False
        self.saw_api_key = False
        self.endless_sent = 0

    def choose(self, header: str | None, generation: bool) -> Behaviour:
        if header:
            return parse_behaviour(header)
        if generation:
            if self.queue:
                return self.queue.popleft()
            return self.default
        if self.default.name in GLOBAL_BEHAVIOURS:
            return self.default
        return OK

    def stats(self) -> dict:
        return {"requests": len(self.requests), "paths": dict(self.paths), "disconnects": self.disconnects,
                "active": self.active, "generations": self.generations, "queued": len(self.queue),
                "default": self.default.spec, "hung": self.hung, "saw_api_key": self.saw_api_key}


OK = parse_behaviour("ok")


@dataclass(slots=True)
class Call:
    """One request as the handlers see it."""

    request: web.Request
    raw: bytes
    body: dict | None
    behaviour: Behaviour
    state: "FakeState | None" = None

    @property
    def prompt_tokens(self) -> int:
        return estimate_tokens(self.raw)

    def model(self, fallback: str) -> str:
        body = self.body
        if isinstance(body, dict):
            model = body.get("model")
            if isinstance(model, str) and model:
                return model
        return fallback

    def close_connection(self) -> None:
        """Close the TCP connection mid-body: bytes already written are flushed, no terminator follows."""
        self.request[SELF_CLOSED] = True
        transport = self.request.transport
        if transport is not None:
            transport.close()


Handler = Callable[[Call], Awaitable[web.StreamResponse]]
ErrorRenderer = Callable[[Call], web.StreamResponse]


async def whole_answer_failure(call: Call, plan: Plan,
                               overloaded: Callable[[], web.StreamResponse]) -> web.StreamResponse | None:
    """A non-streamed answer's failure on demand: the connection closed without an answer, or the fake's own
    overloaded error; a slow answer waits here. None: answer normally."""
    if plan.fail in ("disconnect", "cut"):
        call.close_connection()
        return web.Response(status=200)
    if plan.fail == "error":
        return overloaded()
    if plan.delay > 0:
        await asyncio.sleep(plan.delay * plan.output_tokens)
    return None


async def write_frames(resp: web.StreamResponse, frames: list[bytes], delay: float) -> None:
    # Without a delay everything goes out in one write: the fastest path for benchmarks, and parsers
    # must cope with many events per read anyway.
    if delay <= 0:
        await resp.write(b"".join(frames))
        return
    for i, frame in enumerate(frames):
        if i:
            await asyncio.sleep(delay)
        await resp.write(frame)


class FakeBase:
    """An aiohttp app whose routes are wrapped with recording, behaviour choice and disconnect counting."""

    kind = "base"

    def __init__(self, *, name: str = "fake", behaviour: str = "ok", models: list[str] | None = None,
                 load_delay: float = 0.0, record: bool = True, allow_crash: bool = False,
                 crash_after: int | None = None, **options: object) -> None:
        self.name = name
        self.models = list(models or DEFAULT_MODELS)
        self.load_delay = float(load_delay)
        self.options = options
        self.state = FakeState(behaviour, record)
        self.allow_crash = allow_crash
        self.crash_after = crash_after
        self.configure()
        self.build_app()

    def build_app(self) -> web.Application:
        """A fresh app over the same state: an aiohttp app is bound to one loop, a restart needs a new one."""
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self._add_control_routes()
        self.setup_routes()
        return self.app

    def configure(self) -> None:
        """Read options into attributes; called once, before the first build_app()."""

    def setup_routes(self) -> None:
        raise TypeError("FakeBase is abstract; use a concrete fake")

    def error_response(self, call: Call) -> web.StreamResponse:
        raise TypeError("FakeBase is abstract; use a concrete fake")

    def route(self, method: str, path: str, handler: Handler, *, generation: bool = False,
              errors: ErrorRenderer | None = None) -> None:
        state = self.state
        render_error = errors or self.error_response

        async def wrapped(request: web.Request) -> web.StreamResponse:
            raw = await request.read() if request.body_exists else b""
            body = None
            if raw:
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    body = None
            headers = request.headers
            if state.record:
                state.requests.append({"method": request.method, "path": request.path,
                                       "query": request.query_string,
                                       "headers": {k.lower(): v for k, v in headers.items()}, "json": body,
                                       "prompt_tokens": estimate_tokens(raw)})  # what its usage reports
            state.paths[request.path] += 1
            if "x-api-key" in headers:
                state.saw_api_key = True
            try:
                behaviour = state.choose(headers.get("x-fake-behaviour"), generation)
            except ValueError as exc:
                return web.Response(status=400, text=f"fake: {exc}")
            if generation and self.options.get("vision") is False and _IMAGE.search(raw):
                # What a text-only model server says to an image (llama-server without its mmproj, say).
                return json_response({"error": {"message": "image input is not supported by this model",
                                                "type": "invalid_request_error"}}, 400)
            call = Call(request, raw, body, behaviour, state)
            state.active += 1
            try:
                if state.hung or behaviour.name == "hang":
                    await asyncio.get_running_loop().create_future()
                if behaviour.name == "slow_first_byte":
                    await asyncio.sleep(behaviour.number("delay", 1.0))
                if behaviour.name in ERROR_BEHAVIOURS:
                    resp = render_error(call)
                elif behaviour.name in MISBEHAVIOURS:
                    resp = await misbehave(call)
                else:
                    resp = await handler(call)
                if generation:
                    state.generations += 1
                    if self.crash_after is not None and state.generations >= self.crash_after:
                        await resp.prepare(request)
                        await resp.write_eof()
                        os._exit(1)
                return resp
            except (asyncio.CancelledError, ConnectionResetError):
                if not state.closing and not request.get(SELF_CLOSED):
                    state.disconnects += 1
                raise
            finally:
                state.active -= 1

        self.app.router.add_route(method, path, wrapped)

    def _add_control_routes(self) -> None:
        state = self.state
        router = self.app.router

        async def script(request: web.Request) -> web.Response:
            try:
                data = orjson.loads(await request.read())
                state.script(list(data["behaviours"]))
            except (ValueError, KeyError, TypeError) as exc:
                return web.Response(status=400, text=f"fake: {exc}")
            return json_response({"queued": len(state.queue)})

        async def behaviour(request: web.Request) -> web.Response:
            try:
                state.set_behaviour(orjson.loads(await request.read())["behaviour"])
            except (ValueError, KeyError, TypeError) as exc:
                return web.Response(status=400, text=f"fake: {exc}")
            return json_response({"default": state.default.spec})

        async def reset(request: web.Request) -> web.Response:
            state.reset()
            return json_response({"reset": True})

        async def stats(request: web.Request) -> web.Response:
            return json_response(state.stats())

        async def requests(request: web.Request) -> web.Response:
            return json_response(state.requests)

        async def hang(request: web.Request) -> web.Response:
            state.hung = True
            return json_response({"hung": True})

        async def crash(request: web.Request) -> web.Response:
            resp = json_response({"crashing": True})
            await resp.prepare(request)
            await resp.write_eof()
            os._exit(1)

        router.add_post("/_fake/script", script)
        router.add_post("/_fake/behaviour", behaviour)
        router.add_post("/_fake/reset", reset)
        router.add_get("/_fake/stats", stats)
        router.add_get("/_fake/requests", requests)
        router.add_post("/_fake/hang", hang)
        if self.allow_crash:
            router.add_post("/_fake/crash", crash)
