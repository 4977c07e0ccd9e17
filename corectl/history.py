"""History straight from the state directory: audit tail, journal tail/export, replay compare.

These read the files the daemon writes (audit.jsonl*, state.db) without talking to it, so they work with the
daemon stopped; SQLite is opened read-only, so a query never blocks or corrupts the daemon's writes."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .client import CorectlError
from .commands import emit_json, run

if TYPE_CHECKING:  # imported where used: corectl's other commands never load the journal's modules (or rich)
    from rich.console import Console
    from rich.table import Table

    from coderouterd.state.journal_reader import JournalReader

DB_FILE = "state.db"
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


# -- time expressions ---------------------------------------------------------------------------------------

def parse_time(text: str, now: float | None = None) -> float:
    """Epoch seconds for an ISO date/time or a relative age (2h = two hours ago). Raises ValueError."""
    raw = text.strip()
    now = time.time() if now is None else now
    if raw.lower() == "now":
        return now
    m = _RELATIVE.match(raw.lower())
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        dt = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use an ISO date/time (2025-06-01, 2025-06-01T14:30) "
                         "or a relative age (30m, 2h, 7d, 1w)") from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # a person typing a bare date means their own clock
    return dt.timestamp()


def parse_window(text: str, now: float | None = None) -> tuple[float, float]:
    """`START..END` (END empty = now) -> (since, until). Either side is a time expression."""
    if ".." not in text:
        raise ValueError(f"{text!r} is not a window: write START..END, e.g. 14d..7d or 7d.. (up to now)")
    start, end = text.split("..", 1)
    if not start.strip():
        raise ValueError(f"window {text!r} has no start: write START..END, e.g. 14d..7d")
    now = time.time() if now is None else now
    since = parse_time(start, now)
    until = parse_time(end, now) if end.strip() else now
    if until <= since:
        raise ValueError(f"window {text!r} ends before it starts")
    return since, until


def local_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


# -- where the state is -------------------------------------------------------------------------------------

def resolve_state_dir(explicit: str | None, socket: str | None) -> tuple[Path, str]:
    """(state dir, how it was found): see corectl.target."""
    from .target import state_dir_for

    return state_dir_for(explicit, socket)


def _state_dir_or_fail(explicit: str | None, socket: str | None) -> Path:
    sdir, how = resolve_state_dir(explicit, socket)
    if not sdir.is_dir():
        raise CorectlError(f"no state directory at {sdir} (from {how}); pass --state-dir or set "
                           "CODEROUTER_STATE_DIR", code=1, payload={"state_dir": str(sdir)})
    return sdir


# -- which journal ------------------------------------------------------------------------------------------

def local_journal(sdir: Path) -> JournalReader:
    """This machine's journal: the state directory's SQLite file."""
    from coderouterd.state.journal_reader import SqliteJournal

    return SqliteJournal(sdir / DB_FILE)


def journal_for(sdir: Path, socket: str | None, *, local: bool = False,
                instance: str | None = None) -> JournalReader:
    """Where the journal is read: this machine's SQLite, or, when the daemon's config says
    `[state] backend = "postgres"`, the shared journal (every instance's rows; `local` keeps to this machine's,
    `instance` to one instance's). Either is the one journal reader (coderouterd/state/journal_reader.py)."""
    if local:
        if instance:
            raise CorectlError("--instance reads the shared journal; it does not go with --local", code=2)
        return local_journal(sdir)
    from coderouterd.config import ConfigError, load_config

    from .target import config_for

    try:
        state = load_config(config_for(None, socket, state_dir=sdir).value).model.state
    except ConfigError:
        state = None
    if state is None or state.backend != "postgres":
        if instance:
            raise CorectlError("--instance needs the shared journal ([state] backend = \"postgres\")", code=2)
        return local_journal(sdir)
    from coderouterd.cluster.backend import start_problem
    from coderouterd.config.envfile import load_env_file
    from coderouterd.state.shared.dsn import DsnMissing, redact, resolve
    from coderouterd.state.shared.journal_read import PostgresJournal

    load_env_file()  # dsn_env may name a variable kept in the daemon's env file
    problem = start_problem(state)
    if problem is not None:
        raise CorectlError(f"the shared journal: {problem} (pass --local to read this machine's journal)", code=1)
    try:
        dsn = resolve(state)
    except DsnMissing as e:
        raise CorectlError(f"{e} (pass --local to read this machine's journal)", code=1) from None
    return PostgresJournal(dsn, where=redact(dsn), instance=instance)


def run_reading(as_json: bool, work: Callable[[], int]) -> int:
    """run() for a command that reads the journal: a journal that cannot be read is its one line (exit 1)."""
    def guarded() -> int:
        from coderouterd.state.journal_reader import JournalUnreadable

        try:
            return work()
        except JournalUnreadable as e:
            raise CorectlError(str(e), code=1) from None

    return run(as_json, guarded)


# -- names a filter may use ----------------------------------------------------------------------------------

def known_names(sdir: Path, socket: str | None, journal: JournalReader | None = None) -> dict[str, set[str]]:
    """Provider and profile names a filter may use: the daemon's config (asked when it runs, else read from the
    file it last ran with) and every name the journal has rows for."""
    from .target import config_for, running_daemon, used_state_dir

    try:
        names = (journal or local_journal(sdir)).names()
    except Exception:  # an unreadable journal is reported by the query itself
        names = {"provider": set(), "profile": set()}
    status = running_daemon(socket)
    if status is not None and used_state_dir(status, sdir):  # not another daemon's, on another state directory
        names["provider"] |= {p["name"] for p in status.get("providers") or []}
        names["profile"] |= {p["name"] for p in status.get("profiles") or []}
        return names
    from coderouterd.config import ConfigError, load_config

    try:
        model = load_config(config_for(None, socket, daemon=status, state_dir=sdir).value).model
    except ConfigError:
        return names
    names["provider"] |= set(model.providers)
    names["profile"] |= set(model.profiles)
    return names


def check_names(known: dict[str, set[str]], kind: str, *values: str | None) -> None:
    """Exit 1 with the valid names when a filter names nothing that exists (it would silently match nothing)."""
    valid = known.get(kind) or set()
    unknown = [v for v in values if v is not None and v not in valid]
    if not unknown or not valid:
        return
    message = f"unknown {kind} {', '.join(map(repr, unknown))}; valid {kind}s: {', '.join(sorted(valid))}"
    other = "profile" if kind == "provider" else "provider"
    if all(v in (known.get(other) or set()) for v in unknown):
        message += f" ({' and '.join(unknown)} {'is a' if len(unknown) == 1 else 'are'} {other}"
        message += f"{'' if len(unknown) == 1 else 's'}: add --by {other})"
    raise CorectlError(message, code=1, payload={"unknown": unknown, f"valid_{kind}s": sorted(valid)})


def _check_filters(sdir: Path, socket: str | None, provider: str | None, profile: str | None,
                   journal: JournalReader | None = None) -> None:
    if provider is None and profile is None:
        return
    known = known_names(sdir, socket, journal)
    check_names(known, "provider", provider)
    check_names(known, "profile", profile)


def _console() -> Console:
    from .render import console

    return console()


# -- audit ----------------------------------------------------------------------------------------------------

def audit_line(rec: dict) -> str:
    ts = str(rec.get("ts", ""))
    try:
        shown = local_time(parse_time(ts))
    except ValueError:
        shown = ts
    import orjson

    fields = []
    for k, v in rec.items():
        if k in ("ts", "kind") or v in (None, "", [], {}):
            continue
        value = v if isinstance(v, str) else orjson.dumps(v).decode()
        fields.append(f"{k}={value}")
    from .safe import clean

    return clean(f"{shown}  {rec.get('kind', '?'):<18} {' '.join(fields)}")


def audit_tail(state_dir: str | None, socket: str | None, n: int, follow: bool, kinds: list[str] | None,
               since: str | None, as_json: bool, *, poll_s: float = 0.3) -> int:
    def work() -> int:
        from coderouterd.state import event_kinds, follow_audit, read_audit

        bad = [k for k in kinds or [] if k not in event_kinds()]
        if bad:
            raise CorectlError(f"unknown kind {', '.join(map(repr, bad))}; valid kinds: {', '.join(event_kinds())}",
                               code=1, payload={"valid_kinds": event_kinds()})
        since_ts = _parse_or_fail(since, "--since") if since else None
        sdir = _state_dir_or_fail(state_dir, socket)
        # Following starts before the backlog is read: a record written in between shows twice, never zero times.
        stream = follow_audit(sdir, poll_s=poll_s) if follow else None
        records = read_audit(sdir, n, kinds or None,
                             datetime.fromtimestamp(since_ts, UTC) if since_ts is not None else None)
        if as_json and not follow:
            emit_json({"state_dir": str(sdir), "records": records})
            return 0
        for rec in records:
            _print_record(rec, as_json)
        if stream is not None:
            for rec in stream:
                if not kinds or rec.get("kind") in kinds:
                    _print_record(rec, as_json)
        elif not records and not as_json:
            sys.stderr.write(f"corectl: no audit records in {sdir}\n")
        return 0

    return run(as_json, work)


def _print_record(rec: dict, as_json: bool) -> None:
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps(rec).decode() + "\n")
    else:
        sys.stdout.write(audit_line(rec) + "\n")
    sys.stdout.flush()


