"""`corectl keys ...`: team keys (create, list, show, update, rotate, revoke). Each function returns the exit status,
like commands.py; the Typer definitions are in app.py.

Everything rendered from a key (its name, note, scope) goes through `clean`: a note or a glob holding escape
sequences must not reach the admin's terminal as such."""

from __future__ import annotations

import time
from typing import Any

from .api import DaemonAPI
from .client import CorectlError
from .commands import echo, emit_json, with_api
from .keys_render import clean

# Option values that clear a setting in `update` (and mean "none" in `create`).
_CLEAR = ("none", "off", "-")


def _number(option: str, text: str, kind: type) -> float | int | None:
    t = text.strip()
    if t.lower() in _CLEAR:
        return None
    try:
        value = kind(t)
    except ValueError:
        raise CorectlError(f"{option}: {text!r} is not a{'n integer' if kind is int else ' number'} "
                           f"(or 'none' to remove the limit)", code=2) from None
    if kind is float and value != value:  # NaN
        raise CorectlError(f"{option}: not a number", code=2)
    return value


def _list(option: str, text: str) -> list[str] | None:
    """A comma list; 'none' (or another clearing word) lifts the scope. A value that names nothing ("", ",") is
    refused rather than read as "anything": a typo must not widen a key's scope."""
    if text.strip().lower() in _CLEAR:
        return None
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise CorectlError(f"{option}: names nothing; give a comma list, or 'none' to allow anything", code=2)
    return items


def settings_from(monthly_usd: str | None = None, rpm: str | None = None, tpm: str | None = None,
                  concurrency: str | None = None, profiles: str | None = None, models: str | None = None,
                  expires: str | None = None, note: str | None = None) -> dict[str, Any]:
    """The admin API's settings from corectl's options: only those given; 'none' clears one."""
    out: dict[str, Any] = {}
    if monthly_usd is not None:
        out["monthly_usd"] = _number("--monthly-usd", monthly_usd, float)
    for option, value, name in (("--rpm", rpm, "rpm"), ("--tpm", tpm, "tpm"),
                                ("--concurrency", concurrency, "concurrency")):
        if value is not None:
            out[name] = _number(option, value, int)
    if profiles is not None:
        out["profiles"] = _list("--profiles", profiles)
    if models is not None:
        out["models"] = _list("--models", models)
    if expires is not None:
        out["expires"] = None if expires.strip().lower() in ("never", *_CLEAR) else expires.strip()
    if note is not None:
        out["note"] = note
    return out


def _validated(call):
    from pydantic import ValidationError

    try:
        return call()
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise CorectlError(f"{where.replace('_', '-')}: {first['msg']}", code=2) from None


def run_settings(as_json: bool, parse, then) -> int:
    """Parse the options (a bad value is a usage error, exit 2), then run the command with them."""
    from .commands import report_error

    try:
        settings = parse()
    except CorectlError as e:
        report_error(str(e), as_json)
        return e.code
    return then(settings)


# -- commands ---------------------------------------------------------------------------------------------------

