"""Rich rendering of the admin API's answers. Imported only when a human is reading (not with --json)."""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

_BREAKER_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}
_HEALTH_STYLE = {"HEALTHY": "green", "DEGRADED": "yellow", "UNHEALTHY": "bold red"}


def console() -> Console:
    # Piped output (scripts, `| less`) has no terminal width; Rich would assume 80 columns and fold URLs.
    c = Console(highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(highlight=False, width=140)
    return c


def duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h}h"


def latency(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _breaker(snap: dict) -> Text:
    state = snap.get("state", "closed")
    label = state.replace("_", "-")
    if state == "open" and snap.get("retry_in_s") is not None:
        label += f" ({snap['retry_in_s']:.0f}s)"
    return Text(label, style=_BREAKER_STYLE.get(state, ""))


def _health(value: str) -> Text:
    return Text(value.lower(), style=_HEALTH_STYLE.get(value, "dim"))


def _kv(rows: list[tuple[str, str | Text]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for k, v in rows:
        grid.add_row(k, v)
    return grid


def status(data: dict, out: Console) -> None:
    header = Text.assemble(("coderouterd ", "bold"), (data["version"], "bold cyan"),
                           f"  pid {data['pid']}  up {duration(data['uptime_s'])}")
    out.print(header)
    profile = Text(data["active_profile"], style="bold")
    if data["active_profile"] != data["default_profile"]:
        profile.append(f"  (default: {data['default_profile']})", style="dim")
    rows: list[tuple[str, str | Text]] = [
        ("listen", data["listen"]["url"]),
        ("config", data["config_path"]),
        ("admin", data.get("admin_socket", "")),
        ("profile", profile),
    ]
    if data.get("last_reload_error"):
        rows.append(("reload", Text("last reload failed, previous config kept:\n" + data["last_reload_error"],
                                    style="bold red")))
    spend = spend_line(data.get("budget"))
    if spend is not None:
        rows.append(("spend", spend))
    if data.get("state_dir"):
        rows.append(("state", data["state_dir"]))
    out.print(_kv(rows))
    store = data.get("store") or {}
    if store and not store.get("healthy", True):
        out.print(Text(f"WARNING: persistence is failing, serving on without it: {store.get('problem')}",
                       style="bold red"))
    out.print()
    # Base URLs fold into unreadable columns on a narrow terminal; --json and `profile show` have them.
    out.print(providers_table(data["providers"], data.get("stats_window_s"), base_url=out.width >= 120))
    out.print()
    out.print(profiles_table(data["profiles"]))
    procs = data.get("processes") or {}
    if procs:
        out.print()
        out.print(processes_table(procs))
        for name, snap in procs.items():
            if snap.get("fatal_reason"):
                out.print(Text(f"{name}: {snap['fatal_reason']} (corectl restart {name} once it is fixed; "
                               f"log: {snap.get('log')})", style="red"))


def money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def _spent(entry: dict) -> Text:
    text = Text(money(entry.get("spent")))
    cap = entry.get("cap") or 0
    if cap > 0:
        ratio = entry.get("ratio") or 0.0
        style = "bold red" if entry.get("blocked") or ratio >= 1 else "yellow" if ratio >= 0.8 else ""
        text.append(f" of {money(cap)} ({ratio * 100:.0f}%)", style=style)
        if entry.get("blocked"):
            text.append(" blocked", style="bold red")
    return text


def spend_line(budget: dict | None) -> Text | None:
    """Spend this month against the caps: the global figure, then each provider that spent or has a cap."""
    if not budget:
        return None
    line = _spent(budget.get("global") or {})
    if not (budget.get("global") or {}).get("cap"):
        line.append(" (no global cap)", style="dim")
    parts = [(name, e) for name, e in sorted((budget.get("providers") or {}).items())
             if (e.get("spent") or 0) > 0 or (e.get("cap") or 0) > 0]
    for name, e in parts:
        line.append(f"  {name} ")
        line.append_text(_spent(e))
    if budget.get("month"):
        line.append(f"  ({budget['month']})", style="dim")
    return line


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


_PROCESS_STYLE = {"ready": "green", "starting": "yellow", "backoff": "yellow", "stopping": "yellow",
                  "stopped": "dim", "fatal": "bold red"}


def process_state(snap: dict) -> Text:
    state = snap.get("state", "?")
    text = Text(state, style=_PROCESS_STYLE.get(state, ""))
    if snap.get("external"):
        text.append(" (external)", style="dim")
    elif snap.get("adopted"):
        text.append(" (adopted)", style="dim")
    return text


def next_probe(at: float | None, now: float | None = None) -> str:
    if at is None:
        return "-"
    left = at - (time.time() if now is None else now)
    return "due" if left <= 0 else f"in {duration(left)}"


def processes_table(procs: dict[str, dict], *, now: float | None = None) -> Table:
    t = Table(title="Managed processes", title_justify="left", title_style="bold")
    t.add_column("Process", no_wrap=True, style="bold")
    t.add_column("Serves", overflow="fold")
    t.add_column("State", no_wrap=True)
    t.add_column("PID", justify="right", no_wrap=True)
    t.add_column("Up", justify="right", no_wrap=True)
    t.add_column("Restarts", justify="right", no_wrap=True)
    t.add_column("RSS", justify="right", no_wrap=True)
    t.add_column("CPU", justify="right", no_wrap=True)
    t.add_column("Exit", justify="right", no_wrap=True)
    t.add_column("Next probe", no_wrap=True)
    for name, p in procs.items():
        up = p.get("uptime_s")
        cpu = p.get("cpu_percent")
        code = p.get("last_exit_code")
        t.add_row(name, ", ".join(p.get("providers") or []), process_state(p),
                  str(p["pid"]) if p.get("pid") else "-", duration(up) if up is not None else "-",
                  f"{p.get('restarts_recent', 0)}/{p.get('restarts_total', 0)}", size(p.get("rss_bytes")),
                  f"{cpu:.0f}%" if cpu is not None else "-",
                  Text(str(code), style="red" if code else "") if code is not None else "-",
                  next_probe(p.get("next_probe_at"), now))
    return t


def providers_table(providers: list[dict], window_s: float | None, *, base_url: bool = True) -> Table:
    title = "Providers" + (f" (figures over the last {window_s:g} s)" if window_s else "")
    t = Table(title=title, title_justify="left", title_style="bold")
    t.add_column("Provider", no_wrap=True, style="bold")
    t.add_column("Kind", no_wrap=True)
    t.add_column("Model", overflow="fold")
    t.add_column("Breaker", no_wrap=True)
    t.add_column("Health", no_wrap=True)
    t.add_column("Reqs", justify="right", no_wrap=True)
    t.add_column("Errors", justify="right", no_wrap=True)
    t.add_column("Median", justify="right", no_wrap=True)
    t.add_column("Cache hit", justify="right", no_wrap=True)
    if base_url:
        t.add_column("Base URL", overflow="fold")
    for p in providers:
        f = p.get("figures") or {}
        reqs = (f.get("samples") or 0) - (f.get("probes") or 0)
        errors = f.get("errors") or 0
        cells = [p["name"], p["kind"] + (" $" if p.get("paid") else ""),
                 p["model"] or Text("(client's)", style="dim"), _breaker(p.get("breaker") or {}),
                 _health(p.get("health", "unknown")), str(reqs),
                 Text(str(errors), style="red" if errors else ""), latency(f.get("median_s")),
                 cache_hit(p.get("cache"))]
        t.add_row(*cells, *([p["base_url"]] if base_url else []))
    return t


def cache_hit(cache: dict | None) -> Text:
    """Token-weighted prompt cache hit ratio, and the slots prefix affinity pins turns to."""
    cache = cache or {}
    ratio = cache.get("hit_ratio")
    out = Text("-" if ratio is None else f"{ratio * 100:.0f}%",
               style="dim" if ratio is None else "green" if ratio >= 0.8 else "yellow" if ratio >= 0.5 else "red")
    slots = cache.get("slots")
    if slots:
        out.append(f" ({slots['lanes']}/{slots['total']} slots)", style="dim")
    return out


def _order(profile: dict) -> Text:
    order = profile.get("effective_order") or []
    text = Text(" > ".join(order) if order else "none available", style="" if order else "bold red")
    skips = profile.get("skips") or []
    if skips:
        text.append("  skipped: " + ", ".join(f"{s['provider']} ({s['reason']})" for s in skips), style="yellow")
    return text


def profiles_table(profiles: list[dict]) -> Table:
    t = Table(title="Profiles", title_justify="left", title_style="bold")
    t.add_column("", no_wrap=True)
    t.add_column("Profile", no_wrap=True, style="bold")
    t.add_column("Mode", no_wrap=True)
    t.add_column("Chain", overflow="fold")
    t.add_column("Effective order", overflow="fold")
    for p in profiles:
        mode = p["mode"] + (" adaptive" if p.get("adaptive") else "")
        t.add_row(Text("●", style="green") if p.get("active") else "", p["name"], mode,
                  " > ".join(p["providers"]), _order(p))
    return t


def profile_detail(data: dict, out: Console) -> None:
    s = data["settings"]
    tags = [tag for tag, on in (("active", data["active"]), ("default", data["default"])) if on]
    title = Text(data["name"], style="bold")
    if tags:
        title.append(f"  ({', '.join(tags)})", style="green")
    out.print(title)
    mode = s["mode"] + (f", width {s['race_width']}" if s["mode"] == "race" else "")
    tl = s["tool_loop"]
    rows: list[tuple[str, str | Text]] = [
        ("mode", mode),
        ("adaptive", "yes" if s["adaptive"] else "no"),
        ("health", f"{s['health_action']} after {s['health_threshold']} failures"),
        ("tool loop", f"{tl['action']} at {tl['threshold']} repeats in the last {tl['window']} calls"),
        ("effective", _order(data)),
    ]
    if data.get("routes"):
        rows.append(("routes", ", ".join(data["routes"])))
    out.print(_kv(rows))
    t = Table(title="Chain", title_justify="left", title_style="bold")
    t.add_column("#", justify="right")
    t.add_column("Provider", style="bold", no_wrap=True)
    t.add_column("Kind")
    t.add_column("Base URL", overflow="fold")
    t.add_column("Model", overflow="fold")
    for i, p in enumerate(data["providers"], 1):
        t.add_row(str(i), p["name"], p["kind"] + (" $" if p.get("paid") else ""), p["base_url"],
                  p["model"] or Text("(client's)", style="dim"))
    out.print(t)
