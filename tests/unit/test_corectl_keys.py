"""`corectl keys`: options to settings (only what is given; 'none' clears), usage errors, and rendering that never
lets a key's note or scope act on the terminal."""

from __future__ import annotations

import pytest
from rich.console import Console

from corectl.client import CorectlError
from corectl.keys import detail, keys_table, settings_from
from corectl.keys_render import clean, status_line


def test_settings_from_options():
    assert settings_from() == {}
    assert settings_from(monthly_usd="12.5", rpm="30", profiles="coding, fast", models="qwen*", expires="2027-01-01",
                         note="n") == {"monthly_usd": 12.5, "rpm": 30, "profiles": ["coding", "fast"],
                                       "models": ["qwen*"], "expires": "2027-01-01", "note": "n"}
    assert settings_from(rpm="none", profiles="none", expires="never", monthly_usd="off") == {
        "rpm": None, "profiles": None, "expires": None, "monthly_usd": None}
    with pytest.raises(CorectlError) as e:
        settings_from(rpm="lots")
    assert e.value.code == 2 and "--rpm" in str(e.value)
    with pytest.raises(CorectlError):
        settings_from(monthly_usd="nan")
    for empty in ("", ",", " , "):  # a typo never widens a key's scope to "anything"
        with pytest.raises(CorectlError) as e:
            settings_from(models=empty)
        assert e.value.code == 2 and "--models" in str(e.value)


def test_control_characters_are_shown_not_obeyed():
    assert clean("alice") == "alice"
    assert clean("x\x1b[2J\x07y\u202e") == "x\\x1b[2J\\x07y\\u202e"
    assert clean("a\nb") == "a\\x0ab"
    rec = {"name": "bob", "prefix": "crk_abcd", "state": "active", "scope": "models q\x1b]8;;http://x\x07*",
           "note": "\x1b[31mred", "monthly_usd": 5.0, "rpm": None, "tpm": None, "concurrency": 2,
           "expires_at": None, "created_at": 0.0, "last_used": None}
    out = Console(width=200, record=True, force_terminal=True, color_system=None)
    out.print(keys_table([rec]))
    out.print(detail(rec))
    text = out.export_text()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[31mred" in text and "$5.00/month, 2 at once" in text


def test_status_line_says_whether_keys_are_required():
    out = Console(width=300, record=True)
    out.print(status_line({"required": True, "team_keys_required": True, "operator_keys": 1,
                           "counts": {"active": 2, "expired": 1, "revoked": 0}, "refused": 3,
                           "remote_access": "other machines cannot connect"}))
    out.print(status_line({"required": False, "team_keys_required": False, "operator_keys": 0,
                           "counts": {"active": 0, "expired": 0, "revoked": 0}}))
    text = out.export_text()
    assert "required on every request (2 team key(s) active, 1 expired, 0 revoked; 1 operator key(s))" in text
    assert "3 requests refused" in text and "other machines cannot connect" in text
    assert "not required: loopback is open" in text
