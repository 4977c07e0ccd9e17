"""Operating the daemon from corectl: providers, managed processes (start/stop/restart, logs), model control.

Each function returns the process exit status, like commands.py; the Typer definitions are in app.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from .api import DaemonAPI
from .client import DEFAULT_TIMEOUT_S, CorectlError
from .commands import echo, emit_json, with_api

if TYPE_CHECKING:
    from coderouterd.admin.apitype import ProcessNow

# The daemon waits up to this long for a model to load (models_control.LOAD_TIMEOUT_S); corectl a bit longer.
MODEL_LOAD_TIMEOUT_S = 630.0
FOLLOW_POLL_S = 0.25


def _console(stderr: bool = False):
    if stderr:
        from .render import SafeConsole

        return SafeConsole(stderr=True)
    from .render import console

    return console()


# -- providers ------------------------------------------------------------------------------------------------

def providers(socket: str | None, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        answer = api.providers()
        if as_json:
            emit_json(answer)
            return
        from .safe import clean_tree

        rows = clean_tree([p.model_dump(exclude_unset=True) for p in answer.providers])
        out = _console()
        out.print(providers_table(rows, answer.stats_window_s, out.width))
        from .render import key_problems, traffic_lines

        why = traffic_lines(rows)
        if why is not None:
            out.print(why)

        for line in key_problems(rows):
            out.print(line)

    return with_api(socket, as_json, work)


def providers_table(items: list[dict], window_s: float | None, width: int = 10_000):
    from rich.text import Text

    from .render import _breaker, _health, fit_table, latency, money, traffic_cell

    title = "Providers" + (f" (figures over the last {window_s:g} s)" if window_s else "")
    right = {"justify": "right", "no_wrap": True}
    # Everything on one line per provider; what does not fit goes, least useful first (--json has it all).
    columns = [("Provider", {"no_wrap": True, "style": "bold"}, 0), ("Kind", {"no_wrap": True}, 6),
               ("Base URL", {"no_wrap": True}, 4), ("Model", {"no_wrap": True}, 5),
               ("Traffic", {"no_wrap": True}, 0), ("Breaker", {"no_wrap": True}, 0),
               ("Health", {"no_wrap": True}, 0), ("Process", {"no_wrap": True}, 3), ("Median", right, 2),
               ("Errors", right, 1), ("Spent", right, 7)]
    rows = []
    for p in items:
        f = p.get("figures") or {}
        spend = p.get("budget") or {}
        proc = Text("-", style="dim")
        if p.get("process"):
            proc = Text(f"{p['process']} ({p.get('process_state')})",
                        style="green" if p.get("process_state") == "ready" else "yellow")
        spent = money(spend.get("spent")) if spend else "-"
        if spend.get("cap"):
            spent += f" / {money(spend['cap'])}"
        rows.append([p["name"], p["kind"] + (" $" if p.get("paid") else ""), p["base_url"],
                     p["model"] or Text("(client's)", style="dim"), traffic_cell(p), _breaker(p.get("breaker") or {}),
                     _health(p.get("health", "unknown")), proc, latency(f.get("median_s")),
                     str(f.get("errors") or 0), spent])
    return fit_table(width, columns, rows, title=title, title_justify="left", title_style="bold")


# -- managed processes ----------------------------------------------------------------------------------------

def process_action(socket: str | None, name: str, action: str, wait_s: float, as_json: bool) -> int:
    wait = 0.0 if action == "stop" else max(0.0, wait_s)

    def work(api: DaemonAPI) -> int:
        if as_json:
            data = api.process_action(name, action, wait)
        else:
            verb = {"start": "Starting", "stop": "Stopping", "restart": "Restarting"}[action]
            with _spinner(f"{verb} {name}…"):
                data = api.process_action(name, action, wait)
        snap = data.process.model_dump(exclude_unset=True) if data.process is not None else {}
        ready = data.ready
        failed = wait > 0 and ready is False
        if as_json:
            emit_json(data)
            return 1 if failed else 0
        pname = snap.get("name", name)
        if action == "stop":
            echo(f"Stopped {pname}.")
            return 0
        pid = f"pid {snap['pid']}" if snap.get("pid") else "no pid"
        past = "Started" if action == "start" else "Restarted"
        if ready:
            echo(f"{past} {pname} ({pid}); it is ready.")
            return 0
        if wait == 0:
            echo(f"{past} {pname} ({pid}); state {snap.get('state')}.")
            return 0
        reason = f": {snap['fatal_reason']}" if snap.get("fatal_reason") else ""
        sys.stderr.write(f"corectl: {pname} is not ready after {wait:g} s (state {snap.get('state')}{reason}); "
                         f"see corectl logs {pname}\n")
        return 1

    return with_api(socket, as_json, work, timeout=wait + DEFAULT_TIMEOUT_S)


def find_process(processes: Mapping[str, ProcessNow], name: str) -> dict | None:
    """A process snapshot by its own name or by a provider it serves."""
    if name in processes:
        return processes[name].model_dump(exclude_unset=True)
    for snap in processes.values():
        if name in snap.providers:
            return snap.model_dump(exclude_unset=True)
    return None


def tail_lines(path: str, n: int, block: int = 65536) -> list[str]:
    """The last n lines of a file, reading backwards in blocks (server logs grow to megabytes)."""
    if n <= 0:
        return []
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        pos = f.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-n:]


def follow_file(path: str, *, poll_s: float = FOLLOW_POLL_S,
                stop: Callable[[], bool] | None = None) -> Iterator[str]:
    """The lines appended to `path` from this call on. Survives copy-truncate rotation (the supervisor's: the size
    drops below our offset) and rename rotation (a new inode at the path)."""
    from contextlib import closing

    from coderouterd.tail import follow_lines

    fh: BinaryIO | None
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        fh, ino = None, None
    else:
        fh.seek(0, os.SEEK_END)
        ino = os.fstat(fh.fileno()).st_ino

    def decoded() -> Iterator[str]:
        with closing(follow_lines(path, fh, ino, poll_s=poll_s, stop=stop)) as lines:
            for line in lines:
                yield line.decode("utf-8", "replace")

    return decoded()


def logs(socket: str | None, name: str, n: int, follow: bool, as_json: bool) -> int:
    def work(api: DaemonAPI) -> int:
        data = api.processes()
        snap = find_process(data.processes, name)
        if snap is None:
            valid = data.names
            listed = ", ".join(valid) if valid else "none (no provider has a [process] block)"
            raise CorectlError(f"no managed process {name!r}; valid names: {listed}", code=1, payload={"valid": valid})
        api.close()  # following can last hours; the daemon need not hold our connection
        path = snap["log"]
        stream = follow_file(path) if follow else None  # position fixed before the backlog is read
        try:
            lines = tail_lines(path, n)
        except FileNotFoundError:
            if not follow:
                raise CorectlError(f"{snap['name']} has no log yet ({path} does not exist)", code=1,
                                   payload={"log": path}) from None
            lines = []
        if as_json and not follow:
            emit_json({"process": snap["name"], "log": path, "lines": lines})
            return 0
        for line in lines:
            _emit_line(line, as_json)
        if stream is not None:
            for line in stream:
                _emit_line(line, as_json)
        return 0

    return with_api(socket, as_json, work)


def _emit_line(line: str, as_json: bool) -> None:
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps({"line": line}).decode() + "\n")
    else:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- models ---------------------------------------------------------------------------------------------------

def models_list(socket: str | None, provider: str | None, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        if as_json:
            emit_json(api.models(provider))
            return
        with _spinner("Asking the backends for their models…"):
            data = api.models(provider)
        out = _console()
        from .safe import clean_tree

        out.print(models_table(clean_tree([e.model_dump(exclude_unset=True) for e in data.providers]), out.width))
        if data.resident and data.resident.processes:
            out.print()
            out.print(resident_table(clean_tree(data.resident.model_dump(exclude_unset=True)), out.width))

    return with_api(socket, as_json, work, timeout=60.0)


def models_table(entries: list[dict], width: int = 10_000):
    from rich.text import Text

    from .render import fit_table, size

    columns = [("Provider", {"no_wrap": True, "style": "bold"}, 0), ("Backend", {"no_wrap": True}, 2),
               ("Model", {"no_wrap": True}, 0), ("Loaded", {"no_wrap": True}, 0),
               ("Size / context", {"justify": "right", "no_wrap": True}, 1)]
    rows = []
    for e in entries:
        if e.get("error"):
            rows.append([e["provider"], e.get("backend") or "?", Text(f"error: {e['error']}", style="red"), "", ""])
            continue
        word = e.get("process_word")  # a managed process's word for its model: resident, stopped: starts on demand
        if not e.get("models"):
            rows.append([e["provider"], e.get("backend") or "?", Text("(no models)", style="dim"),
                         Text(word, style="dim") if word else "", ""])
        for m in e.get("models") or []:
            loaded = m.get("loaded")
            mark = Text("unknown", style="dim") if loaded is None else \
                Text(word if word else "loaded", style="green") if loaded else \
                Text(word if word else "-", style="dim")
            extra = size(m["size"]) if m.get("size") else \
                (f"ctx {m['max_context_length']:,}" if m.get("max_context_length") else "")
            if not extra and e.get("context_window") and len(e["models"]) == 1:
                extra = f"ctx {e['context_window']:,}"  # the server's one model: the window it serves
            rows.append([e["provider"], e.get("backend", "?"), m.get("id") or "?", mark, extra])
    return fit_table(width, columns, rows, title="Models", title_justify="left", title_style="bold")


def resident_table(resident: dict, width: int = 10_000):
    """Managed local models: resident or not against the memory budget, the load time learned from its starts,
    requests waiting for their turn, idle time to the stop, last stop."""
    from .render import budget_line, fit_table, idle_cell, memory_cell

    procs = resident.get("processes") or {}
    columns = [("Process", {"no_wrap": True, "style": "bold"}, 0), ("Serves", {}, 3), ("State", {"no_wrap": True}, 0),
               ("Start", {"no_wrap": True}, 4), ("Memory", {"justify": "right", "no_wrap": True}, 0),
               ("Load", {"justify": "right", "no_wrap": True}, 5), ("Waiting", {"justify": "right", "no_wrap": True}, 5),
               ("Idle stop", {"justify": "right", "no_wrap": True}, 2), ("Last stop", {"no_wrap": True}, 1)]
    rows = [[name, ", ".join(p.get("providers") or []), ("resident " if p.get("resident") else "") +
             (p.get("state") or "?"), p.get("start") or "always", memory_cell(p),
             f"{p['load_s']:.1f} s" if p.get("load_s") is not None else "-", waiting_cell(p),
             idle_cell(p), p.get("last_stop_reason") or "-"] for name, p in procs.items()]
    held = {"memory_held_mb": resident.get("memory_held_mb"), "memory_budget_mb": resident.get("memory_budget_mb"),
            "resident": [n for n, p in procs.items() if p.get("resident")]}
    return fit_table(width, columns, rows, title=budget_line(held), title_justify="left", title_style="bold")


def waiting_cell(p: dict) -> str:
    """Requests waiting for their turn at a model, and how long they may be held to save a swap (the load times
    learned, at most swap_hold_s) when the scheduler holds them."""
    n = str(p.get("waiting") or 0)
    return f"{n} (held ≤ {p['hold_s']:.1f} s)" if p.get("hold_s") is not None and p.get("waiting") else n


def model_control(socket: str | None, action: str, model: str, provider: str, as_json: bool,
                  force: bool = False) -> int:
    def work(api: DaemonAPI) -> None:
        if as_json:
            emit_json(api.model_control(action, provider, model, force=force))
            return
        data = _with_progress(f"{'Loading' if action == 'load' else 'Unloading'} {model} on {provider}",
                              lambda: api.model_control(action, provider, model, force=force))
        if data.already_loaded:
            echo(f"{model} was already loaded on {provider}.")
        elif data.already_unloaded:
            echo(f"{model} was not loaded on {provider}.")
        elif action == "load":
            took = data.load_time_seconds
            echo(f"Loaded {model} on {provider} ({data.backend})" + (f" in {took:.1f} s." if took is not None else "."))
        else:
            echo(f"Unloaded {model} from {provider} ({data.backend}).")

    return with_api(socket, as_json, work, timeout=MODEL_LOAD_TIMEOUT_S)


def _spinner(label: str):
    """A spinner on stderr while a call runs; nothing at all when stderr is not a terminal (logs, scripts)."""
    import contextlib

    err = _console(stderr=True)
    return err.status(label) if err.is_terminal else contextlib.nullcontext()


R = TypeVar("R")


def _with_progress(label: str, call: Callable[[], R]) -> R:
    """A spinner with the elapsed time while a slow call runs (on stderr, so stdout stays the answer)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = _console(stderr=True)
    if not err.is_terminal:
        return call()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        progress.add_task(label + "…", total=None)
        return call()
