"""Standalone fake upstream process, for supervision tests and benchmarks.

    python -m tests.fakes --kind openai|anthropic|ollama|lmstudio|gemini --port N [--behaviour ok] [--models a,b]
        [--name fake] [--load-delay S] [--start-delay S] [--start-when FILE] [--crash-after N] [--ignore-sigterm]
        [--exit-at-start CODE] [--tokenize] [--no-record]

Prints ``READY <port>`` on stdout once listening. SIGTERM/SIGINT stop it cleanly (exit 0) unless
``--ignore-sigterm``. ``POST /_fake/crash`` exits with code 1; ``POST /_fake/hang`` stops answering.

``--kind llamacpp`` also reads llama-server's own flags (``-m``, ``-np``, ``-c`` for all slots together,
``--slot-save-path``) and ignores the others, so a script named ``llama-server`` that runs this stands in for
the real one as a managed process (coderouterd adds ``--slot-save-path`` to a command named so).
"""

import argparse
import asyncio
import os
import signal
import sys
import time

KINDS = ("anthropic", "gemini", "llamacpp", "lmstudio", "ollama", "openai")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.fakes", description="fake LLM upstream server")
    p.add_argument("--kind", choices=KINDS, default="openai")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--name", default="fake")
    p.add_argument("--behaviour", default="ok")
    p.add_argument("--models", default="", help="comma-separated model ids")
    p.add_argument("--load-delay", type=float, default=0.0)
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds to wait before binding")
    # A test that must observe a request arriving before the server is up holds it here, instead of racing a
    # delay against a loaded machine: it creates FILE when it has seen what it needed to.
    p.add_argument("--start-when", default=None, metavar="FILE", help="wait until FILE exists before binding")
    p.add_argument("--crash-after", type=int, default=None, help="exit(1) after N generation requests")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--exit-at-start", type=int, default=None, metavar="CODE")
    p.add_argument("--tokenize", action="store_true", help="enable POST /tokenize (openai kind)")
    p.add_argument("--no-record", action="store_true", help="do not keep request bodies (long benchmarks)")
    # llama-server's own flags (--kind llamacpp)
    p.add_argument("-m", "--model", dest="model_path", default=None)
    p.add_argument("-np", "--parallel", dest="n_slots", type=int, default=None)
    p.add_argument("-c", "--ctx-size", dest="ctx_size", type=int, default=None)
    p.add_argument("--slot-save-path", default=None)
    args, unknown = p.parse_known_args(argv)
    if unknown and args.kind != "llamacpp":
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


async def serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from .runner import build_fake, make_runner

    models = [m for m in args.models.split(",") if m] or None
    options: dict[str, object] = {}
    if args.tokenize:
        options["tokenize"] = True
    if args.kind == "llamacpp":
        n_slots = args.n_slots or 4
        options["n_slots"] = n_slots
        if args.ctx_size:
            options["n_ctx"] = args.ctx_size // n_slots
        if args.model_path:
            options["model_path"] = args.model_path
        if args.slot_save_path:
            options["slot_save_path"] = args.slot_save_path
    fake = build_fake(args.kind, name=args.name, behaviour=args.behaviour, models=models,
                      load_delay=args.load_delay, record=not args.no_record, allow_crash=True,
                      crash_after=args.crash_after, **options)
    runner = make_runner(fake)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT,) if args.ignore_sigterm else (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    fake.state.closing = True
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.exit_at_start is not None:
        return args.exit_at_start
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.start_delay > 0:
        time.sleep(args.start_delay)
    while args.start_when and not os.path.exists(args.start_when):
        time.sleep(0.02)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
