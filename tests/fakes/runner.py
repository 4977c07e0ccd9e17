"""Run a fake in a background thread with its own event loop, on a real loopback socket."""

import asyncio
import socket
import threading

from aiohttp import web

from .anthropic_server import AnthropicFake
from .behaviour import FakeBase
from .gemini_server import GeminiFake
from .llama_server import LlamaServerFake
from .lmstudio_server import LMStudioFake
from .ollama_server import OllamaFake
from .openai_server import OpenAIFake

KINDS: dict[str, type[FakeBase]] = {  # keep in step with __main__.KINDS
    "openai": OpenAIFake,
    "anthropic": AnthropicFake,
    "ollama": OllamaFake,
    "lmstudio": LMStudioFake,
    "llamacpp": LlamaServerFake,
    "gemini": GeminiFake,
}
# Short, so stopping a server with a client parked on a `hang` does not stall the test run.
SHUTDOWN_TIMEOUT = 0.25


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_fake(kind: str, **kwargs: object) -> FakeBase:
    try:
        cls = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown fake kind {kind!r}; expected one of {sorted(KINDS)}") from None
    return cls(**kwargs)


def make_runner(fake: FakeBase) -> web.AppRunner:
    # handler_cancellation turns a client hang-up into CancelledError inside the handler: that is how
    # disconnects during `hang` and slow streams get counted.
    return web.AppRunner(fake.app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)


class FakeServer:
    """A fake upstream on 127.0.0.1. Use as a context manager or call start()/stop()."""

    def __init__(self, kind: str = "openai", *, name: str = "fake", behaviour: str = "ok",
                 models: list[str] | None = None, port: int = 0, **options: object) -> None:
        if "crash_after" in options or "allow_crash" in options:
            # Both end the whole process with os._exit: only the standalone process (__main__) may use them.
            raise ValueError("crash_after/allow_crash are for `python -m tests.fakes`, not in-process servers")
        self.kind = kind
        self.fake = build_fake(kind, name=name, behaviour=behaviour, models=models, **options)
        self.port = port
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._used = False

    # -- recording and control (thread-safe enough: single writer, GIL-atomic reads) ---------------

    @property
    def requests(self) -> list[dict]:
        return self.fake.state.requests

    @property
    def disconnects(self) -> int:
        return self.fake.state.disconnects

    @property
    def active(self) -> int:
        return self.fake.state.active

    @property
    def saw_api_key(self) -> bool:
        return self.fake.state.saw_api_key

    @property
    def models(self) -> list[str]:
        return self.fake.models

    def count(self, path: str) -> int:
        return self.fake.state.paths[path]

    def script(self, behaviours: list[str]) -> None:
        self.fake.state.script(behaviours)

    def set_behaviour(self, behaviour: str) -> None:
        self.fake.state.set_behaviour(behaviour)

    def reset(self) -> None:
        self.fake.state.reset()

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> "FakeServer":
        if self._thread is not None:
            return self
        if self._used:
            self.fake.build_app()
        self._used = True
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start() in the caller's thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"fake-{self.kind}-{self.fake.name}", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            self._thread = None
            raise failure[0]
        return self

    async def _serve(self) -> None:
        runner = make_runner(self.fake)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        loop, thread, runner = self._loop, self._thread, self._runner
        if loop is None or thread is None:
            return
        self.fake.state.closing = True
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = self._loop = self._runner = None
        self.fake.state.closing = False

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