def create(socket: str | None, name: str, settings: dict[str, Any], as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = _validated(lambda: api.key_create(name, settings))
        if as_json:
            emit_json(data)
            return
        rec = data.record.model_dump()
        echo(f"Created key {clean(rec['name'])} ({clean(rec['prefix'])}…). Its secret, shown this once:")
        echo("")
        echo(f"  {data.key}")
        echo("")
        echo(f"{summary(rec)}")
        echo("Give it to its user as ANTHROPIC_API_KEY / OPENAI_API_KEY; `corectl keys rotate` replaces it.")

    return with_api(socket, as_json, work)


def listing(socket: str | None, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.keys()
        if as_json:
            emit_json(data)
            return
        from .render import console

        out = console()
        items = [k.model_dump() for k in data.keys]
        if not items:
            echo("No team keys. Loopback is open (unless [server] api_keys are set); "
                 "`corectl keys create NAME` makes the first.")
            return
        out.print(keys_table(items, out.width))
        c = data.counts
        out.print(f"{c.get('active', 0)} active, {c.get('expired', 0)} expired, {c.get('revoked', 0)} revoked; "
                  + ("every request needs a key." if data.required else "no key is required (all revoked)."))

    return with_api(socket, as_json, work)


def show(socket: str | None, name: str, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.key(name)
        if as_json:
            emit_json(data)
            return
        from .render import console

        console().print(detail(data.record.model_dump()))

    return with_api(socket, as_json, work)


def update(socket: str | None, name: str, settings: dict[str, Any], as_json: bool) -> int:
    if not settings:
        from .commands import report_error

        report_error("nothing to update: give at least one option (see corectl keys update --help)", as_json)
        return 2

    def work(api: DaemonAPI) -> None:
        data = _validated(lambda: api.key_update(name, settings))
        if as_json:
            emit_json(data)
            return
        rec = data.record.model_dump()
        echo(f"Updated key {clean(rec['name'])}. {summary(rec)}")

    return with_api(socket, as_json, work)


def rotate(socket: str | None, name: str, grace_s: float, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = _validated(lambda: api.key_rotate(name, grace_s))
        if as_json:
            emit_json(data)
            return
        rec = data.record.model_dump()
        echo(f"Rotated key {clean(rec['name'])}: its new secret, shown this once:")
        echo("")
        echo(f"  {data.key}")
        echo("")
        until = rec.get("previous_secret_until")
        echo(f"The old secret works until {_when(until)}." if until else "The old secret no longer works.")

    return with_api(socket, as_json, work)


def revoke(socket: str | None, name: str, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.key_revoke(name)
        if as_json:
            emit_json(data)
            return
        rec = data.record.model_dump()
        echo(f"Revoked key {clean(rec['name'])} ({clean(rec['prefix'])}…): it is refused from now on, on every "
             "instance.")

    return with_api(socket, as_json, work)


def delete(socket: str | None, name: str, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.key_delete(name)
        if as_json:
            emit_json(data)
            return
        echo(f"Deleted key {clean(name)}." + ("" if data.required else
                                              " No key is left: requests need no key again (loopback is open)."))

    return with_api(socket, as_json, work)


# -- rendering ----------------------------------------------------------------------------------------------------

def _when(ts: float | None) -> str:
    if ts is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "never"
    from .render import duration

    return duration(max((now or time.time()) - ts, 0.0)) + " ago"


def limits_words(rec: dict[str, Any]) -> str:
    parts = []
    if rec.get("monthly_usd") is not None:
        parts.append(f"${rec['monthly_usd']:,.2f}/month")
    for name in ("rpm", "tpm", "concurrency"):
        if rec.get(name) is not None:
            parts.append(f"{rec[name]:,} {name if name != 'concurrency' else 'at once'}")
    return ", ".join(parts) or "no limits of its own"


def summary(rec: dict[str, Any]) -> str:
    return (f"Limits: {limits_words(rec)}; scope: {clean(rec.get('scope') or 'anything')}; "
            f"expires: {_when(rec.get('expires_at'))}.")


def keys_table(items: list[dict[str, Any]], width: int = 10_000):
    from rich.text import Text

    from .render import fit_table

    styles = {"active": "green", "expired": "yellow", "revoked": "dim"}
    columns = [("Name", {"no_wrap": True, "style": "bold"}, 0), ("Prefix", {"no_wrap": True}, 3),
               ("State", {"no_wrap": True}, 0), ("Limits", {}, 0), ("Scope", {}, 2),
               ("Expires", {"no_wrap": True}, 1), ("Last used", {"no_wrap": True}, 1), ("Note", {}, 4)]
    rows = []
    for k in items:
        rows.append([Text(clean(k["name"])), Text(clean(k["prefix"]) + "…"),
                     Text(k["state"], style=styles.get(k["state"], "")), limits_words(k),
                     Text(clean(k.get("scope") or "anything")), _when(k.get("expires_at")), _ago(k.get("last_used")),
                     Text(clean(k.get("note") or ""))])
    return fit_table(width, columns, rows, title="Team keys", title_justify="left", title_style="bold")


def detail(rec: dict[str, Any]):
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rows: list[tuple[str, str | Text]] = [
        ("name", Text(clean(rec["name"]))), ("prefix", Text(clean(rec["prefix"]) + "…")), ("state", rec["state"]),
        ("limits", limits_words(rec)), ("scope", Text(clean(rec.get("scope") or "anything"))),
        ("expires", _when(rec.get("expires_at"))), ("created", _when(rec.get("created_at"))),
        ("last used", _ago(rec.get("last_used")))]
    if rec.get("revoked_at"):
        rows.append(("revoked", _when(rec["revoked_at"])))
    if rec.get("previous_secret_until"):
        rows.append(("old secret", f"works until {_when(rec['previous_secret_until'])}"))
    if rec.get("note"):
        rows.append(("note", Text(clean(rec["note"]))))
    for k, v in rows:
        grid.add_row(k, v)
    return grid

