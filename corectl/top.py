"""`corectl top`: a live view of the daemon, refreshed about once a second. q or Ctrl-C quits.

Figures come from two admin calls per refresh over one kept-alive connection: /v1/status (providers' rolling
figures, breakers, health, effective orders, spend) and /v1/requests (recent decision traces, from which the
request rate and time to first byte are computed, since the rolling stats keep no TTFB)."""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from .api import DaemonAPI
from .client import CorectlError
from .commands import emit_json, report_error
from .history import route_text

RATE_WINDOW_S = 10.0
RECENT_SHOWN = 12
TRACES_FETCHED = 200


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def compute(status: dict, traces: list[dict], now: float, *, rate_window_s: float = RATE_WINDOW_S) -> dict:
    """What the view shows, as data (also the --json output). Traces are newest first."""
    from .render import health_word

    window = status.get("stats_window_s") or 60.0
    recent = [t for t in traces if t.get("ts") is not None and now - t["ts"] <= rate_window_s]
    in_window = [t for t in traces if t.get("ts") is not None and now - t["ts"] <= window]
    providers = []
    for p in status["providers"]:
        name = p["name"]
        f = p.get("figures") or {}
        mine = [t for t in in_window if t.get("served_by") == name]
        ttfbs = [t["ttfb_ms"] for t in mine if t.get("ttfb_ms") is not None]
        providers.append({
            "name": name, "breaker": (p.get("breaker") or {}).get("state", "closed"),
            "retry_in_s": (p.get("breaker") or {}).get("retry_in_s"), "health": health_word(p),
            "requests_per_s": sum(1 for t in recent if t.get("served_by") == name) / rate_window_s,
            "p50_latency_ms": f["median_s"] * 1000 if f.get("median_s") is not None else None,
            "p50_ttfb_ms": _median(ttfbs), "errors": f.get("errors") or 0,
            "samples": (f.get("samples") or 0) - (f.get("probes") or 0),
            "cache": p.get("cache"),
            "tool_repair": p.get("tool_repair"), "drift": p.get("drift"),
        })
    budget = status.get("budget") or {}
    return {
        "at": now, "version": status.get("version"), "uptime_s": status.get("uptime_s"),
        "active_profile": status.get("active_profile"), "stats_window_s": window, "rate_window_s": rate_window_s,
        "requests_per_s": len(recent) / rate_window_s,
        "providers": providers,
        "profiles": [{"name": p["name"], "active": p.get("active", False), "mode": p.get("mode"),
                      "effective_order": p.get("effective_order") or [],
                      "skips": [s["provider"] for s in p.get("skips") or []]} for p in status.get("profiles", [])],
        "recent": [{"request_id": t.get("request_id"), "ts": t.get("ts"), "profile": t.get("profile"),
                    "served_by": t.get("served_by"), "status": t.get("status"), "latency_ms": t.get("latency_ms"),
                    "ttfb_ms": t.get("ttfb_ms"), "route": _route(t)} for t in traces[:RECENT_SHOWN]],
        "spend": budget.get("global"), "month": budget.get("month"),
        "processes": {n: {"state": s.get("state"), "pid": s.get("pid"), "restarts_total": s.get("restarts_total")}
                      for n, s in (status.get("processes") or {}).items()},
        "store": status.get("store"), "memory": status.get("memory"),
    }


def _route(trace: dict) -> str:
    steps = [{"provider": s["provider"], "outcome": "skipped", "reason": s.get("reason")}
             for s in trace.get("skips") or []]
    return route_text(steps + list(trace.get("attempts") or []))