def _parse_or_fail(text: str, flag: str) -> float:
    try:
        return parse_time(text)
    except ValueError as e:
        raise CorectlError(f"{flag}: {e}", code=2) from None


# -- journal --------------------------------------------------------------------------------------------------

def route_text(attempts: list[dict]) -> str:
    parts = []
    for a in attempts or []:
        outcome = a.get("outcome")
        panic = "panic:" if a.get("panic") else ""
        if outcome == "ok":
            parts.append(f"{a.get('provider')} {panic}ok")
        else:
            parts.append(f"{a.get('provider')} {panic}{outcome}:{a.get('reason')}")
    return " > ".join(parts)


def journal_tail(state_dir: str | None, socket: str | None, n: int, provider: str | None, profile: str | None,
                 as_json: bool, *, instance: str | None = None, local: bool = False, key: str | None = None) -> int:
    def work() -> int:
        sdir = _state_dir_or_fail(state_dir, socket)
        journal = journal_for(sdir, socket, local=local, instance=instance)
        _check_filters(sdir, socket, provider, profile, journal)
        rows = journal.rows(provider=provider, profile=profile, limit=n, key=key)
        if as_json:
            emit_json({"state_dir": str(sdir), "journal": journal.where, "rows": rows})
            return 0
        if not rows:
            sys.stderr.write(f"corectl: no requests in the journal at {journal.where}\n")
            return 0
        out = _console()
        out.print(journal_table(rows, out.width, shared=journal.shared))
        return 0

    return run_reading(as_json, work)


