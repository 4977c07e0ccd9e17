"""The shared journal as a JournalReader (state/journal_reader.py): every instance's rows in `cr_journal`, each
with the instance it came from, read with the same queries as this machine's SQLite journal.

A blocking psycopg connection per read: corectl has no event loop and reads once, and the daemon reads in a
worker thread. psycopg is imported on the first read, so nothing here costs a SQLite-only install anything."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..journal_reader import Execute, JournalReader


class PostgresJournal(JournalReader):
    """`instance` keeps the rows and trends to one instance's (corectl's --instance); None reads them all."""

    shared = True
    name_columns = ("provider", "profile", "instance")
    _lead = ("instance",)
    _table = "cr_journal"

    def __init__(self, dsn: str, *, where: str | None = None, instance: str | None = None) -> None:
        self.dsn = dsn
        self.where = where if where is not None else "the shared journal"  # never the DSN: it may hold a password
        self.instance = instance

    def _order(self, newest_first: bool) -> str:
        # (instance, seq) is the primary key: rows with one timestamp keep the order each instance wrote them.
        return "ts DESC, instance, seq DESC" if newest_first else "ts, instance, seq"

    def _scope(self) -> list[tuple[str, object]]:
        return [("instance", self.instance)] if self.instance is not None else []

    @contextmanager
    def _session(self) -> Iterator[Execute]:
        import psycopg

        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
        except psycopg.Error as e:
            raise self._unreadable(_first_line(e)) from None

        def execute(sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
            # The queries are written with ? (journal_reader.py) and never hold a literal ? or %.
            try:
                return conn.execute(sql.replace("?", "%s"), tuple(args)).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # no instance has created the schema yet: nothing written, nothing to read
            except psycopg.Error as e:
                raise self._unreadable(_first_line(e)) from None

        try:
            yield execute
        finally:
            conn.close()


def _first_line(e: BaseException) -> str:
    # psycopg's message names the host, never the password; its first line says what failed.
    return (str(e).splitlines() or [type(e).__name__])[0]
