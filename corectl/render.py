"""Rich rendering of the admin API's answers. Imported only when a human is reading (not with --json)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from .safe import clean, clean_tree, escape_controls

_BREAKER_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}
_HEALTH_STYLE = {"HEALTHY": "green", "DEGRADED": "yellow", "UNHEALTHY": "bold red"}


class SafeConsole(Console):
    """The console every human view prints through: it interprets nothing in the text it prints (markup and
    emoji codes off: a client's `[link=...]` is printed as written), and a control character still in a text
    segment (a view that forgot to clean its data: see safe.py) is escaped on the way out. Rich's own cursor
    and style codes are control segments or added around the text, and pass."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("highlight", False)
        super().__init__(markup=False, emoji=False, **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None:
                text = escape_controls(seg.text)
                if text != seg.text:
                    yield Segment(text, seg.style)
                    continue
            yield seg


def console(**kwargs: Any) -> Console:
    # Piped output (scripts, `| less`) has no terminal width; Rich would assume 80 columns and fold URLs.
    c = SafeConsole(**kwargs)
    if not c.is_terminal and "COLUMNS" not in os.environ and "width" not in kwargs:
        c = SafeConsole(width=140, **kwargs)
    return c


def health_word(provider: dict) -> str:
    """A provider's state as `corectl status` and `top` show it: `auth (401)` while it refuses our key."""
    auth = provider.get("auth")
    if auth:
        return f"auth ({auth.get('status')})"
    return provider.get("health", "unknown")


# A column: (header, add_column kwargs, drop rank). The kwargs are Any: their dicts mix value types.
Column = tuple[str, Any, int]


def fit_table(width: int, columns: Sequence[Column], rows: Sequence[Sequence[Any]], **table_kw) -> Table:
    """A table that fits `width` columns without cutting anything: columns are (header, add_column kwargs, drop
    rank). Rank 0 is always shown; while the table's narrowest rendering (no_wrap cells whole, wrappable cells
    at their longest word) is wider than `width`, the column with the highest rank goes. Ids are no_wrap
    columns of rank 0, so they are never folded over lines (a request id must stay pasteable)."""
    mins, maxs = _sizes(columns, rows)
    shown = list(range(len(columns)))
    droppable = sorted((i for i, c in enumerate(columns) if c[2]), key=lambda i: -columns[i][2])
    while droppable and sum(mins[i] for i in shown) + _frame(len(shown), table_kw) > width:
        shown.remove(droppable.pop(0))
    t = Table(**table_kw)
    avail = width - _frame(len(shown), table_kw)
    widths = _wrap_widths([columns[i][1].get("no_wrap", False) for i in shown], [mins[i] for i in shown],
                          [maxs[i] for i in shown], avail)
    for i, w in zip(shown, widths, strict=True):
        t.add_column(columns[i][0], **({**columns[i][1], "width": w} if w is not None else columns[i][1]))
    for row in rows:
        t.add_row(*(row[i] for i in shown))
    return t


_MEASURE = Console(width=10_000, highlight=False, markup=False, emoji=False)  # as SafeConsole reads cells


def _sizes(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> tuple[list[int], list[int]]:
    """Per column: the narrowest it can be without cutting (no_wrap: its widest cell; else its longest word)
    and its natural width, padding excluded. Each cell is measured once."""
    from rich.measure import Measurement

    mins, maxs = [], []
    for i, (header, kw, _rank) in enumerate(columns):
        sizes = [Measurement.get(_MEASURE, _MEASURE.options, cell) for cell in (header, *(r[i] for r in rows))]
        widest = max(m.maximum for m in sizes)
        maxs.append(widest)
        mins.append(widest if kw.get("no_wrap") else max(m.minimum for m in sizes))
    return mins, maxs


def _frame(n: int, table_kw: dict) -> int:
    """Columns taken by borders and cell padding in a table of n columns."""
    probe = Table(**table_kw)
    for _ in range(n):
        probe.add_column()
    return probe._extra_width + (probe.padding[1] + probe.padding[3]) * n


def _wrap_widths(no_wrap: list[bool], mins: list[int], maxs: list[int], avail: int) -> list[int | None]:
    """Fixed widths for the wrappable columns when the natural widths do not fit, so that none is squeezed
    below its longest word (Rich shrinks the widest wrappable columns first, cutting words with an ellipsis
    although the table could fit). None: leave the column to Rich."""
    wrap = [i for i, nw in enumerate(no_wrap) if not nw]
    fixed = sum(maxs[i] for i, nw in enumerate(no_wrap) if nw)
    room = avail - fixed - sum(mins[i] for i in wrap)
    if not wrap or fixed + sum(maxs[i] for i in wrap) <= avail or room < 0:
        return [None] * len(no_wrap)
    slack = {i: maxs[i] - mins[i] for i in wrap}
    total = sum(slack.values())
    out: list[int | None] = [None] * len(no_wrap)
    for i in wrap:
        out[i] = mins[i] + (room * slack[i] // total if total else 0)
    return out


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


_KIND_STYLE = {"ok": "green", "warn": "yellow", "idle": "dim", "bad": "bold red"}


def traffic_cell(p: dict) -> Text:
    """The provider's one state word, as the daemon computed it (admin/words.py): the same word the dashboard
    prints, in the colour its kind says. The reasons in words follow the table (`traffic_lines`)."""
    s = p.get("state")
    if not s:
        return Text("?", style="dim")  # an older daemon
    return Text(str(s.get("word") or "?"), style=_KIND_STYLE.get(str(s.get("kind")), ""))


def traffic_lines(providers: list[dict]) -> Text | None:
    """Each provider that does not simply take traffic, with the reason in words, one line each (not folded into a
    table cell): the same words as the dashboard and `corectl explain`."""
    text = Text()
    for p in providers:
        a, s = p.get("availability"), p.get("state") or {}
        if not a or a.get("code") == "ok":
            continue
        if text:
            text.append("\n")
        takes = s.get("takes_traffic", a.get("available"))
        text.append(f"  {p['name']}: ", style="bold")
        text.append(("" if takes else "no traffic: ") + str(a.get("why") or ""),
                    style="yellow" if s.get("kind") in ("warn", "idle") else "red")
    return text or None


def _health(value: str) -> Text:
    if value.startswith("auth"):  # the provider refuses our credentials (401/403): a config problem to fix
        return Text(value, style="bold red")
    return Text(value.lower(), style=_HEALTH_STYLE.get(value, "dim"))


def _kv(rows: list[tuple[str, str | Text]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for k, v in rows:
        grid.add_row(k, v)
    return grid


def status(data: dict, out: Console) -> None:
    reload_error = data.get("last_reload_error")  # our own message, over several lines: kept as lines
    data = clean_tree(data)
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
        rows.append(("reload", Text("last reload failed, previous config kept:\n"
                                    + clean(str(reload_error), newlines=True), style="bold red")))
    spend = spend_line(data.get("budget"))
    if spend is not None:
        rows.append(("spend", spend))
    if data.get("state_dir"):
        rows.append(("state", data["state_dir"]))
    memory = memory_line(data.get("memory"))
    if memory is not None:
        rows.append(("memory", memory))
    shared = shared_line(data.get("shared"))
    if shared is not None:
        rows.append(("shared state", shared))
    if data.get("keys"):
        from .keys_render import status_line

        rows.append(("keys", status_line(data["keys"])))
    out.print(_kv(rows))
    store = data.get("store") or {}
    if store and not store.get("healthy", True):
        out.print(Text(f"WARNING: persistence is failing, serving on without it: {store.get('problem')}",
                       style="bold red"))
    out.print()
    # Columns that do not fit are dropped, least useful first (--json and `corectl providers` have them all).
    out.print(providers_table(data["providers"], data.get("stats_window_s"), width=out.width))
    why = traffic_lines(data["providers"])
    if why is not None:
        out.print(why)
    for line in key_problems(data["providers"]):
        out.print(line)
    out.print()
    out.print(profiles_table(data["profiles"], out.width))
    procs = data.get("processes") or {}
    if procs:
        out.print()
        out.print(processes_table(procs, width=out.width))
        budget = budget_line(data.get("models"))
        if budget:
            out.print(budget)
        for line in slot_cache_lines(data["providers"]):
            out.print(line)
        for name, snap in procs.items():
            if snap.get("fatal_reason"):
                out.print(Text(f"{name}: {snap['fatal_reason']} (corectl restart {name} once it is fixed; "
                               f"log: {snap.get('log')})", style="red"))


def shared_line(sh: dict | None) -> Text | None:
    """[state] backend = "postgres": where (never with its password), up or not, the live instances with their
    heartbeat age, and how far behind the journal shipping is."""
    if not sh:
        return None
    text = Text(f"{sh.get('where', '')}  as {sh.get('instance')}  ")
    if sh.get("up"):
        text.append("up", style="green")
    else:
        since = sh.get("down_since")
        text.append("DOWN" + (f" for {duration(time.time() - since)}" if since else ""), style="bold red")
        text.append(" (budgets: local share, breakers: local)", style="yellow")
        if sh.get("problem"):
            text.append(f"\n{sh['problem']}", style="dim")
    peers = sh.get("instances") or []
    text.append(f"\n{len(peers)} live: ")
    text.append(", ".join(f"{p['instance']}@{p.get('host', '?')} ({p.get('beat_age_s', 0):.1f}s)" for p in peers)
                or "-")
    j = sh.get("journal") or {}
    if j:
        text.append(f"\njournal shipped {j.get('shipped', 0)}, behind {j.get('behind', 0)}")
        if j.get("last_ship"):
            text.append(f", last {duration(max(time.time() - j['last_ship'], 0))} ago")
        if j.get("problem"):
            text.append(f" ({j['problem']})", style="yellow")
    b = sh.get("budget") or {}
    if b.get("settles_queued"):
        text.append(f"\n{b['settles_queued']} settles waiting for the ledger", style="yellow")
    br = sh.get("breakers") or {}
    if br and not br.get("listening"):
        text.append("\nbreakers: not listening (polling)", style="yellow")
    return text


def memory_line(m: dict | None) -> Text | None:
    """Available memory on this machine and whether it is under the pressure threshold."""
    if not m or m.get("available_bytes") is None:
        return None
    text = Text(f"{m['available_bytes'] / 1e9:.1f} GB available")
    if m.get("low"):
        text.append(f"  LOW (threshold {m['threshold_bytes'] / 1e9:.1f} GB)", style="bold red")
    return text


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


def _next_step(name: str, p: dict, now: float | None) -> str:
    """When self-healing probes next; a FATAL process is probed by nobody until someone restarts it."""
    state = p.get("state")
    if state == "fatal":
        return f"corectl restart {name}"
    if state == "stopped":
        return "-"
    return next_probe(p.get("next_probe_at"), now)


def processes_table(procs: dict[str, dict], *, now: float | None = None, width: int = 10_000) -> Table:
    right = {"justify": "right", "no_wrap": True}
    columns = [("Process", {"no_wrap": True, "style": "bold"}, 0), ("Serves", {}, 4), ("State", {"no_wrap": True}, 0),
               ("PID", right, 5), ("Up", right, 3), ("Restarts recent/all", right, 6), ("RSS", right, 2),
               ("CPU", right, 1),
               ("Exit", right, 7), ("Next probe", {"no_wrap": True}, 8), ("Memory", right, 5),
               ("Idle stop", right, 6), ("Last stop", {"no_wrap": True}, 7)]
    rows = []
    for name, p in procs.items():
        up = p.get("uptime_s")
        cpu = p.get("cpu_percent")
        code = p.get("last_exit_code")
        rows.append([name, ", ".join(p.get("providers") or []), process_state(p),
                     str(p["pid"]) if p.get("pid") else "-", duration(up) if up is not None else "-",
                     f"{p.get('restarts_recent', 0)}/{p.get('restarts_total', 0)}", size(p.get("rss_bytes")),
                     f"{cpu:.0f}%" if cpu is not None else "-",
                     Text(str(code), style="red" if code else "") if code is not None else "-",
                     _next_step(name, p, now), memory_cell(p), idle_cell(p), p.get("last_stop_reason") or "-"])
    return fit_table(width, columns, rows, title="Managed processes", title_justify="left", title_style="bold")


def memory_cell(p: dict) -> str:
    """What a managed process holds (configured or estimated), "pinned" when never stopped to make room."""
    mb = p.get("memory_mb")
    text = f"{mb:,.0f} MB" if mb else "-"
    return f"{text} pinned" if p.get("pinned") else text


def idle_cell(p: dict) -> str:
    left = p.get("idle_stop_in_s")
    if left is None:
        return "-" if not p.get("idle_stop_s") else "busy" if p.get("in_flight") else "-"
    return f"in {duration(left)}"


def budget_line(models: dict | None) -> str | None:
    """Local models against [models] memory_budget_mb, one line."""
    if not models:
        return None
    held, budget = models.get("memory_held_mb") or 0.0, models.get("memory_budget_mb") or 0.0
    resident = ", ".join(models.get("resident") or []) or "none"
    of = f" of {budget:,.0f} MB budget" if budget else " (no budget)"
    return f"Local models: {held:,.0f} MB held{of}; resident: {resident}"


def providers_table(providers: list[dict], window_s: float | None, *, base_url: bool = True,
                    width: int = 10_000) -> Table:
    title = "Providers" + (f" (figures over the last {window_s:g} s)" if window_s else "")
    right = {"justify": "right", "no_wrap": True}
    # Drop rank: what goes first when the terminal is narrow (health, which Traffic already words; the window; the
    # base URL; then the kind, ...).
    columns = [("Provider", {"no_wrap": True, "style": "bold"}, 0), ("Kind", {"no_wrap": True}, 6),
               ("Model", {"no_wrap": True}, 3), ("Traffic", {"no_wrap": True}, 0),
               ("Breaker", {"no_wrap": True}, 0), ("Health", {"no_wrap": True}, 9), ("Context", right, 8),
               ("Reqs", right, 5), ("Errors", right, 1), ("Median", right, 2), ("Cache hit", right, 4),
               ("Repair", right, 3), ("Drift", {"no_wrap": True}, 2)]
    if base_url:
        columns.append(("Base URL", {"no_wrap": True}, 7))
    rows = []
    for p in providers:
        f = p.get("figures") or {}
        reqs = (f.get("samples") or 0) - (f.get("probes") or 0)
        errors = f.get("errors") or 0
        cells = [p["name"], p["kind"] + (" $" if p.get("paid") else ""),
                 p["model"] or Text("(client's)", style="dim"), traffic_cell(p), _breaker(p.get("breaker") or {}),
                 _health(health_word(p)), context_cell(p), str(reqs),
                 Text(str(errors), style="red" if errors else ""), latency(f.get("median_s")),
                 cache_hit(p.get("cache")), repair_cell(p.get("tool_repair")), drift_cell(p.get("drift"))]
        rows.append(cells + ([p["base_url"]] if base_url else []))
    return fit_table(width, columns, rows, title=title, title_justify="left", title_style="bold")


def context_cell(p: dict) -> Text:
    """The window requests are routed by; "srv" when it is what the server reports (the config left it unset)."""
    window = p.get("context_window")
    if not window:
        return Text("?", style="dim")
    reported = not (p.get("configured_context_window") or 0)
    return Text(f"{window:,}") + (Text(" srv", style="dim") if reported else Text(""))


def repair_cell(tr: dict | None) -> Text:
    """Tool-call repair: "off", or the share of tool-offering answers whose calls had to be repaired."""
    if not tr:
        return Text("-", style="dim")
    if tr.get("mode") == "off" or (tr.get("mode") == "auto" and not tr.get("local")):
        return Text("off", style="dim")
    answers, repaired = tr.get("answers") or 0, tr.get("repaired") or 0
    if not answers:
        return Text("on", style="dim")
    return Text(f"{repaired}/{answers} ({repaired / answers:.0%})", style="yellow" if repaired else "")


def drift_cell(d: dict | None) -> Text:
    """Drift score (0..1, 1 = a signal at its threshold) and the signals that fired; '-' for remote providers."""
    if not d:
        return Text("-", style="dim")
    if not d.get("signals"):
        return Text(f"{d.get('score') or 0:.2f}" if d.get("samples") else "-", style="dim")
    text = Text(f"{d['score']:.2f} " + ", ".join(d["signals"]), style="bold red")
    if d.get("demoted_for_s"):
        text.append(f" (demoted {d['demoted_for_s']:.0f}s)", style="yellow")
    return text


def slot_cache_lines(providers: list[dict]) -> list[Text]:
    """What keeping managed llama-servers' KV caches across stops costs: saves and restores, time and bytes."""
    out = []
    for p in providers:
        w = ((p.get("cache") or {}).get("slots") or {}).get("warm")
        if not w or not any(w.get(k) for k in ("saves", "restores", "save_failures", "restore_failures",
                                                 "restores_refused", "restores_not_taken", "copy_1000_s")):
            continue
        text = Text(f"{p['name']} slot caches: {w['saves']} saved ({size(w['save_bytes'])}, {w['save_s']:.2f} s), "
                    f"{w['restores']} restored ({size(w['restore_bytes'])}, {w['restore_s']:.2f} s), "
                    f"{size(w.get('disk_bytes'))} on disk", style="dim")
        failed = (w.get("save_failures") or 0) + (w.get("restore_failures") or 0)
        if failed:
            text.append(f"; {failed} refused or unanswered", style="yellow")
        # Restores checked, not trusted (kvcache/): a file refused before the server saw it (its size is not its
        # sidecar's, or it is gone), and restores the server accepted that the answer's cached tokens disproved.
        if w.get("restores_refused"):
            text.append(f"; {w['restores_refused']} file(s) refused (truncated or gone)", style="bold red")
        if w.get("restores_not_taken"):
            text.append(f"; {w['restores_not_taken']} restore(s) did not take", style="bold red")
        cost = f"~{w['copy_1000_s']:.3f} s per 1,000 tokens" if w.get("copy_1000_s") is not None else ""
        if w.get("copies"):
            # New lanes seeded from another slot's prefix (issue 44 §0), and what a copy costs this server.
            text.append(f"; {w['copies']} new lane(s) seeded by a copy" + (f", {cost}" if cost else ""))
        elif cost:
            # Learnt (and kept across restarts) before any copy: what the next new lane's choice weighs.
            text.append(f"; a slot copy {cost}")
        if w.get("saves_discarded"):
            text.append(f"; {w['saves_discarded']} save(s) deleted at once (max_saved_mb below one file)",
                        style="yellow")
        out.append(text)
    return out


def key_problems(providers: list[dict]) -> list[Text]:
    """One line per provider that would send requests without its key."""
    return [Text(f"{p['name']}: {p['key_problem']}", style="yellow") for p in providers if p.get("key_problem")]


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
    # The daemon's words when nothing takes traffic now: "none available", or the models a request starts (D6).
    words = profile.get("order_words") or (" > ".join(order) if order else "none available")
    text = Text(words, style="" if order else "bold red" if words == "none available" else "yellow")
    skips = profile.get("skips") or []
    if skips:
        text.append("  skipped: " + ", ".join(f"{s['provider']} ({s['reason']})" for s in skips), style="yellow")
    return text


def profiles_table(profiles: list[dict], width: int = 10_000) -> Table:
    columns = [("", {"no_wrap": True}, 0), ("Profile", {"no_wrap": True, "style": "bold"}, 0),
               ("Mode", {"no_wrap": True}, 1), ("Chain", {}, 2), ("Effective order", {}, 0)]
    rows = []
    for p in profiles:
        mode = p["mode"] + (" adaptive" if p.get("adaptive") else "")
        rows.append([Text("●", style="green") if p.get("active") else "", p["name"], mode,
                     " > ".join(p["providers"]), _order(p)])
    return fit_table(width, columns, rows, title="Profiles", title_justify="left", title_style="bold")


def profile_detail(data: dict, out: Console) -> None:
    data = clean_tree(data)
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
        ("health", f"{s['health_action']} after {s['out_after_failures']} failures"),
        ("tool loop", f"{tl['action']} at {tl['threshold']} repeats in the last {tl['window']} calls"),
        ("effective", _order(data)),
    ]
    if data.get("routes"):
        rows.append(("routes", ", ".join(data["routes"])))
    out.print(_kv(rows))
    columns = [("#", {"justify": "right", "no_wrap": True}, 0), ("Provider", {"style": "bold", "no_wrap": True}, 0),
               ("Kind", {"no_wrap": True}, 1), ("Base URL", {"no_wrap": True}, 2), ("Model", {"no_wrap": True}, 3)]
    cells = [[str(i), p["name"], p["kind"] + (" $" if p.get("paid") else ""), p["base_url"],
              p["model"] or Text("(client's)", style="dim")] for i, p in enumerate(data["providers"], 1)]
    out.print(fit_table(out.width, columns, cells, title="Chain", title_justify="left", title_style="bold"))
