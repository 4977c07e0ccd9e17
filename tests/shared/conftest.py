"""One real PostgreSQL server for the shared-state tests (started once per session), a fresh database each."""

from __future__ import annotations

import itertools

import pytest

from tests.support.postgres import Postgres

_n = itertools.count()


@pytest.fixture(scope="session")
def pg_server():
    pg = Postgres()
    pg.start()
    yield pg
    pg.cleanup()


@pytest.fixture
def pg_dsn(pg_server) -> str:
    return pg_server.fresh_db(f"t{next(_n)}")
