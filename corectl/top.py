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

from .client import AdminClient, CorectlError, resolve_socket
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
            "retry_in_s": (p.get("breaker") or {}).get("retry_in_s"), "health": p.get("health", "unknown"),
            "requests_per_s": sum(1 for t in recent if t.get("served_by") == name) / rate_window_s,
            "p50_latency_ms": f["median_s"] * 1000 if f.get("median_s") is not None else None,
            "p50_ttfb_ms": _median(ttfbs), "errors": f.get("errors") or 0,
            "samples": (f.get("samples") or 0) - (f.get("probes") or 0),
            "cache": p.get("cache"),
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
        "store": status.get("store"),
    }


def _route(trace: dict) -> str:
    steps = [{"provider": s["provider"], "outcome": "skipped", "reason": s.get("reason")}
             for s in trace.get("skips") or []]
    return route_text(steps + list(trace.get("attempts") or []))


def view(data: dict, error: str | None = None):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from .render import _BREAKER_STYLE, _health, cache_hit, duration, latency, money, spend_line

    def ms(v):
        return latency(v / 1000.0) if v is not None else "-"

    head = Text.assemble(("coderouterd ", "bold"), (str(data.get("version") or "?"), "bold cyan"),
                         f"  up {duration(data.get('uptime_s') or 0)}  profile ",
                         (str(data.get("active_profile")), "bold"),
                         f"  {data['requests_per_s']:.2f} req/s", ("  (q or Ctrl-C quits)", "dim"))
    parts: list = [head]
    spend = spend_line({"global": data["spend"], "month": data.get("month")}) if data.get("spend") else None
    if spend is not None:
        parts.append(Text("spend this month: ").append_text(spend))
    store = data.get("store") or {}
    if store and not store.get("healthy", True):
        parts.append(Text(f"WARNING: persistence is failing: {store.get('problem')}", style="bold red"))
    if error:
        parts.append(Text(error, style="bold red"))

    t = Table(title=f"Providers (latency over {data['stats_window_s']:g} s, rate over {data['rate_window_s']:g} s)",
              title_justify="left", title_style="bold", expand=False)
    for col in ("Provider", "Breaker", "Health", "Req/s", "p50 latency", "p50 TTFB", "Reqs", "Errors", "Cache hit"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("Provider", "Breaker", "Health") else "right")
    for p in data["providers"]:
        breaker = p["breaker"].replace("_", "-")
        if p["breaker"] == "open" and p.get("retry_in_s") is not None:
            breaker += f" ({p['retry_in_s']:.0f}s)"
        t.add_row(Text(p["name"], style="bold"), Text(breaker, style=_BREAKER_STYLE.get(p["breaker"], "")),
                  _health(p["health"]), f"{p['requests_per_s']:.2f}", ms(p["p50_latency_ms"]), ms(p["p50_ttfb_ms"]),
                  str(p["samples"]), Text(str(p["errors"]), style="red" if p["errors"] else ""),
                  cache_hit(p.get("cache")))
    parts.append(t)

    o = Table(title="Effective order", title_justify="left", title_style="bold")
    o.add_column("", no_wrap=True)
    o.add_column("Profile", style="bold", no_wrap=True)
    o.add_column("Mode", no_wrap=True)
    o.add_column("Order", overflow="fold")
    for p in data["profiles"]:
        order = Text(" > ".join(p["effective_order"]) or "none available",
                     style="" if p["effective_order"] else "bold red")
        if p["skips"]:
            order.append(f"  skipped: {', '.join(p['skips'])}", style="yellow")
        o.add_row(Text("●", style="green") if p["active"] else "", p["name"], p.get("mode") or "", order)
    parts.append(o)

    if data.get("processes"):
        pr = Text("processes: ", style="bold")
        for name, s in data["processes"].items():
            style = "green" if s["state"] == "ready" else "bold red" if s["state"] == "fatal" else "yellow"
            pr.append(f"{name} ")
            pr.append(s["state"] or "?", style=style)
            pr.append(f" (pid {s['pid'] or '-'}, {s.get('restarts_total') or 0} restarts)  ")
        parts.append(pr)

    r = Table(title="Recent requests", title_justify="left", title_style="bold")
    for col in ("Time", "Request", "Profile", "Status", "Latency", "TTFB", "Route"):
        r.add_column(col, no_wrap=col != "Route", overflow="fold",
                     justify="right" if col in ("Status", "Latency", "TTFB") else "left")
    for q in data["recent"]:
        status = q.get("status") or 0
        r.add_row(time.strftime("%H:%M:%S", time.localtime(q["ts"])) if q.get("ts") else "-",
                  q.get("request_id") or "", q.get("profile") or "",
                  Text(str(status), style="red" if status >= 400 or not status else "green"),
                  ms(q.get("latency_ms")), ms(q.get("ttfb_ms")), q.get("route") or "")
    if not data["recent"]:
        r.add_row("", Text("no requests yet", style="dim"), "", "", "", "", "")
    parts.append(r)
    parts.append(Text(f"updated {time.strftime('%H:%M:%S', time.localtime(data['at']))}; spend "
                      f"{money((data.get('spend') or {}).get('spent'))}", style="dim"))
    return Group(*parts)


def fetch(client: AdminClient) -> dict:
    try:
        status = client.call("GET", "/v1/status")
    except CorectlError:
        # An idle kept-alive connection may have been closed by the server (long --interval): reconnect once.
        client.close()
        status = client.call("GET", "/v1/status")
    traces = client.call("GET", f"/v1/requests?limit={TRACES_FETCHED}").get("requests", [])
    return compute(status, traces, time.time())


class _Keys:
    """Single key presses from a terminal stdin (cbreak: no line buffering, no echo; Ctrl-C still signals).
    The terminal is restored on exit whatever happens."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        self._saved = None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
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
    client = AdminClient(resolve_socket(socket), timeout=5.0)
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
    from rich.console import Console
    from rich.live import Live

    console = Console(highlight=False)
    if not console.is_terminal:
        client.close()
        console.print(view(data))  # piped: one frame, like `top -n 1`
        return 0
    previous = signal.signal(signal.SIGTERM, _terminate)  # so a kill also restores the terminal
    try:
        with _Keys() as keys, Live(view(data), console=console, screen=True, auto_refresh=False,
                                   transient=True) as live:
            live.refresh()
            while not keys.wait_for_quit(interval):
                error = None
                try:
                    data = fetch(client)
                except CorectlError as e:
                    client.close()  # reconnect next time: the daemon may be restarting
                    error = f"{e} (retrying)"
                live.update(view(data, error), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        client.close()
    return 0
