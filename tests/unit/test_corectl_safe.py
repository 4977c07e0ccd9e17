"""Issue 41, N11: what corectl prints of a request never reaches the terminal as an escape sequence or as Rich
markup (corectl/safe.py and render.SafeConsole), in every view rendered from a request; --json stays exact."""

from __future__ import annotations

import io
import re
import time

import orjson
import pytest

from corectl import commands, explain, history, render, top
from corectl.render import SafeConsole
from corectl.safe import clean, clean_tree

# Clears the screen, plants an OSC 8 hyperlink (ESC- and BEL-terminated), a one-byte CSI (C1), a bidi override,
# Rich markup and an emoji code, and a newline that would forge a row.
EVIL = ("m\x1b[2J\x1b[H\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x07\x9b31m\u202e[link=https://evil.example]"
        "x[/link] :warning: [bold]b\nforged row\r\x7f\x00")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the console's own colours: the only escapes allowed out
FORBIDDEN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _shown(draw) -> str:
    """What a colour terminal receives, with the console's own colour codes taken out."""
    buf = io.StringIO()
    con = SafeConsole(file=buf, width=400, force_terminal=True, color_system="truecolor")
    draw(con)
    return SGR.sub("", buf.getvalue())


def _assert_neutral(out: str) -> None:
    assert not FORBIDDEN.search(out), repr(FORBIDDEN.search(out))
    assert "\x1b" not in out and "forged row\n" not in out
    assert "[link=https://evil.example]" in out and ":warning:" in out  # printed as written, not interpreted


# -- the functions ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x202E, 0x2066])
def test_every_control_character_becomes_a_visible_escape(code):
    got = clean(f"a{chr(code)}b")
    assert got == (f"a\\x{code:02x}b" if code < 0x100 else f"a\\u{code:04x}b")


def test_printable_text_is_unchanged_and_cleaning_is_idempotent():
    for text in ("claude-sonnet-4", "modèle/qwen3:30b", "日本語 🚀", "back\\slash [x] 100%"):
        assert clean(text) == text
    assert clean(clean(EVIL)) == clean(EVIL)


def test_newlines_are_kept_only_when_asked():
    assert clean("a\nb") == "a\\x0ab"
    assert clean("a\nb\x1b", newlines=True) == "a\nb\\x1b"


def test_clean_tree_reaches_keys_and_nested_values():
    assert clean_tree({"k\x1b": [{"m": "x\x07"}, 3, None, ("t\x9b",)]}) == {"k\\x1b": [{"m": "x\\x07"}, 3, None,
                                                                                         ["t\\x9b"]]}


def test_the_console_interprets_no_markup_and_escapes_what_a_view_left():
    from rich.text import Text

    out = _shown(lambda c: (c.print("[bold]x[/bold] :smile: \x1b[2J"), c.print(Text("\x1b]8;;u\x1b\\"))))
    assert "[bold]x[/bold] :smile: \\x1b[2J" in out and "\\x1b]8;;u\\x1b\\" in out and "\x1b" not in out


# -- the views of a request ------------------------------------------------------------------------------------

def _trace() -> dict:
    return {"request_id": "req_1", "ts": time.time(), "ingress": "openai", "model_requested": EVIL,
            "model_used": EVIL + "2", "profile": "default", "status": 502, "error_class": EVIL,
            "served_by": None, "latency_ms": 12.0, "candidates": ["a"], "effective_order": ["a"],
            "skips": [{"provider": "b", "reason": "budget", "message": EVIL}],
            "attempts": [{"provider": "a", "outcome": "failed", "reason": "http_404", "status": 404,
                          "message": f"model {EVIL!r} not found", "ms": 3.0}],
            "order_notes": [{"provider": "a", "why": EVIL}], "guards": [{"guard": "loop", "action": "warn",
                                                                          "message": EVIL}]}


def test_explain_shows_the_model_and_errors_neutralised():
    out = _shown(lambda c: explain.render(_trace(), "memory", c))
    _assert_neutral(out)
    assert "m\\x1b[2J\\x1b[H\\x1b]8;;https://evil.example" in out


def test_journal_shows_rows_neutralised():
    rows = [{"ts": time.time(), "request_id": "id\x1b[2J", "profile": EVIL, "provider": EVIL, "status": 502,
             "attempts": [{"provider": EVIL, "outcome": "failed", "reason": EVIL}], "instance": EVIL}]
    _assert_neutral(_shown(lambda c: c.print(history.journal_table(rows, c.width, shared=True))))


def test_top_shows_recent_requests_and_its_error_neutralised():
    status = {"version": "1", "uptime_s": 5, "active_profile": "default", "stats_window_s": 60,
              "providers": [{"name": "a", "breaker": {"state": "closed"}, "health": "HEALTHY", "figures": {}}],
              "profiles": [{"name": "default", "active": True, "effective_order": ["a"],
                            "skips": [{"provider": EVIL}]}]}
    traces = [{**_trace(), "ts": time.time()}]
    data = top.compute(status, traces, time.time())
    data["recent"][0]["request_id"] = EVIL
    _assert_neutral(_shown(lambda c: c.print(top.view(data, EVIL, width=c.width))))
    _assert_neutral(_shown(lambda c: c.print(top.view(data, EVIL, width=100, height=24))))


def test_status_shows_provider_text_neutralised_and_keeps_its_own_lines():
    from tests.unit.test_corectl_widths import STATUS

    data = orjson.loads(orjson.dumps(STATUS))
    data["providers"][0]["availability"] = {"available": False, "code": "breaker_open", "why": EVIL}
    data["providers"][0]["key_problem"] = EVIL
    data["profiles"][0]["skips"] = [{"provider": EVIL, "reason": EVIL}]
    data["last_reload_error"] = "config.toml: invalid configuration:\nserver.port: bad"
    out = _shown(lambda c: render.status(data, c))
    _assert_neutral(out)
    assert re.search(r"invalid configuration: *\n +server\.port: bad", out)  # our own message keeps its lines


def test_audit_lines_are_neutralised():
    line = history.audit_line({"ts": "2026-01-01T00:00:00Z", "kind": "refused", "model": EVIL})
    assert not FORBIDDEN.search(line) and "\n" not in line


def test_echo_and_error_lines_are_neutralised_but_json_is_exact(capsys):
    commands.echo(f"Reloaded {EVIL}")
    commands.report_error(f"bad {EVIL}\nsecond line", False)
    out, err = capsys.readouterr()
    assert not FORBIDDEN.search(out) and not FORBIDDEN.search(err.replace("\n", ""))
    # Messages of our own keep their line breaks (a config error spans lines), whatever they quote.
    assert err.count("\n") == 3
    commands.report_error(EVIL, True)
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["error"] == EVIL  # --json: the encoder escapes, the value is exact
