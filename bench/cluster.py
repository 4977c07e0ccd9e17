"""Several coderouterd instances sharing one PostgreSQL (issue 24): the figures in bench/README.md.

    .venv/bin/python bench/cluster.py [budget] [reclaim] [breakers] [overhead] [journal] [outage]

With no argument every part runs (about five minutes on two loaded cores). PostgreSQL is started here from
Debian's binaries (tests/support/postgres.py) on a loopback TCP port; the upstream is the fake OpenAI server
(tests/fakes) answering exactly 3 output tokens, priced so each request costs a known amount.

  budget    4 instances x 16 concurrent clients against a $10 global cap, with the product's guarded ledger
            and, in the same run, with a check-then-increment ledger (a switch of this benchmark only: the
            daemons are started through `--naive-daemon`, which replaces the reservation statement before
            coderouterd runs). Final spend against the cap for each.
  reclaim   kill -9 of an instance holding reservations: how long until a peer reclaimed them (lease 3 s), and
            the shared ledger against the sum of the journals' costs at the end.
  breakers  a breaker opened on one instance, seen by another: with NOTIFY, and with the LISTEN connection cut
            (the poll alone); p50/p99 over repeated opens.
  overhead  reserve + settle as the request path pays them (SharedBudget over a pool, loopback TCP), against
            the local ledger; and one daemon's request latency with the sqlite and the postgres backend.
  journal   3 kill -9 cycles of an instance and one PostgreSQL restart under traffic: rows in the local
            journals against rows in the shared journal (lost, duplicated).
  outage    PostgreSQL stopped for 30 s under traffic: requests that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, pct, stop, table, wait_healthz  # noqa: E402

# 3 output tokens at $20,000 per million: $0.06 a request, and the estimate (max_tokens = 3) equals the cost.
PRICE = 20_000.0
COST = 3 * PRICE / 1e6
BODY = b'{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}'

CONFIG = """
[server]
port = {port}

[state]
backend = "postgres"
dsn_env = "CR_BENCH_DSN"
instance = "{name}"
heartbeat_s = 0.5
lease_s = {lease}
ship_interval_s = 0.2
poll_s = 2
shared_timeout_ms = {timeout_ms}

[budget]
global_monthly_usd = {cap}

[breaker]
failures = 3
recovery_s = 30

[providers.paid]
kind = "openai"
base_url = "{url}/v1"
model = "m"
paid = true
cost = {{ input = 0.0, output = {price} }}
timeouts = {{ connect = 2, first_byte = 60 }}

