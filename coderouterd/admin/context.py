"""What every handler of the table (handlers.py) is handed and may answer with, kept apart from errors.py (which
needs FastAPI) so the dashboard, which serves the same handlers without FastAPI, uses them too: the call's
context, a refusal, and an answer that is not a 200."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only


class AdminError(Exception):
    """An answer for the client: HTTP status, message and extra JSON fields."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


@dataclass(frozen=True, slots=True)
class Ctx:
    """What a handler is handed: the daemon, and the admin socket's path (None on the dashboard)."""

    daemon: Daemon
    admin_socket: Path | None = None


class Status(NamedTuple):
    """An answer that is not a 200 but still in its model's shape (a refused reload: 422 with the reasons)."""

    body: dict[str, Any]
    status: int
