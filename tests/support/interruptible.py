"""`python -m tests.support.interruptible --port N [--log FILE] [--grace S] [--children K]`: a server that takes
SIGTERM the way llama-server does. The first SIGTERM starts a graceful shutdown that takes `--grace` seconds, then
exits 0; a second one during it is "Received second interrupt": exit 1 at once, without finishing (llama-server
sometimes aborts there instead). Answers 200 to every GET (its ready_url) and an OpenAI chat completion to every
POST. `--children K` starts K helpers in its own process group that behave the same (a server's worker processes).
Each process appends `<pid> <role> up` once it counts signals, `<pid> <role> sigterm <n>` to `--log` for every SIGTERM it receives, and `<pid> <role> exit
<code>` when it exits, so a test reads how many signals each one got without a timing window.

SIGTERM is taken by a thread in sigwaitinfo, one delivery at a time, not by a Python-level handler (which runs
once for several deliveries that arrive before the main thread checks for them)."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time


def note(log: str | None, line: str) -> None:
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {line}\n")


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._send(b'{"status":"ok","data":[{"id":"m","object":"model"}]}')

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(json.dumps({
            "id": "c1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode())

    def log_message(self, *args: object) -> None:
        pass


def take_sigterms(log: str | None, role: str, grace: float) -> None:
    """Runs in a thread; SIGTERM is blocked everywhere, so each delivery is taken here exactly once."""
    got = 0
    while True:
        signal.sigwaitinfo({signal.SIGTERM})
        got += 1
        note(log, f"{role} sigterm {got}")
        if got == 1:
            threading.Thread(target=finish, args=(log, role, grace), daemon=True).start()
        else:
            print("Received second interrupt, terminating immediately.", flush=True)
            note(log, f"{role} exit 1")
            os._exit(1)


def finish(log: str | None, role: str, grace: float) -> None:
    time.sleep(grace)  # the graceful shutdown's own work (llama-server: freeing the model, slots)
    note(log, f"{role} exit 0")
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--log", default=None)
    p.add_argument("--grace", type=float, default=0.5)
    p.add_argument("--children", type=int, default=0)
    p.add_argument("--role", default="server")
    args = p.parse_args()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before any thread: every thread inherits it
    threading.Thread(target=take_sigterms, args=(args.log, args.role, args.grace), daemon=True).start()
    note(args.log, f"{args.role} up")  # from here on, every SIGTERM is counted
    for i in range(args.children):
        cmd = [sys.executable, "-m", "tests.support.interruptible", "--grace", str(args.grace), "--role", f"worker{i}"]
        if args.log:
            cmd += ["--log", args.log]
        subprocess.Popen(cmd)  # same group: a group signal reaches it too
    if args.port:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
        print(f"READY {args.port}", flush=True)
        server.serve_forever()
    else:
        threading.Event().wait()


if __name__ == "__main__":
    main()
