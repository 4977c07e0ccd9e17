"""The shared state at start-up (issue 34, item 6): a malformed DSN is a configuration error with a message (not a
traceback later), a database whose cr_* names hold someone else's tables says so instead of "not reachable
yet" forever, and an unreachable database does not hold start-up (and /healthz) back."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import psycopg

from coderouterd.cluster.backend import PostgresBackend
from coderouterd.config.schema import StateConfig
from coderouterd.state.shared.dsn import redact
from coderouterd.tasks import TaskSet
from tests.support import cli
from tests.support.daemon import ROOT
from tests.support.ports import dead_port

BAD_DSN = "postgresql://u:pw@[::1/x"


def _config(tmp_path, dsn: str):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[state]\nbackend = "postgres"\ndsn = "{dsn}"\n\n'
                   '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n\n'
                   '[profiles.default]\nproviders = ["p"]\n')
    return cfg


def test_a_malformed_dsn_fails_the_check_of_both_commands_without_showing_the_password(tmp_path):
    cfg = _config(tmp_path, BAD_DSN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    daemon = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(cfg), "--check"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert daemon.returncode == 2, daemon.stdout + daemon.stderr
    assert "[state] dsn is not a valid PostgreSQL address" in daemon.stderr and "Traceback" not in daemon.stderr
    check = cli.corectl(["config", "check", str(cfg)], env=env)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "not a valid PostgreSQL address" in check.stderr
    for out in (daemon.stdout + daemon.stderr, check.stdout + check.stderr):
        assert "u:pw@" not in out and "u:***@" in out
    assert redact(BAD_DSN) == "postgresql://u:***@[::1/x"  # a DSN urlsplit refuses is still redacted


def _backend(tmp_path, dsn: str, tasks: TaskSet) -> PostgresBackend:
    return PostgresBackend(StateConfig(backend="postgres", dsn=dsn, instance="solo"), state_dir=tmp_path,
                           version="test", tasks=tasks, publish=lambda e: None, journal_db=None)


def test_foreign_tables_under_our_names_are_named_not_retried(tmp_path, pg_dsn, caplog):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE cr_ledger (owner text, note text)")  # another application's table

    async def scenario() -> PostgresBackend:
        tasks = TaskSet()
        backend = _backend(tmp_path, pg_dsn, tasks)
        await backend.start()
        await asyncio.sleep(0)
        retrying = len(tasks)  # the join task, had it gone back to retrying
        await backend.stop()
        await tasks.close()
        assert retrying == 0, "the join is still retrying"
        return backend

    with caplog.at_level(logging.WARNING, logger="coderouterd.shared"):
        backend = asyncio.run(scenario())
    assert backend.conflict and '"cr_ledger" already exists' in backend.conflict, backend.conflict
    assert "did not make" in backend.conflict
    st = backend.status()
    assert st is not None and st["problem"] == backend.conflict and st["up"] is False
    assert "not reachable" not in caplog.text and "cr_ledger" in caplog.text


def test_an_unreachable_database_does_not_hold_start_up(tmp_path, caplog):
    """start() returns after the first failed attempt: the join goes on retrying in the background."""
    dsn = f"postgresql://u:pw@127.0.0.1:{dead_port()}/x"  # nothing listens there

    async def scenario() -> tuple[int, bool]:
        tasks = TaskSet()
        backend = _backend(tmp_path, dsn, tasks)
        tries = 0
        connect = backend.db.connect

        def counting():
            nonlocal tries
            tries += 1
            return connect()

        backend.db.connect = counting  # type: ignore[method-assign]
        await backend.start()
        seen = tries, backend.ready.is_set()
        await backend.stop()
        await tasks.close()
        return seen

    with caplog.at_level(logging.WARNING, logger="coderouterd.shared"):
        tries, ready = asyncio.run(scenario())
    # Before: start() waited 5 s for the join, through every retry (0.5, 1, 2 s apart).
    assert (tries, ready) == (1, False)
    assert "not reachable yet" in caplog.text and "pw" not in caplog.text
