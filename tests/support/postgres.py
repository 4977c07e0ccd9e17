"""A real PostgreSQL for the tests, started by them: initdb into a temporary directory, `pg_ctl` on a Unix
socket in that directory (and a loopback port, for benchmarks that want TCP). As root the server runs as the
`postgres` user (PostgreSQL refuses to run as root). Always stopped by its own pg_ctl.

`scripts/postgres.sh` (run by `make test`) installs Debian's `postgresql` when it is missing; when it cannot,
it writes the reason to tests/.postgres-unavailable and these tests skip with it."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.daemon import ROOT, free_port

UNAVAILABLE = ROOT / "tests" / ".postgres-unavailable"


def bindir() -> Path | None:
    env = os.environ.get("CODEROUTER_PG_BINDIR")
    candidates = [env] if env else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for c in candidates:
        if c and (Path(c) / "initdb").is_file():
            return Path(c)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _runas() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("PostgreSQL cannot run as root and there is no `postgres` user to run it as")
    return ["runuser", "-u", "postgres", "--"]


class Postgres:
    def __init__(self, *, tcp: bool = False) -> None:
        if UNAVAILABLE.exists():
            pytest.skip("PostgreSQL unavailable: " + UNAVAILABLE.read_text().strip()[-300:])
        b = bindir()
        if b is None:
            pytest.skip("PostgreSQL is not installed (initdb not found): `make test` installs it")
        self.bin = b
        self.runas = _runas()
        # A short path: Unix socket paths are limited to ~107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="crpg-"))
        os.chmod(self.dir, 0o755)
        if self.runas:
            shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"
        self.port = free_port() if tcp else 5432
        self.tcp = tcp
        self.log = self.dir / "log"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self.runas, *argv], capture_output=True, text=True, check=check, timeout=120)

    def start(self) -> Postgres:
        if not self.data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "--no-sync", "-E", "UTF8", "--locale=C")
        listen = "127.0.0.1" if self.tcp else "''"
        opts = (f"-k {self.dir} -c listen_addresses={listen} -p {self.port} -c fsync=off"
                " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        r = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.log), "-w",
                      "-t", "60", "start", check=False)
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {r.stderr}\n{self.log.read_text(errors='replace')}")
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.data.exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, db: str) -> str:
        if self.tcp:
            return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"
        return f"postgresql://postgres@/{db}?host={self.dir}&port={self.port}"

    def fresh_db(self, name: str) -> str:
        """A new empty database on this server; its DSN."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)