def journal_table(rows: list[dict], width: int = 10_000, *, now: float | None = None,
                  shared: bool = False) -> Table:
    from rich.text import Text

    from .render import fit_table, latency, money
    from .safe import clean_tree

    rows = clean_tree(rows)  # rows any client (and, shared, any instance) wrote: never a terminal escape
    right = {"justify": "right", "no_wrap": True}
    # The request id is never folded (it is pasted into `corectl explain`); the route wraps between steps.
    columns = [("Time", {"no_wrap": True}, 0), ("Request", {"no_wrap": True}, 0), ("Profile", {"no_wrap": True}, 5),
               ("Provider", {"no_wrap": True}, 0), ("Status", right, 0), ("Latency", right, 4), ("TTFB", right, 2),
               ("Tokens in/out", right, 3), ("Cost", right, 1), ("Route", {}, 6)]
    if shared:  # the shared journal: which instance served each row
        columns.insert(1, ("Instance", {"no_wrap": True}, 0))  # which machine: kept whatever else goes
    keyed = any(r.get("key_name") for r in rows)
    if keyed:  # team keys in use: whose request each row was
        columns.insert(len(columns) - 8, ("Key", {"no_wrap": True}, 5))
    cells = []
    for r in rows:
        status = r.get("status") or 0
        cells.append([short_time(r["ts"], now), *([r.get("instance") or ""] if shared else []),
                      r.get("request_id") or "", *([r.get("key_name") or "-"] if keyed else []),
                      r.get("profile") or "",
                      r.get("provider") or Text("-", style="red"),
                      Text(str(status), style="red" if status >= 400 else "green"),
                      _ms(r.get("latency_ms"), latency), _ms(r.get("ttfb_ms"), latency),
                      # "~": an estimate (a stream cut before the upstream reported its usage; issue 41)
                      f"{'~' if r.get('usage_estimated') else ''}{r.get('input_tokens') or 0:,}/"
                      f"{r.get('output_tokens') or 0:,}", money(r.get("cost_usd")),
                      route_text(r.get("attempts") or []) + (" (stream)" if r.get("streaming") else "")])
    title = f"Journal (last {len(rows)} requests{', all instances' if shared else ''})"
    return fit_table(width, columns, cells, title=title, title_justify="left",
                     title_style="bold")


