"""`corectl usage --by key`: who spent what this month (or --month YYYY-MM), one entry per team key, summed from
the journal (this machine's, or the shared one with `[state] backend = "postgres"`). Works with the daemon
stopped, like `corectl journal`: it reads the state, never the daemon."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .client import CorectlError
from .commands import emit_json
from .history import _state_dir_or_fail, journal_for, local_time, run_reading

if TYPE_CHECKING:
    from rich.table import Table

BY = ("key",)


def usage(state_dir: str | None, socket: str | None, by: str, month: str | None, as_json: bool, *,
          instance: str | None = None, local: bool = False, now: float | None = None) -> int:
    def work() -> int:
        from coderouterd.state.usage import month_window, usage_by_key

        if by not in BY:
            raise CorectlError(f"--by must be {' or '.join(BY)}, not {by!r}", code=2)
        try:
            month_window(month)
        except ValueError as e:
            raise CorectlError(f"--month: {e}", code=2) from None
        sdir = _state_dir_or_fail(state_dir, socket)
        journal = journal_for(sdir, socket, local=local, instance=instance)
        out = usage_by_key(journal, month, now=now, keys=key_names(socket))
        if as_json:
            emit_json({"by": by, "journal": journal.where, **out})
            return 0
        if not out["keys"] and out["no_key"] is None:
            sys.stderr.write(f"corectl: no requests in {out['month']} in the journal at {journal.where}\n")
            return 0
        from .render import console

        con = console()
        con.print(usage_table(out, con.width))
        return 0

    return run_reading(as_json, work)


def key_names(socket: str | None) -> list[str]:
    """Every key the running daemon knows (those never used too: one entry per key); none when it is not running
    (the journal still names every key that made a request)."""
    from .api import DaemonAPI

    try:
        with DaemonAPI(socket, timeout=3.0) as api:
            return [k.name for k in api.keys().keys]
    except CorectlError:
        return []


def usage_table(out: dict[str, Any], width: int = 10_000) -> Table:
    from rich.text import Text

    from .render import fit_table, money

    right = {"justify": "right", "no_wrap": True}
    columns = [("Key", {"no_wrap": True, "style": "bold"}, 0), ("Requests", right, 0), ("Input", right, 3),
               ("Output", right, 3), ("Cached", right, 4), ("Spend", right, 0), ("Refusals", {}, 1),
               ("Last used", {"no_wrap": True}, 2)]
    cells = []
    entries = list(out["keys"]) + ([out["no_key"]] if out.get("no_key") else [])
    for e in entries:
        refusals = ", ".join(f"{reason} {n}" for reason, n in e["refusals"].items())
        cells.append([e["name"] if e["name"] != "-" else Text("(no team key)", style="dim"), f"{e['requests']:,}",
                      f"{e['input_tokens']:,}", f"{e['output_tokens']:,}", f"{e['cached_tokens']:,}",
                      money(e["spend_usd"]), Text(refusals or "-", style="red" if refusals else "dim"),
                      local_time(e["last_used_ts"]) if e["last_used_ts"] is not None else "never"])
    return fit_table(width, columns, cells, title=f"Usage by key, {out['month']} (UTC)", title_justify="left",
                     title_style="bold")
