"""`corectl explain REQUEST_ID`: why a request went where it went.

The daemon keeps the full decision trace of its recent requests in memory (GET /v1/requests/{id}); older ones,
or any after a daemon restart, come from the journal, which records the route but not the planning notes."""

from __future__ import annotations

from coderouterd.observe.traces import trace_from_row

from .api import DaemonAPI
from .client import CorectlError, DaemonNotRunning
from .commands import emit_json, run


def find_trace(socket: str | None, request_id: str, state_dir: str | None) -> tuple[dict, str]:
    """(trace, source) where source is "memory" or "journal". Raises CorectlError when neither has it."""
    down: DaemonNotRunning | None = None
    try:
        with DaemonAPI(socket) as api:
            trace = api.request(request_id)
        if trace is not None:
            return trace.model_dump(exclude_unset=True), "memory"
    except DaemonNotRunning as e:
        down = e
    from .history import journal_for, resolve_state_dir

    sdir, how = resolve_state_dir(state_dir, socket)
    journal = journal_for(sdir, socket)  # the shared journal when there is one: any instance's request
    from coderouterd.state.journal_reader import JournalUnreadable

    try:
        row = journal.row(request_id)
    except JournalUnreadable as e:
        raise CorectlError(str(e), code=1) from None
    if row is not None:
        return trace_from_row(row), "journal"
    if down is not None:
        raise CorectlError(f"request {request_id!r} is not in the journal at {journal.where} (from {how}), and "
                           f"{down}", code=3, payload=down.payload)
    raise CorectlError(f"request {request_id!r} is unknown: coderouterd no longer holds it in memory and the "
                       f"journal at {journal.where} (from {how}) has no row for it", code=1,
                       payload={"request_id": request_id})


def explain(socket: str | None, request_id: str, state_dir: str | None, as_json: bool) -> int:
    def work() -> None:
        trace, source = find_trace(socket, request_id, state_dir)
        if as_json:
            emit_json({"source": source, "trace": trace})
            return
        from .render import console

        render(trace, source, console())

    return run(as_json, work)


def _ms(value) -> str:
    from .render import latency

    return latency(value / 1000.0) if value is not None else "-"


def affinity_rows(aff: dict | None) -> list:
    """Prefix affinity's part of a trace: lane, slot, predicted vs reported cached tokens, a cache bust."""
    from rich.text import Text

    if not aff:
        return []
    slot = aff.get("slot")
    where = f"lane {aff.get('lane')}, session {aff.get('session')}" + (f", slot {slot}" if slot is not None else "")
    if aff.get("placement"):
        where += f" ({aff['placement']})"
    if aff.get("lane_choice"):
        where += f"; lane: {aff['lane_choice']}"
    pred, got = aff.get("predicted_tokens"), aff.get("cached_tokens")
    rows: list[tuple[str, str | Text]] = [("affinity", where),
            ("prefix", f"predicted {pred:,} cached tokens, backend reported " +
             (f"{got:,}" if got is not None else "nothing") if pred is not None else "not predicted")]
    restore = aff.get("slot_restore")
    if isinstance(restore, dict) and restore.get("outcome"):
        rows.append(("slot restore", restore_text(restore)))
    bust = aff.get("cache_bust")
    if bust:
        detail = bust["segment"]
        if bust.get("expected_tokens") is not None:
            detail += (f": reused {bust['cached_tokens']:,} of the {bust['expected_tokens']:,} tokens the "
                       f"previous turn left cached")
        rows.append(("cache bust", Text(detail, style="bold red")))
    return rows


def restore_text(r: dict):
    """A saved slot state restored for the turn: taken (proven by the cached tokens), refused before the server
    saw the file, failed by the server, or accepted and not taken (kvcache/cache.py)."""
    from rich.text import Text

    outcome = r.get("outcome")
    if outcome == "taken":
        return Text(f"taken: {r.get('cached_tokens') or 0:,} of {r.get('expected_tokens') or 0:,} tokens came back "
                    "cached", style="green")
    if outcome == "did not take":
        return Text(f"did not take: the server said it restored {r.get('tokens') or 0:,} tokens, the answer reused "
                    f"{r.get('cached_tokens') or 0:,}", style="bold red")
    if outcome in ("refused", "failed"):
        return Text(f"{outcome}: {r.get('problem')}", style="bold red")
    return Text(str(outcome), style="dim")


def guard_line(g: dict) -> str:
    """A guard that fired on the request, as one line: a tool loop stopped (break), warned or injected; a
    profile's default output limit set."""
    actions = {"break": "stopped the request", "warn": "warned", "inject": "told the model", "default": "set"}
    what = actions.get(g.get("action") or "", g.get("action") or "?")
    line = f"{g.get('guard', '?').replace('_', ' ')} {what}"
    return line + (f": {g['message']}" if g.get("message") else "")