def short_time(ts: float, now: float | None = None) -> str:
    """The time alone for today's rows, the date too for older ones (--json and export have full times)."""
    now = time.time() if now is None else now
    if time.strftime("%Y-%m-%d", time.localtime(ts)) == time.strftime("%Y-%m-%d", time.localtime(now)):
        return time.strftime("%H:%M:%S", time.localtime(ts))
    return time.strftime("%m-%d %H:%M", time.localtime(ts))


def _ms(value: float | None, fmt: Callable[[float | None], str]) -> str:
    return fmt(value / 1000.0) if value is not None else "-"


def journal_export(state_dir: str | None, socket: str | None, fmt: str, since: str | None, until: str | None,
                   provider: str | None, profile: str | None, output: str | None, as_json: bool, *,
                   instance: str | None = None, local: bool = False, key: str | None = None) -> int:
    def work() -> int:
        from coderouterd.state import export_rows

        if fmt not in ("jsonl", "csv"):
            raise CorectlError(f"--format must be jsonl or csv, not {fmt!r}", code=2)
        since_ts = _parse_or_fail(since, "--since") if since else None
        until_ts = _parse_or_fail(until, "--until") if until else None
        sdir = _state_dir_or_fail(state_dir, socket)
        journal = journal_for(sdir, socket, local=local, instance=instance)
        _check_filters(sdir, socket, provider, profile, journal)
        rows = journal.rows(since=since_ts, until=until_ts, provider=provider, profile=profile, key=key)
        text = export_rows(rows, fmt)
        if output is None or output == "-":
            sys.stdout.write(text)
            return 0
        path = Path(output).expanduser()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise CorectlError(f"cannot write {path}: {e.strerror or e}", code=1) from None
        if as_json:
            emit_json({"ok": True, "path": str(path), "format": fmt, "rows": len(rows)})
        else:
            sys.stderr.write(f"Wrote {len(rows)} journal rows to {path} ({fmt}).\n")
        return 0

    return run_reading(as_json, work)


# -- replay compare -------------------------------------------------------------------------------------------

RATE_METRICS = frozenset({"error_rate", "fallback_rate", "cache_hit_ratio", "streaming_ratio"})
LOWER_IS_BETTER = frozenset({"p50_latency_ms", "p95_latency_ms", "p50_ttfb_ms", "p95_ttfb_ms", "error_rate",
                             "fallback_rate", "avg_cost_usd", "total_cost_usd"})
HIGHER_IS_BETTER = frozenset({"cache_hit_ratio"})
LABELS = {
    "requests": "requests", "avg_input_tokens": "avg input tokens", "avg_output_tokens": "avg output tokens",
    "p50_latency_ms": "p50 latency", "p95_latency_ms": "p95 latency", "p50_ttfb_ms": "p50 TTFB",
    "p95_ttfb_ms": "p95 TTFB", "error_rate": "error rate", "fallback_rate": "fallback rate",
    "avg_cost_usd": "avg cost", "total_cost_usd": "total cost", "cache_hit_ratio": "cache hit ratio",
    "streaming_ratio": "streaming ratio",
}


def compare_sides(state_dir: Path | JournalReader, a: str, b: str, *, by: str, window: bool, since: float | None,
                  until: float | None, profile: str | None, provider: str | None,
                  now: float | None = None) -> dict:
    """The compare() result for the two sides, plus what was selected (for --json and the title)."""
    from coderouterd.state import compare

    journal = local_journal(state_dir) if isinstance(state_dir, Path) else state_dir

    if window:
        ranges = []
        for side in (a, b):
            try:
                ranges.append(parse_window(side, now))
            except ValueError as e:
                raise CorectlError(str(e), code=2) from None
        rows = [journal.rows(since=s, until=u, provider=provider, profile=profile) for s, u in ranges]
        selection = {"mode": "window", "provider": provider, "profile": profile,
                     "windows": {a: _span(*ranges[0]), b: _span(*ranges[1])}}
    else:
        key = "provider" if by == "provider" else "profile"
        filters = {"profile": profile} if key == "provider" else {"provider": provider}
        rows = [journal.rows(since=since, until=until, provider=side if key == "provider" else provider,
                             profile=side if key == "profile" else profile) for side in (a, b)]
        selection = {"mode": key, "since": _iso(since), "until": _iso(until), **filters}
    out = compare(rows[0], rows[1], label_a=a, label_b=b)
    out["selection"] = selection
    return out


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts is not None else None


