"""What each provider's server says about itself, asked once: its kind, the context one request may use, and
its slots. Read by the context gate (routing) and prefix affinity (slots), so both ask the server once.

Discovery runs in the background, never in a request's way: `context_window` answers from what is known (0
until something is) and starts a discovery when one is due. Prefix affinity awaits it (`discover`), because
placing a request on a slot needs the slot count. Once per provider and base_url; a server that did not
answer at all is asked again a minute later, one that answered is not asked again until its base_url changes.
What the servers say, and how to ask, is in coderouterd/servers/."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from .. import servers
from ..servers import llamacpp
from ..tasks import TaskSet
from .limits import MAX_AUX_BYTES, BodyTooLarge, read_capped
from .server_http import getter, poster

if TYPE_CHECKING:
    from .provider import Provider

log = logging.getLogger("coderouterd.servers")

RETRY_S = 60.0
LOADING_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class ServerInfo:
    kind: str                 # servers' kind name: llama.cpp, ollama, lmstudio, vllm, openai
    context_window: int       # per request (per slot), as the server reports it; 0 = unknown
    window_source: str = ""
    slots: int = 0            # llama-server slots with the slot API on; 0 = no slots to choose
    # llama-server's /props answer, read once per server start and kept for kvcache/ (its slot files' key):
    # asking again after every start read it twice (issue 43). Not shown (as_dict): it names the model's path.
    props: dict | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "context_window": self.context_window or None,
                "context_source": self.window_source or None, "slots": self.slots or None}


def discoverable(provider: Provider) -> bool:
    """Only servers that hide behind an OpenAI-compatible URL, or say their kind (Ollama), are asked; the
    Anthropic API has nothing to tell."""
    a = provider.adapter
    return a.fronts_unknown_server or a.model_backend is not None


class _Unanswered(Exception):
    """Nothing useful answered; asked again `retry_s` later (soon for a server still loading its model)."""

    def __init__(self, message: str, retry_s: float = RETRY_S) -> None:
        super().__init__(message)
        self.retry_s = retry_s


async def probe(provider: Provider, timeout_s: float) -> ServerInfo:
    """Ask the provider's server. Raises _Unanswered when nothing answered."""
    import aiohttp

    headers = provider.adapter.headers()
    root = provider.root_url
    get = getter(provider)

    async def post(path: str, body: dict, _timeout: float) -> object:
        async with provider.session().post(root + path, data=orjson.dumps(body),
                                           headers={"content-type": "application/json", **headers}) as r:
            if r.status >= 300:
                raise _Unanswered(f"HTTP {r.status}")
            try:
                return orjson.loads(await read_capped(r, MAX_AUX_BYTES, f"{path} answer"))
            except BodyTooLarge as e:
                raise _Unanswered(str(e)) from None

    try:
        async with asyncio.timeout(timeout_s):
            if provider.adapter.model_backend:
                kind, answers = servers.by_name(provider.adapter.model_backend), {}
            else:
                found = await servers.detect(get)
                kind, answers = found.kind, found.answers
                if any(status == 503 for status, _ in answers.values()):
                    # Still loading its model (llama-server answers every path 503 "Loading model" until then):
                    # what it is and what it holds are asked again, not settled on a half-started server.
                    raise _Unanswered("server still loading (503)", retry_s=LOADING_RETRY_S)
            props = None
            server = llamacpp.LlamaServer(get, poster(provider))
            if kind is llamacpp.KIND:
                if llamacpp.PROPS not in answers:  # its kind was configured, not recognised: asked here, once
                    props = await server.props()
                    answers[llamacpp.PROPS] = (200, props) if props is not None else (0, None)
                else:
                    status, got = answers[llamacpp.PROPS]
                    props = got if status == 200 and isinstance(got, dict) else None
            slots = kind.slots(answers)
            if slots:
                # /slots answering confirms llama-server's slot API is on (an OpenAI-compatible server that
                # merely has a /props is left to choose for itself).
                slots = slots if await server.slots_on() else 0
            try:
                w = await kind.window(get, provider.cfg.model or provider.cfg.default_model, answers, post)
            except (aiohttp.ClientError, OSError, _Unanswered, orjson.JSONDecodeError):
                w = servers.Window(None)
    except servers.Unreachable as e:
        raise _Unanswered(str(e)) from None
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise _Unanswered(f"{type(e).__name__}: {e}") from None
    window = w.tokens if w.firm and w.tokens else 0
    return ServerInfo(kind.name, window, w.source if window else "", slots, props)


class ServerDirectory:
    def __init__(self, *, timeout_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._known: dict[str, tuple[str, float, ServerInfo | None]] = {}  # name -> (base_url, retry_at, info)
        self._running: dict[str, asyncio.Task] = {}
        self._tasks = TaskSet()

    def info(self, provider: Provider) -> ServerInfo | None:
        known = self._known.get(provider.name)
        return known[2] if known is not None and known[0] == provider.cfg.base_url else None

    def _due(self, provider: Provider) -> bool:
        known = self._known.get(provider.name)
        return known is None or known[0] != provider.cfg.base_url or (known[2] is None and self.clock() >= known[1])

    def context_window(self, provider: Provider) -> int:
        """The window to route by: the configured one when set, else the server's (0 = unknown). Never waits:
        an unknown server is asked in the background."""
        if provider.cfg.context_window:
            return provider.cfg.context_window
        info = self.info(provider)
        if info is None:
            self.refresh(provider)
            return 0
        return info.context_window

    def named_tool_choice(self, provider: Provider) -> bool:
        """Whether the provider's server reads OpenAI's named tool choice (unknown servers are assumed to)."""
        info = self.info(provider)
        if info is None:
            return True
        from ..servers import by_name

        return by_name(info.kind).named_tool_choice

    def refresh(self, provider: Provider) -> asyncio.Task | None:
        """Start a discovery for `provider` when one is due and none runs; the running one otherwise."""
        if not discoverable(provider):
            return None
        running = self._running.get(provider.name)
        if running is not None and not running.done():
            return running
        if not self._due(provider):
            return None
        task = self._tasks.spawn(self._discover(provider), name=f"discover-{provider.name}")
        self._running[provider.name] = task
        return task

    async def discover(self, provider: Provider) -> ServerInfo | None:
        """What the server said, waiting for a discovery when one is due (prefix affinity's slot table)."""
        task = self.refresh(provider)
        if task is not None:
            await asyncio.shield(task)
        return self.info(provider)

    async def _discover(self, provider: Provider) -> None:
        base_url = provider.cfg.base_url
        try:
            info = await probe(provider, self.timeout_s)
        except _Unanswered as e:
            log.debug("%s: server did not answer discovery (%s); asking again in %.0fs", provider.name, e, e.retry_s)
            self._known[provider.name] = (base_url, self.clock() + e.retry_s, None)
            return
        finally:
            self._running.pop(provider.name, None)
        self._known[provider.name] = (base_url, float("inf"), info)
        if info.context_window:
            log.info("%s: %s server, context window %d tokens (%s)", provider.name, info.kind,
                     info.context_window, info.window_source)

    def forget(self, name: str) -> None:
        """The server behind `name` started afresh (it may have other slots, another context): ask it again
        the next time anyone needs to know."""
        self._known.pop(name, None)

    def start(self, providers: Iterable[Provider]) -> None:
        """Ask every provider's server now (at start and after a reload), so the first requests are gated."""
        for p in providers:
            self.refresh(p)

    async def stop(self) -> None:
        """Shutdown: discoveries still under way are cancelled and awaited before the pools they use close."""
        await self._tasks.close()