def render(trace: dict, source: str, out) -> None:
    from rich.table import Table
    from rich.text import Text

    from .history import local_time
    from .render import _kv, fit_table, money
    from .safe import clean_tree

    trace = clean_tree(trace)  # the model, upstream error text, notes: a client's text, never a terminal's
    title = Text.assemble(("Request ", "bold"), (trace["request_id"], "bold cyan"))
    title.append("  (from coderouterd's memory)" if source == "memory" else
                 "  (from the journal: planning notes are not recorded there)", style="dim")
    out.print(title)
    status = trace.get("status") or 0
    served = trace.get("served_by")
    result = Text(str(status), style="bold red" if status >= 400 or not status else "bold green")
    result.append(f"  served by {served}" if served else "  no provider served it",
                  style="" if served else "red")
    result.append(f" in {_ms(trace.get('latency_ms'))} (first byte {_ms(trace.get('ttfb_ms'))})")
    if trace.get("error_class"):
        result.append(f"  error: {trace['error_class']}", style="red")
    model = trace.get("model_requested") or "-"
    if trace.get("model_used") and trace.get("model_used") != trace.get("model_requested"):
        model += f" -> {trace['model_used']}"
    u = trace.get("usage") or {}
    tokens = (f"in {u.get('input_tokens') or 0:,}, out {u.get('output_tokens') or 0:,}, cache read "
              f"{u.get('cache_read_input_tokens') or 0:,}, cache write {u.get('cache_creation_input_tokens') or 0:,}; "
              f"cost {money(trace.get('cost_usd'))}"
              + ("  (estimated: the stream was cut before the upstream reported its usage)"
                 if trace.get("usage_estimated") else ""))
    profile = (trace.get("profile") or "-") + (f" ({trace['mode']})" if trace.get("mode") else "")
    rows: list[tuple[str, str | Text]] = [
        ("time", local_time(trace["ts"]) if trace.get("ts") else "-"),
        ("ingress", f"{trace.get('ingress') or '-'}{' (streaming)' if trace.get('stream') else ''}"),
        ("key", trace.get("key") or "- (no team key)"),
        ("model", model),
        ("profile", profile),
    ]
    if trace.get("candidates") is not None:
        rows.append(("chain", " > ".join(trace["candidates"]) or "-"))
    if trace.get("effective_order") is not None:
        rows.append(("order", Text(" > ".join(trace["effective_order"]) or "none available",
                                   style="" if trace["effective_order"] else "bold red")))
    for note in trace.get("order_notes") or []:
        moved = f" (moved {note['moved']})" if note.get("moved") not in (None, "none") else ""
        rows.append(("note", f"{note.get('provider', '?')}: {note.get('why', '')}{moved}"))
    for text in trace.get("notes") or []:  # what the ingress's translation left out (hosted tools, ...)
        rows.append(("note", str(text)))
    rows.append(("result", result))
    for g in trace.get("guards") or []:
        rows.append(("guard", Text(guard_line(g), style="bold red" if g.get("action") == "break" else "yellow")))
    if trace.get("race_outcome"):
        rows.append(("race", trace["race_outcome"]))
    repair = trace.get("tool_repair") or {}
    if repair.get("repaired"):
        rows.append(("tool repair", f"{repair['repaired']} tool call(s) written as text "
                                    f"({', '.join(sorted(set(repair.get('formats') or [])))}) turned into real calls"))
    rows.append(("tokens", tokens))
    rows.extend(affinity_rows(trace.get("affinity")))
    if trace.get("dashboard_url"):
        rows.append(("dashboard", trace["dashboard_url"]))
    out.print(_kv(rows))
    skips = trace.get("skips") or []
    if skips:
        t = Table(title="Skipped", title_justify="left", title_style="bold")
        t.add_column("Provider", style="bold", no_wrap=True)
        t.add_column("Reason", no_wrap=True, style="yellow")
        t.add_column("Why", overflow="fold")
        for s in skips:
            t.add_row(s["provider"], s.get("reason") or "", s.get("message") or "")
        out.print(t)
    attempts = trace.get("attempts") or []
    right = {"justify": "right", "no_wrap": True}
    columns = [("#", right, 0), ("Provider", {"style": "bold", "no_wrap": True}, 0), ("Outcome", {"no_wrap": True}, 0),
               ("Reason", {"no_wrap": True}, 0), ("HTTP", right, 2), ("Time", right, 1),
               ("Detail", {"overflow": "fold"}, 3)]
    cells = []
    for i, a in enumerate(attempts, 1):
        ok = a.get("outcome") == "ok"
        winner = ok and a.get("provider") == served
        cells.append([str(i), Text(a.get("provider") or "?", style="bold green" if winner else ""),
                     Text((a.get("outcome") or "?") + (" (panic)" if a.get("panic") else ""),
                          style="green" if ok else "red"),
                     "" if ok else (a.get("reason") or ""), str(a["status"]) if a.get("status") else "-",
                     _ms(a.get("ms")), a.get("message") or ""])
    if attempts:
        out.print(fit_table(out.width, columns, cells, title="Attempts", title_justify="left", title_style="bold"))
    else:
        out.print(Text("No provider was attempted.", style="red"))
