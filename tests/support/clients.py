"""The real coding-agent CLIs the tests drive (pinned in tests/clients/package-lock.json, installed by `make test`):
where each is, and whether a test may skip it. A CLI is skipped only when npm could not reach its registry (the
Makefile leaves the reason in tests/clients/.npm-unavailable); missing otherwise, the setup is broken and the
test fails."""

from __future__ import annotations

from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
UNAVAILABLE = CLIENTS / ".npm-unavailable"


def cli(name: str) -> Path:
    """An installed CLI's launcher (node_modules/.bin/NAME)."""
    return CLIENTS / "node_modules" / ".bin" / name


def skip_reason(binary: Path, label: str) -> str | None:
    """None when `binary` is installed; the reason to skip when npm was unreachable; else the test fails."""
    if binary.exists():
        return None
    if UNAVAILABLE.exists():
        return f"{label} not installed, npm was unreachable: {UNAVAILABLE.read_text().strip()[:300]}"
    pytest.fail(f"{label} missing at {binary}: run `make test` (it runs `npm ci` in tests/clients)")
    return None