def view(data: dict, error: str | None = None, *, width: int = 10_000, height: int | None = None):
    """The frame: everything that fits `width` columns, and, with a `height`, as many recent requests as the
    rows left over allow (an 80x24 terminal keeps every pane; the request list is what shrinks)."""
    from rich.console import Group
    from rich.text import Text

    from .render import (
        _BREAKER_STYLE,
        _health,
        cache_hit,
        drift_cell,
        duration,
        fit_table,
        latency,
        memory_line,
        money,
        repair_cell,
        spend_line,
    )
    from .safe import clean, clean_tree

    data = clean_tree(data)  # request ids, routes and names: a client's text, never a terminal's
    error = clean(error) if error else error

    def ms(v):
        return latency(v / 1000.0) if v is not None else "-"

    # Small terminals get borderless tables: four lines fewer per table.
    compact = {} if height is None or height >= 40 else {"box": _simple_box(), "show_edge": False}
    head = Text.assemble(("coderouterd ", "bold"), (str(data.get("version") or "?"), "bold cyan"),
                         f"  up {duration(data.get('uptime_s') or 0)}  profile ",
                         (str(data.get("active_profile")), "bold"),
                         f"  {data['requests_per_s']:.2f} req/s", ("  (q or Ctrl-C quits)", "dim"))
    parts: list = [head]
    spend = spend_line({"global": data["spend"], "month": data.get("month")}) if data.get("spend") else None
    if spend is not None:
        parts.append(Text("spend this month: ").append_text(spend))
    memory = memory_line(data.get("memory"))
    if memory is not None:
        parts.append(Text("memory: ").append_text(memory))
    store = data.get("store") or {}
    if store and not store.get("healthy", True):
        parts.append(Text(f"WARNING: persistence is failing: {store.get('problem')}", style="bold red"))
    if error:
        parts.append(Text(error, style="bold red"))

    right = {"justify": "right", "no_wrap": True}
    columns = [("Provider", {"no_wrap": True, "style": "bold"}, 0), ("Breaker", {"no_wrap": True}, 0),
               ("Health", {"no_wrap": True}, 0), ("Req/s", right, 4), ("p50 latency", right, 0),
               ("p50 TTFB", right, 3), ("Reqs", right, 1), ("Errors", right, 2),
               ("Cache hit", right, 5), ("Repaired", right, 6), ("Drift", {"no_wrap": True}, 7)]
    rows, interest = [], []
    for p in data["providers"]:
        breaker = p["breaker"].replace("_", "-")
        if p["breaker"] == "open" and p.get("retry_in_s") is not None:
            breaker += f" ({p['retry_in_s']:.0f}s)"
        rows.append([Text(p["name"], style="bold"), Text(breaker, style=_BREAKER_STYLE.get(p["breaker"], "")),
                     _health(p["health"]), f"{p['requests_per_s']:.2f}", ms(p["p50_latency_ms"]),
                     ms(p["p50_ttfb_ms"]), str(p["samples"]), Text(str(p["errors"]), style="red" if p["errors"] else ""),
                     cache_hit(p.get("cache")), repair_cell(p.get("tool_repair")), drift_cell(p.get("drift"))])
        troubled = p["breaker"] != "closed" or str(p["health"]).upper() not in ("HEALTHY", "UNKNOWN") or bool(p["errors"])
        interest.append((not troubled, -p["requests_per_s"], -p["samples"]))

    def providers_table(keep: int):
        shown = _fold(rows, interest, keep, len(columns))
        hint = "; all: corectl providers" if len(shown) < len(rows) else ""
        return fit_table(width, columns, shown, title=f"Providers (latency over {data['stats_window_s']:g} s{hint})",
                         title_justify="left", title_style="bold", **compact)

    orders, order_interest = [], []
    for p in data["profiles"]:
        order = Text(" > ".join(p["effective_order"]) or "none available",
                     style="" if p["effective_order"] else "bold red")
        if p["skips"]:
            order.append(f"  skipped: {', '.join(p['skips'])}", style="yellow")
        orders.append([Text("●", style="green") if p["active"] else "", p["name"], p.get("mode") or "", order])
        order_interest.append((not p["active"], not p["skips"] and bool(p["effective_order"])))
    order_columns = [("", {"no_wrap": True}, 0), ("Profile", {"no_wrap": True, "style": "bold"}, 0),
                     ("Mode", {"no_wrap": True}, 1), ("Order", {}, 0)]

    def orders_table(keep: int):
        shown = _fold(orders, order_interest, keep, len(order_columns))
        hint = " (all: corectl profile list)" if len(shown) < len(orders) else ""
        return fit_table(width, order_columns, shown, title=f"Effective order{hint}", title_justify="left",
                         title_style="bold", **compact)

    after: list = []
    if data.get("processes"):
        pr = Text("processes: ", style="bold")
        for name, s in data["processes"].items():
            style = "green" if s["state"] == "ready" else "bold red" if s["state"] == "fatal" else "yellow"
            pr.append(f"{name} ")
            pr.append(s["state"] or "?", style=style)
            pr.append(f" (pid {s['pid'] or '-'}, {s.get('restarts_total') or 0} restarts)  ")
        after.append(pr)

    def recent_table(keep: int):
        cells = []
        for q in data["recent"][:keep]:
            status = q.get("status") or 0
            cells.append([time.strftime("%H:%M:%S", time.localtime(q["ts"])) if q.get("ts") else "-",
                          q.get("request_id") or "", q.get("profile") or "",
                          Text(str(status), style="red" if status >= 400 or not status else "green"),
                          ms(q.get("latency_ms")), ms(q.get("ttfb_ms")), q.get("route") or ""])
        if not data["recent"]:
            cells.append(["", Text("no requests yet", style="dim"), "", "", "", "", ""])
        return fit_table(width, [("Time", {"no_wrap": True}, 0), ("Request", {"no_wrap": True}, 0),
                                 ("Profile", {"no_wrap": True}, 3), ("Status", right, 0),
                                 ("Latency", right, 2), ("TTFB", right, 1), ("Route", {}, 4)], cells,
                         title="Recent requests", title_justify="left", title_style="bold", **compact)

    keep_p, keep_o = len(rows), len(orders)
    if height is not None:
        # Many providers or profiles must not push the panes below them off the screen: fold the tables (the
        # troubled and busy rows stay, the rest become one "+N more" line) until the frame leaves room for a
        # few recent requests and the footer.
        fixed = _lines(parts + after + [recent_table(min(3, len(data["recent"])))], width) + 1
        p_lines = _lines([providers_table(keep_p)], width)
        o_lines = _lines([orders_table(keep_o)], width)
        while fixed + p_lines + o_lines > height and (keep_p > 1 or keep_o > 1):
            if keep_p >= keep_o and keep_p > 1:
                keep_p -= 1
                p_lines = _lines([providers_table(keep_p)], width)
            else:
                keep_o -= 1
                o_lines = _lines([orders_table(keep_o)], width)
    parts.append(providers_table(keep_p))
    parts.append(orders_table(keep_o))
    parts.extend(after)

    footer = Text(f"updated {time.strftime('%H:%M:%S', time.localtime(data['at']))}; spend "
                  f"{money((data.get('spend') or {}).get('spent'))}", style="dim")
    if height is not None:
        # A routed request's row can take two lines (its route wraps): start from one line a row and drop rows
        # until the table fits what the panes above left.
        room = height - _lines(parts, width) - 1 - (3 if compact else 5)
        keep = max(0, min(room, len(data["recent"])))
        table = recent_table(keep)
        while keep > 0 and _lines([table], width) > height - _lines(parts, width) - 1:
            keep -= 1
            table = recent_table(keep)
        if keep or room >= 1:
            parts.append(table)
    else:
        parts.append(recent_table(len(data["recent"])))
    parts.append(footer)
    return Group(*parts)


