"""Rendering shared by `corectl keys` and `corectl status`'s keys row; imports Rich only (corectl.render imports
this, so it must not import render back)."""

from __future__ import annotations

from typing import Any

from . import safe


def clean(value: Any) -> str:
    """`value` as text, neutralised as everything corectl renders of a request (corectl/safe.py)."""
    return safe.clean(str(value))


def status_line(k: dict[str, Any]):
    """`corectl status`'s keys row: required or not, how many, and what other machines get."""
    from rich.text import Text

    c = k.get("counts") or {}
    total = sum(c.values())
    if k.get("team_keys_required"):
        text = Text("required on every request", style="bold")
        text.append(f" ({c.get('active', 0)} team key(s) active, {c.get('expired', 0)} expired, "
                    f"{c.get('revoked', 0)} revoked; {k.get('operator_keys', 0)} operator key(s))")
    elif k.get("required"):
        text = Text("required", style="bold")
        text.append(f" ({k.get('operator_keys', 0)} operator keys in [server] api_keys; no team keys)")
    else:
        text = Text("not required: loopback is open", style="yellow")
        text.append(" (no team keys; `corectl keys create NAME` makes one)" if not total else "")
    if k.get("refused"):
        text.append(f"\n{k['refused']} requests refused for their key since start", style="dim")
    if k.get("remote_access"):
        text.append(f"\n{clean(k['remote_access'])}")
    return text
