"""Every corectl help page: flags show no value type (`--json <bool>` read as if the flag took a value), while
options that take a value keep theirs."""

from __future__ import annotations

import click
import pytest
import typer
from typer.testing import CliRunner

from corectl.app import app


def _paths(cmd, ctx, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if hasattr(cmd, "list_commands"):  # Typer groups are not click.Group subclasses
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                out += _paths(sub, click.Context(sub, parent=ctx, info_name=name), (*prefix, name))
    return out


ROOT = typer.main.get_command(app)
PATHS = _paths(ROOT, click.Context(ROOT, info_name="corectl"))


def test_every_command_is_covered():
    assert ("status",) in PATHS and ("doctor",) in PATHS and ("service", "install") in PATHS and len(PATHS) > 20


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "corectl")
def test_flags_have_no_type_in_help(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output and "BOOLEAN" not in result.output, result.output
    assert "Show this message and exit." in result.output


def test_options_that_take_a_value_still_show_it():
    out = CliRunner().invoke(app, ["top", "--help"], env={"COLUMNS": "120"}).output
    assert "SECONDS" in out
    out = CliRunner().invoke(app, ["journal", "tail", "--help"], env={"COLUMNS": "120"}).output
    assert "<int>" in out or "INTEGER" in out or "N" in out