def _fold(rows: list[list], interest: list[tuple], keep: int, ncols: int) -> list[list]:
    """`rows` cut to `keep` lines: the most interesting (lowest `interest`) rows, in their own order, and a last
    line saying how many are not shown (short: it sits in a column that never wraps)."""
    from rich.text import Text

    if keep >= len(rows):
        return rows
    keep = max(1, keep) - 1  # the summary line takes one
    chosen = sorted(sorted(range(len(rows)), key=lambda i: interest[i])[:keep])
    more = Text(f"+{len(rows) - keep} more", style="dim")
    return [rows[i] for i in chosen] + [[more] + [""] * (ncols - 1)]


def _simple_box():
    from rich import box

    return box.SIMPLE_HEAD


def _lines(parts: list, width: int) -> int:
    """How many terminal lines these renderables take at `width`."""
    from .render import SafeConsole

    c = SafeConsole(width=min(width, 1000), color_system=None)  # measures as the live console prints
    return sum(len(c.render_lines(p, c.options, pad=False)) for p in parts)


def fetch(api: DaemonAPI) -> dict:
    try:
        status = api.status()
    except CorectlError:
        # An idle kept-alive connection may have been closed by the server (long --interval): reconnect once.
        api.close()
        status = api.status()
    traces = api.requests(TRACES_FETCHED).requests
    return compute(dict(status), [t.model_dump(exclude_unset=True) for t in traces], time.time())


class _Keys:
    """Single key presses from a terminal stdin (cbreak: no line buffering, no echo; Ctrl-C still signals).
    The terminal is restored on exit whatever happens."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        self._saved: list | None = None  # the terminal's attributes, restored on exit

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None and self.fd is not None:  # saved only from a terminal's fd
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def wait_for_quit(self, timeout: float) -> bool:
        """Sleep up to `timeout`; True as soon as q is pressed."""
        if self.fd is None:
            time.sleep(timeout)
            return False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                data = os.read(self.fd, 64)
                if not data or b"q" in data.lower():
                    return True


def _terminate(_signum, _frame) -> None:
    raise KeyboardInterrupt


def top(socket: str | None, interval: float, as_json: bool) -> int:
    interval = max(0.2, interval)
    client = DaemonAPI(socket, timeout=5.0)
    try:
        data = fetch(client)
    except CorectlError as e:
        client.close()
        report_error(str(e), as_json, e.payload)
        return e.code
    if as_json:
        client.close()
        emit_json(data)
        return 0
    from rich.live import Live

    from .render import SafeConsole

    console = SafeConsole()
    if not console.is_terminal:
        client.close()
        console.print(view(data, width=console.width))  # piped: one frame, like `top -n 1`
        return 0
    previous = signal.signal(signal.SIGTERM, _terminate)  # so a kill also restores the terminal
    try:
        def frame(error: str | None = None):
            return view(data, error, width=console.size.width, height=console.size.height)

        with _Keys() as keys, Live(frame(), console=console, screen=True, auto_refresh=False,
                                   transient=True) as live:
            live.refresh()
            while not keys.wait_for_quit(interval):
                error = None
                try:
                    data = fetch(client)
                except CorectlError as e:
                    client.close()  # reconnect next time: the daemon may be restarting
                    error = f"{e} (retrying)"
                live.update(frame(error), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        client.close()
    return 0
