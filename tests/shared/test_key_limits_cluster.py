"""Three real coderouterd processes on one PostgreSQL, keys made on one of them (issue 41): a key's monthly cap holds
with 0 overspend whichever instances its requests reach, its rpm is the key's and not each instance's (at most N,
plus at most one per instance, however a load balancer spreads them), and with the database stopped each instance
spends only what it held in advance, so the key's cap still holds once the spend reaches the ledger."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import psycopg

from tests.fakes.runner import FakeServer
from tests.support.daemon import DaemonProcess
from tests.support.wait import wait_for

# Every request costs exactly its estimate: max_tokens = 3 and the fake answers 3 tokens at $100 per million
# output tokens, so $0.0003 each: 10 fit under a key's $0.003.
CONFIG = """
[server]
port = {PORT}

[state]
backend = "postgres"
dsn_env = "CR_TEST_DSN"
instance = "@NAME@"
heartbeat_s = 0.5
ship_interval_s = 0.2
shared_timeout_ms = 500

[budget]
global_monthly_usd = 100

[providers.paid]
kind = "openai"
base_url = "@URL@/v1"
model = "m"
paid = true
cost = { input = 0.0, output = 100.0 }

[profiles.default]
providers = ["paid"]
"""

BODY = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
NAMES = ("east", "west", "north")


def _daemon(tmp, name, url, dsn) -> DaemonProcess:
    return DaemonProcess(CONFIG.replace("@NAME@", name).replace("@URL@", url), tmp / name,
                         env={"CR_TEST_DSN": dsn})


def _create(d: DaemonProcess, name: str, **settings) -> str:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.state_dir / "coderouterd.sock")),
                      base_url="http://admin", timeout=10) as c:
        r = c.post("/v1/keys", json={"name": name, **settings})
    assert r.status_code == 200, r.text
    return r.json()["key"]


def _known_everywhere(ds: list[DaemonProcess], secret: str) -> bool:
    """Every instance requires keys and accepts this one (count_tokens: authenticated, nothing spent)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    def status(d: DaemonProcess, key: str) -> int:
        return httpx.post(d.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": key},
                          timeout=10).status_code

    return all(status(d, "crk_not-a-key") == 401 and status(d, secret) == 200 for d in ds)


def _key_row(dsn, key) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT spent, reserved, cap FROM cr_ledger WHERE budget = %s", (f"key:{key}",)).fetchone()
    return tuple(row) if row else (0, 0, 0)


def _spread(ds: list[DaemonProcess], secret: str, n: int) -> list[int]:
    def one(i: int) -> int:
        return httpx.post(ds[i % len(ds)].url + "/v1/chat/completions", json=BODY,
                          headers={"authorization": f"Bearer {secret}"}, timeout=60).status_code

    with cf.ThreadPoolExecutor(12) as pool:
        return list(pool.map(one, range(n)))


def test_a_key_cap_and_rpm_hold_across_three_instances(tmp_path, pg_dsn):
    with FakeServer("openai", name="paid", models=["m"], behaviour="slow_first_byte;delay=0.1") as up:
        ds = [_daemon(tmp_path, n, up.url, pg_dsn).start() for n in NAMES]
        try:
            capped = _create(ds[0], "capped", monthly_usd=0.003)
            paced = _create(ds[1], "paced", rpm=6)
            # Made on one instance, seen on every other within the registry's poll.
            assert wait_for(lambda: _known_everywhere(ds, capped) and _known_everywhere(ds, paced), 30)

            codes = _spread(ds, capped, 40)
            assert set(codes) <= {200, 402, 429, 503}, codes
            served = codes.count(200)
            assert wait_for(lambda: _key_row(pg_dsn, "capped")[0] == served * 300_000, 30), _key_row(pg_dsn, "capped")
            spent, _reserved, cap = _key_row(pg_dsn, "capped")
            assert cap == 3_000_000 and spent <= cap  # 0 overspend
            assert served >= 8  # the cap is used (allowances hold a little back)

            # rpm 6 across three instances: the whole burst falls in one minute (it takes seconds; a window
            # is 60 s), so at most 6 + one per instance are served, the rest get 429 with Retry-After.
            codes = _spread(ds, paced, 30)
            assert set(codes) <= {200, 429}, codes
            assert 1 <= codes.count(200) <= 6 + len(ds), codes
            r = httpx.post(ds[2].url + "/v1/chat/completions", json=BODY,
                           headers={"authorization": f"Bearer {paced}"}, timeout=60)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.headers["x-ratelimit-limit-requests"] == "6"
            assert "paced" in r.text and paced not in r.text
            assert up.count("/v1/chat/completions") == served + codes.count(200)
        finally:
            for d in ds:
                d.stop()


def test_a_key_cap_holds_while_postgres_is_stopped(tmp_path):
    """The database stops with three instances serving one capped key: each spends blind only from the key's
    allowance it holds, and once the database is back every cent reaches the ledger within the key's cap."""
    from tests.support.postgres import Postgres

    pg = Postgres()
    pg.start()
    try:
        dsn = pg.fresh_db("keyoutage")
        with FakeServer("openai", name="paid", models=["m"]) as up:
            ds = [_daemon(tmp_path, n, up.url, dsn).start() for n in NAMES]
            try:
                secret = _create(ds[0], "blind", monthly_usd=0.03)
                assert wait_for(lambda: _known_everywhere(ds, secret), 30)
                before = _spread(ds, secret, 6)  # every instance sees the key, and takes its allowance
                assert before.count(200) == 6
                assert wait_for(lambda: all("key:blind" in _status(d)["shared"]["budget"]["allowances_usd"]
                                            for d in ds), 30)
                pg.stop()
                assert wait_for(lambda: all(_status(d)["shared"]["up"] is False for d in ds), 30)
                during = _spread(ds, secret, 120)
                assert set(during) <= {200, 402, 503}, during
                # Served blind from the key's allowances (a tenth of what was left per instance), then refused.
                assert 3 <= during.count(200) < 100
                pg.start()
                assert wait_for(lambda: all(_status(d)["shared"]["up"] and
                                            _status(d)["shared"]["budget"]["settles_queued"] == 0 for d in ds), 60)
                total = before.count(200) + during.count(200)
                assert wait_for(lambda: _key_row(dsn, "blind")[0] == total * 300_000, 30), _key_row(dsn, "blind")
                spent, _reserved, cap = _key_row(dsn, "blind")
                assert spent <= cap == 30_000_000  # 0 overspend, the database down or not
            finally:
                for d in ds:
                    d.stop()
    finally:
        pg.cleanup()


def _status(d: DaemonProcess) -> dict:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.state_dir / "coderouterd.sock")),
                      base_url="http://admin", timeout=10) as c:
        return c.get("/v1/status").json()