def _span(since: float, until: float) -> dict:
    return {"since": _iso(since), "until": _iso(until)}


def metric_value(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric in RATE_METRICS:
        return f"{value * 100:.1f}%"
    if metric.endswith("_ms"):
        return f"{value:,.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"
    if metric == "avg_cost_usd":
        return f"${value:.4f}" if value else "$0"
    if metric == "total_cost_usd":
        return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"
    if metric == "requests":
        return f"{value:,}"
    return f"{value:,.0f}"


def metric_delta(metric: str, rel: float | None, absolute: float | None) -> tuple[str, str]:
    """(text, style) of B against A: percentage points for rates, relative percent for the rest."""
    if metric in RATE_METRICS:
        if absolute is None:
            return "-", ""
        change = absolute * 100
        text = f"{change:+.1f} pp"
    else:
        if rel is None:
            return ("new" if absolute else "-"), ""
        change = rel
        text = f"{rel:+.0f}%"
    if abs(change) < 0.05:
        return text, "dim"
    better = change < 0 if metric in LOWER_IS_BETTER else change > 0 if metric in HIGHER_IS_BETTER else None
    return text, "" if better is None else ("green" if better else "red")


def compare_table(result: dict) -> Table:
    from rich.table import Table
    from rich.text import Text

    a, b = result["label_a"], result["label_b"]
    t = Table(title=f"Replay comparison: {a} vs {b}", title_justify="left", title_style="bold")
    t.add_column("Metric", style="bold", no_wrap=True)
    t.add_column(f"A: {a}", justify="right", no_wrap=True)
    t.add_column(f"B: {b}", justify="right", no_wrap=True)
    t.add_column("Δ B vs A", justify="right", no_wrap=True)
    for m in result["metrics"]:
        text, style = metric_delta(m, result["delta"].get(m), result["delta_abs"].get(m))
        t.add_row(LABELS.get(m, m), metric_value(m, result["a"][m]), metric_value(m, result["b"][m]),
                  Text(text, style=style))
    return t


def replay_compare(state_dir: str | None, socket: str | None, a: str, b: str, *, by: str, window: bool,
                   since: str | None, until: str | None, profile: str | None, provider: str | None,
                   as_json: bool, instance: str | None = None, local: bool = False) -> int:
    def work() -> int:
        from rich.text import Text

        if by not in ("auto", "provider", "profile"):
            raise CorectlError(f"--by must be provider or profile, not {by!r}", code=2)
        if window and (since or until):
            raise CorectlError("--since/--until do not apply with --window: the windows are the time ranges",
                               code=2)
        since_ts = _parse_or_fail(since, "--since") if since else None
        until_ts = _parse_or_fail(until, "--until") if until else None
        sdir = _state_dir_or_fail(state_dir, socket)
        journal = journal_for(sdir, socket, local=local, instance=instance)
        known = known_names(sdir, socket, journal)
        kind = by
        if kind == "auto":
            # What A and B name, when the names say it: profiles when both are profiles and not both providers.
            both = {k for k in ("provider", "profile") if {a, b} <= (known.get(k) or set())}
            kind = "profile" if both == {"profile"} else "provider"
        if not window:
            check_names(known, kind, a, b)
        check_names(known, "provider", provider)
        check_names(known, "profile", profile)
        result = compare_sides(journal, a, b, by=kind, window=window, since=since_ts, until=until_ts,
                               profile=profile, provider=provider)
        if as_json:
            emit_json(result)
            return 0
        out = _console()
        from .safe import clean_tree

        out.print(compare_table(clean_tree(result)))
        if result["small_sample"]:
            out.print(Text(f"small sample: {result['a']['requests']} vs {result['b']['requests']} requests; "
                           "treat the figures as a hint", style="yellow"))
        out.print(Text(result["verdict"], style="bold"))
        return 0

    return run_reading(as_json, work)