[profiles.default]
providers = ["paid"]
health_action = "warn"
"""


# -- the check-then-increment ledger (this benchmark only) -----------------------------------------------------

async def _naive_reserve(conn, *, rid, instance, period, budgets, amount, lease_s):
    """What shared ledgers that overspend do (LiteLLM's per-session budget, its issue 34732): check the spend so
    far against the cap, let the request through, and add its cost when it is done. Nothing is held meanwhile, so
    every request checked while others are in flight passes the same check."""
    budgets = sorted(budgets)
    for budget, cap in budgets:
        await conn.execute("INSERT INTO cr_ledger (budget, period, cap) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                           (budget, period, cap))
        cur = await conn.execute("SELECT spent, cap FROM cr_ledger WHERE budget = %s AND period = %s",
                                 (budget, period))
        spent, cap_now = await cur.fetchone()
        if cap_now and spent + amount > cap_now:
            return budget
    # A row so the settle (which adds the cost) finds it; it holds nothing.
    await conn.execute("INSERT INTO cr_reservation (id, instance, period, budgets, amount, lease_until)"
                       " VALUES (%s, %s, %s, %s, 0, now() + make_interval(secs => %s))",
                       (rid, instance, period, [b for b, _ in budgets], float(lease_s)))
    return None


def naive_daemon(argv: list[str]) -> int:
    from coderouterd.__main__ import main
    from coderouterd.cluster import budget as shared_budget
    from coderouterd.state.shared import ledger

    ledger.reserve = _naive_reserve
    shared_budget.ledger.reserve = _naive_reserve
    return main(argv)


# -- parts -----------------------------------------------------------------------------------------------------

class Cluster:
    def __init__(self, tmp: Path, dsn: str, url: str, *, cap: float, lease: float = 30, timeout_ms: float = 50,
                 naive: bool = False) -> None:
        self.tmp, self.dsn, self.url, self.cap, self.lease = tmp, dsn, url, cap, lease
        self.timeout_ms, self.naive = timeout_ms, naive
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    def start(self, name: str) -> str:
        port = self.ports.setdefault(name, free_port())
        d = self.tmp / name
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "config.toml"
        cfg.write_text(CONFIG.format(port=port, name=name, lease=self.lease, cap=self.cap, url=self.url,
                                     price=PRICE, timeout_ms=self.timeout_ms))
        env = {**os.environ, "CR_BENCH_DSN": self.dsn, "CODEROUTER_STATE_DIR": str(d / "state"),
               "XDG_CONFIG_HOME": str(d / "xdg")}
        argv = ["--config", str(cfg), "--port", str(port)]
        cmd = [PY, __file__, "--naive-daemon", *argv] if self.naive else [PY, "-m", "coderouterd", *argv]
        log = open(d / "daemon.log", "ab")
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = p
        wait_healthz(f"http://127.0.0.1:{port}", p, timeout=60)
        return f"http://127.0.0.1:{port}"

    def url_of(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def kill9(self, name: str) -> None:
        p = self.procs.pop(name)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()

    def stop_all(self) -> None:
        for p in self.procs.values():
            stop(p)
        self.procs.clear()


def sql(dsn: str, query: str, args=()):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(query, args).fetchall()


async def clients(urls: list[str], per: int, *, until_refused: int = 3, deadline_s: float = 120.0,
                  stop_at: float | None = None) -> dict:
    """`per` concurrent clients per url, each sending requests until refused `until_refused` times in a row
    (or the deadline). Returns counts by status and the latencies of 200s."""
    import aiohttp

    out: dict = {"codes": {}, "lat": [], "ids": []}
    end = time.monotonic() + deadline_s

    async def client(session, url):
        refused = 0
        while time.monotonic() < end and refused < until_refused and (stop_at is None or time.monotonic() < stop_at):
            t0 = time.perf_counter()
            try:
                async with session.post(url + "/v1/chat/completions", data=BODY,
                                        headers={"content-type": "application/json"}) as r:
                    await r.read()
                    code = r.status
                    rid = r.headers.get("x-request-id")
            except aiohttp.ClientError:
                code, rid = "conn", None
                await asyncio.sleep(0.05)  # an instance being restarted: do not spin
            out["codes"][code] = out["codes"].get(code, 0) + 1
            if code == 200:
                out["lat"].append(time.perf_counter() - t0)
                refused = 0
            elif code in (402, 503):
                refused += 1
                await asyncio.sleep(0.05)
            if rid:
                out["ids"].append(rid)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=90)) as session:
        await asyncio.gather(*(client(session, u) for u in urls for _ in range(per)))
    return out


def start_fake(behaviour: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([PY, "-m", "tests.fakes", "--kind", "openai", "--port", str(port), "--behaviour",
                          behaviour, "--no-record", "--models", "m", "--name", "paid"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if not p.stdout.readline().startswith("READY"):
        raise RuntimeError("fake upstream did not start")
    return p, f"http://127.0.0.1:{port}"


def part_budget(pg, tmp: Path) -> list[list[str]]:
    rows = []
    fake, url = start_fake("slow_first_byte;delay=0.05")
    try:
        for naive in (False, True):
            dsn = pg.fresh_db("budget_naive" if naive else "budget_guarded")
            # A generous bound on the ledger's answer, for both: the ledger decides, not the slow-answer fallback.
            c = Cluster(tmp / ("naive" if naive else "guarded"), dsn, url, cap=10.0, naive=naive, timeout_ms=2000)
            try:
                urls = [c.start(f"i{k}") for k in range(4)]
                t0 = time.monotonic()
                # Clients keep going through refusals caused by others' in-flight holds (they clear in ms).
                res = asyncio.run(clients(urls, 16, until_refused=20))
                took = time.monotonic() - t0
                time.sleep(1.5)  # the last settles
                spent = sql(dsn, "SELECT spent, reserved, cap FROM cr_ledger WHERE budget = '*'")[0]
                served = res["codes"].get(200, 0)
            finally:
                c.stop_all()
            over = spent[0] / 1e9 - 10.0
            rows.append(["check-then-increment (bench switch)" if naive else "guarded UPDATE (product)",
                         str(served), f"${served * COST:.2f}", f"${spent[0] / 1e9:.2f}",
                         f"${max(over, 0):.2f}" + (f" ({over / 10 * 100:.0f}%)" if over > 1e-9 else ""),
                         str(sum(v for k, v in res["codes"].items() if k != 200)), f"{took:.1f} s"])
            print(f"budget {'naive' if naive else 'guarded'}: {res['codes']} spent {spent}", flush=True)
    finally:
        stop(fake)
    return rows


def part_reclaim(pg, tmp: Path) -> list[list[str]]:
    fake, url = start_fake("slow_first_byte;delay=20")
    dsn = pg.fresh_db("reclaim")
    c = Cluster(tmp / "reclaim", dsn, url, cap=1000.0, lease=3, timeout_ms=2000)
    try:
        victim = c.start("victim")
        c.start("peer")

        def opened() -> int:
            # The victim's holds for requests (its allowance, id "...:aN", is reclaimed with them but not counted).
            return sql(dsn, "SELECT count(*) FROM cr_reservation WHERE instance = 'victim' AND settled_at IS NULL"
                            " AND reclaimed_at IS NULL AND id !~ ':a[0-9]+$'")[0][0]

        async def hold():
            import aiohttp

            async with aiohttp.ClientSession() as s:
                async def one():
                    try:
                        async with s.post(victim + "/v1/chat/completions", data=BODY,
                                          headers={"content-type": "application/json"}) as r:
                            await r.read()
                    except aiohttp.ClientError:
                        pass
                tasks = [asyncio.ensure_future(one()) for _ in range(8)]
                for _ in range(200):
                    if opened() >= 8:
                        break
                    await asyncio.sleep(0.05)
                held = opened()
                c.kill9("victim")
                t0 = time.monotonic()
                while opened() > 0 and time.monotonic() - t0 < 30:
                    await asyncio.sleep(0.05)
                took = time.monotonic() - t0
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return held, took

        held, took = asyncio.run(hold())
        stop(fake)
        # Then ordinary traffic on both (the victim restarted), and the ledger against the journals.
        fake, url = start_fake("ok")
        c.url = url
        c.stop_all()
        urls = [c.start("victim"), c.start("peer")]
        asyncio.run(clients(urls, 8, deadline_s=5))
        c.kill9("victim")
        c.start("victim")
        asyncio.run(clients(urls, 8, deadline_s=5))
        time.sleep(2.0)
        c.stop_all()
        ledger = sql(dsn, "SELECT spent, reserved FROM cr_ledger WHERE budget = '*'")[0]
        journal = sql(dsn, "SELECT coalesce(sum(cost_usd), 0), count(*) FROM cr_journal")[0]
    finally:
        c.stop_all()
        stop(fake)
    return [[f"{held} requests (${held * COST:.2f})", "3 s", f"{took:.2f} s",
             f"${ledger[0] / 1e9:.4f}", f"${journal[0]:.4f} ({journal[1]} rows)",
             f"{(ledger[0] / 1e9 - journal[0]):+.4f}", f"${ledger[1] / 1e9:.2f}"]]


def part_breakers(pg) -> list[list[str]]:
    from tests.shared.test_breakers import Instance, _migrated

    dsn = pg.fresh_db("breakers")

    async def measure(cut: bool, n: int) -> list[float]:
        await _migrated(dsn)
        a = await Instance(dsn, "a", poll_s=2.0).start()
        b = await Instance(dsn, "b", poll_s=2.0).start()
        out = []
        try:
            while not (a.shared.listening and b.shared.listening):
                await asyncio.sleep(0.01)
            if cut:
                async def refused():
                    raise OSError("cut by the benchmark")
                b.db.connect = refused
                sql(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE application_name = 'coderouter-listen-b'")
                while b.shared.listening:
                    await asyncio.sleep(0.01)
            from coderouterd.upstream.breaker import BreakerState

            for _ in range(n):
                # Open on a (its failures), time until b's breaker is open; then close it on a, wait for b.
                t0 = time.perf_counter()
                a.fail(3)
                while b.breaker().state is BreakerState.CLOSED:
                    await asyncio.sleep(0.001)
                out.append(time.perf_counter() - t0)
                a.breaker().reset("bench")
                while b.breaker().state is not BreakerState.CLOSED:
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0.05 if not cut else 0.3 * (len(out) % 7))  # spread across the poll phase
        finally:
            await a.stop()
            await b.stop()
        return out

    notify = asyncio.run(measure(False, 200))
    poll = asyncio.run(measure(True, 20))
    ms = lambda v: f"{v * 1000:.1f} ms"  # noqa: E731
    return [["NOTIFY (LISTEN connected)", str(len(notify)), ms(pct(notify, 50)), ms(pct(notify, 99)),
             ms(max(notify))],
            ["poll only (LISTEN cut), poll_s = 2", str(len(poll)), ms(pct(poll, 50)), ms(pct(poll, 99)),
             ms(max(poll))]]


def part_overhead(pg, tmp: Path) -> list[list[str]]:
    from coderouterd.cluster.budget import SharedBudget
    from coderouterd.guards.budget import Budget
    from coderouterd.state.memory import MemoryStore
    from coderouterd.state.shared.db import Database
    from coderouterd.tasks import TaskSet
    from tests.shared.test_breakers import _migrated

    dsn = pg.fresh_db("overhead")

    class P:
        paid = True
        monthly_budget_usd = 0.0

        class cost:  # noqa: N801
            input = 0.0
            output = PRICE
            cache_read = 0.0
            cache_write = 0.0

    async def shared(n: int) -> tuple[list[float], list[float]]:
        await _migrated(dsn)
        tasks = TaskSet()
        db = Database(dsn, timeout_s=0.05, tasks=tasks)
        await db.open()
        await db.run(lambda c: c.execute("SELECT 1"))
        sb = SharedBudget(Budget(MemoryStore()), db, instance="bench", lease_s=30, tasks=tasks,
                          live_instances=lambda: 1)
        sb.configure({"paid": P}, global_cap_usd=1e6, warn_ratio=0.8)
        await sb.start()
        lat, fallbacks = [], 0
        for _ in range(n):
            t0 = time.perf_counter()
            res = await sb.reserve("paid", COST)
            sb.settle(res, COST)
            lat.append(time.perf_counter() - t0)
            fallbacks += res.offline
            await asyncio.sleep(0)
        await sb.drain(10)
        bg = []
        # The settle's own round trip, off the request path (for the record).
        for i in range(200):
            t0 = time.perf_counter()
            await db.run(lambda c, i=i: c.execute("SELECT cr_settle(%s, 'bench', '2026-12', %s, %s, 1)",
                                                  (f"s{i}", ["*"], [0])))
            bg.append(time.perf_counter() - t0)
        await tasks.close()
        await db.close()
        if fallbacks:
            print(f"overhead: {fallbacks} of {n} reservations fell back to the local share (slower than 50 ms)")
        return lat, bg

    def local(n: int) -> list[float]:
        b = Budget(MemoryStore())
        b.configure({"paid": P}, global_cap_usd=1e6, warn_ratio=0.8)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = b.reserve("paid", COST)
            b.settle(r, COST)
            lat.append(time.perf_counter() - t0)
        return lat

    lat, settle_bg = asyncio.run(shared(2000))
    loc = local(2000)
    us = lambda v: f"{v * 1e6:,.0f} µs"  # noqa: E731
    rows = [["reserve + settle, local ledger", us(pct(loc, 50)), us(pct(loc, 99))],
            ["reserve + settle, shared ledger (loopback TCP)", us(pct(lat, 50)), us(pct(lat, 99))],
            ["  settle's round trip (off the request path)", us(pct(settle_bg, 50)), us(pct(settle_bg, 99))]]

    # One daemon, one client at a time: request latency with each backend (the upstream answers at once).
    fake, url = start_fake("ok")
    try:
        for backend in ("sqlite", "postgres"):
            d = tmp / f"lat-{backend}"
            d.mkdir(parents=True, exist_ok=True)
            port = free_port()
            text = CONFIG.format(port=port, name="lat", lease=30, cap=1e6, url=url, price=PRICE, timeout_ms=50)
            if backend == "sqlite":
                text = text.replace('backend = "postgres"', 'backend = "sqlite"').replace(
                    'dsn_env = "CR_BENCH_DSN"\n', "")
            (d / "config.toml").write_text(text)
            env = {**os.environ, "CR_BENCH_DSN": dsn, "CODEROUTER_STATE_DIR": str(d / "state"),
                   "XDG_CONFIG_HOME": str(d / "xdg")}
            p = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(d / "config.toml"), "--port", str(port)],
                                 cwd=ROOT, env=env, stdout=open(d / "log", "ab"), stderr=subprocess.STDOUT)
            try:
                wait_healthz(f"http://127.0.0.1:{port}", p, timeout=60)

                async def seq(n=1500, port=port):
                    import aiohttp

                    out = []
                    async with aiohttp.ClientSession() as s:
                        for i in range(n + 100):
                            t0 = time.perf_counter()
                            async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=BODY,
                                              headers={"content-type": "application/json"}) as r:
                                await r.read()
                                assert r.status == 200, r.status
                            if i >= 100:
                                out.append(time.perf_counter() - t0)
                    return out

                lat = asyncio.run(seq())
                rows.append([f"request through coderouterd, backend = {backend}", f"{pct(lat, 50) * 1000:.2f} ms",
                             f"{pct(lat, 99) * 1000:.2f} ms"])
            finally:
                stop(p)
    finally:
        stop(fake)
    return rows


def part_journal(pg, tmp: Path) -> list[list[str]]:
    fake, url = start_fake("ok")
    dsn = pg.fresh_db("journal")
    c = Cluster(tmp / "journal", dsn, url, cap=1e6, timeout_ms=50)
    events = []
    try:
        urls = [c.start("a"), c.start("b")]

        async def traffic_and_chaos():
            load = asyncio.ensure_future(clients(urls, 4, until_refused=10**9, deadline_s=40))
            for cycle in range(3):
                await asyncio.sleep(3)
                c.kill9("a")
                events.append(f"kill -9 a ({cycle + 1})")
                await asyncio.sleep(0.5)
                await asyncio.to_thread(c.start, "a")
            await asyncio.sleep(2)
            await asyncio.to_thread(pg.restart, 2.0)
            events.append("PostgreSQL restart (2 s down)")
            await asyncio.sleep(5)
            return await load

        res = asyncio.run(traffic_and_chaos())
        time.sleep(3)
        c.stop_all()
        # Everything the instances wrote locally, against the shared journal.
        import sqlite3

        local = set()
        for name in ("a", "b"):
            db = tmp / "journal" / name / "state" / "state.db"
            con = sqlite3.connect(db)
            local |= {(name, r[0]) for r in con.execute("SELECT id FROM journal")}
            con.close()
        # Restarted instances ship what they had not: start each once more, briefly.
        c.start("a")
        c.start("b")
        time.sleep(2)
        c.stop_all()
        shared = sql(dsn, "SELECT instance, seq FROM cr_journal")
        shared_set = set(shared)
        dup = len(shared) - len(shared_set)
        lost = len(local - shared_set)
        answered = res["codes"].get(200, 0)
    finally:
        c.stop_all()
        stop(fake)
    return [[", ".join(events), str(sum(res["codes"].values())), str(answered), str(len(local)),
             str(len(shared)), str(lost), str(dup)]]


def part_outage(pg, tmp: Path, down_s: float = 30.0) -> list[list[str]]:
    fake, url = start_fake("ok")
    dsn = pg.fresh_db("outage")
    c = Cluster(tmp / "outage", dsn, url, cap=1e6, timeout_ms=50)
    try:
        urls = [c.start("a"), c.start("b")]

        async def run():
            load = asyncio.ensure_future(clients(urls, 4, until_refused=10**9, deadline_s=down_s + 15))
            await asyncio.sleep(5)
            await asyncio.to_thread(pg.stop)
            await asyncio.sleep(down_s)
            await asyncio.to_thread(pg.start)
            return await load

        res = asyncio.run(run())
        # Caught up: every answered request charged and shipped (or a minute passed).
        served = res["codes"].get(200, 0)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            n = sql(dsn, "SELECT count(*) FROM cr_journal")[0][0]
            if n >= served:
                break
            time.sleep(0.5)
        caught_up = time.monotonic() - t0
        time.sleep(1.0)
        spent = sql(dsn, "SELECT spent, reserved FROM cr_ledger WHERE budget = '*'")[0]
        journal = sql(dsn, "SELECT count(*), coalesce(sum(cost_usd), 0) FROM cr_journal")[0]
    finally:
        c.stop_all()
        stop(fake)
    failed = sum(v for k, v in res["codes"].items() if k != 200)
    lat = res["lat"]
    return [[f"{down_s:.0f} s", str(sum(res["codes"].values())), str(failed), f"{pct(lat, 99) * 1000:.1f} ms",
             f"{caught_up:.1f} s", f"${spent[0] / 1e9:.2f}", f"${journal[1]:.2f} ({journal[0]} rows)"]]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--naive-daemon":
        return naive_daemon(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", default=["budget", "reclaim", "breakers", "overhead", "journal", "outage"])
    ap.add_argument("--outage-s", type=float, default=30.0)
    args = ap.parse_args()
    from tests.support.postgres import Postgres

    pg = Postgres(tcp=True)
    pg.start()
    tmp = Path(tempfile.mkdtemp(prefix="crbench-cluster-"))
    out = []
    try:
        if "budget" in args.parts:
            out.append("Budget: 4 instances x 16 clients, $10 global cap, $0.06 a request\n" + table(
                part_budget(pg, tmp), ["ledger", "served", "served x cost", "ledger spent", "over the cap",
                                       "refused", "time"]))
        if "reclaim" in args.parts:
            out.append("kill -9 with reservations held\n" + table(
                part_reclaim(pg, tmp), ["held at the kill", "lease", "reclaimed after", "ledger spent",
                                        "journals' costs", "ledger - journals", "left reserved"]))
        if "breakers" in args.parts:
            out.append("Breaker opened on one instance, seen by another\n" + table(
                part_breakers(pg), ["path", "opens", "p50", "p99", "max"]))
        if "overhead" in args.parts:
            out.append("Budget cost on the request path (PostgreSQL on loopback)\n" + table(
                part_overhead(pg, tmp), ["what", "p50", "p99"]))
        if "journal" in args.parts:
            out.append("Journal across kills\n" + table(
                part_journal(pg, tmp), ["events", "requests", "answered 200", "local rows", "shared rows", "lost",
                                        "duplicated"]))
        if "outage" in args.parts:
            out.append("PostgreSQL stopped under traffic (2 instances x 4 clients)\n" + table(
                part_outage(pg, tmp, args.outage_s), ["down", "requests", "failed", "p99 latency",
                                                       "caught up after", "ledger spent after",
                                                       "journal after"]))
    finally:
        pg.cleanup()
    print()
    print("\n\n".join(out))
    print(f"\n(load average {os.getloadavg()[0]:.1f}; {statistics.__name__} figures from one run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
