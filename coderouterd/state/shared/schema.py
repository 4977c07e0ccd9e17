"""The shared schema, versioned: each migration runs once, by whichever instance starts first, under an
advisory lock (the others wait on the lock, then find nothing left to do).

Money is kept as integer nano-USD (bigint): sums are exact, and a cap filled to the last cent compares equal
rather than a float epsilon over. Leases use the database's clock (now()), never the instances', so a
machine with a skewed clock can neither reclaim early nor keep a dead peer's reservations."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..journal import JOURNAL_COLUMNS
from .db import scalar

if TYPE_CHECKING:
    from .db import Conn

log = logging.getLogger("coderouterd.shared")

# pg_advisory_lock key: "crou" "ter1" as two 32-bit halves, unlikely to collide with another application.
MIGRATION_LOCK = 0x63726F75_74657231

_JOURNAL_TYPES = {
    "ts": "double precision", "status": "integer", "latency_ms": "double precision", "ttfb_ms": "double precision",
    "input_tokens": "bigint", "output_tokens": "bigint", "cache_read_tokens": "bigint",
    "cache_write_tokens": "bigint", "cost_usd": "double precision", "streaming": "integer",
    "fallback_count": "integer", "slot": "integer", "predicted_tokens": "bigint",
}


def journal_column_type(name: str) -> str:
    return _JOURNAL_TYPES.get(name, "text")


_JOURNAL_DDL = (
    "CREATE TABLE cr_journal (instance text NOT NULL, seq bigint NOT NULL, "
    + ", ".join(f"{c} {journal_column_type(c)}" for c in JOURNAL_COLUMNS)
    + ", PRIMARY KEY (instance, seq))"
)

# Reserve against every budget a request counts toward (the provider's and the global one), in sorted order
# so two reservations never lock the same rows in opposite orders. Each row takes one guarded UPDATE: under
# Read Committed PostgreSQL re-checks the WHERE on the newest row version after waiting for a concurrent
# writer, so two reservations can never both see the same headroom. A refusal undoes the rows already taken
# (their locks are still ours) and returns the budget that refused.
_RESERVE = """
CREATE FUNCTION cr_reserve(p_id text, p_instance text, p_period text, p_budgets text[], p_caps bigint[],
                           p_amount bigint, p_lease_s double precision) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  i int;
  j int;
  n int;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_budgets, 1), 0) LOOP
    UPDATE cr_ledger SET reserved = reserved + p_amount
     WHERE budget = p_budgets[i] AND period = p_period AND (cap = 0 OR spent + reserved + p_amount <= cap);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
      -- A new period (or budget) has no row yet: create it with the cap we know, then guard again.
      INSERT INTO cr_ledger (budget, period, cap) VALUES (p_budgets[i], p_period, p_caps[i])
        ON CONFLICT DO NOTHING;
      UPDATE cr_ledger SET reserved = reserved + p_amount
       WHERE budget = p_budgets[i] AND period = p_period AND (cap = 0 OR spent + reserved + p_amount <= cap);
      GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    IF n = 0 THEN
      FOR j IN 1 .. i - 1 LOOP
        UPDATE cr_ledger SET reserved = reserved - p_amount WHERE budget = p_budgets[j] AND period = p_period;
      END LOOP;
      RETURN p_budgets[i];
    END IF;
  END LOOP;
  INSERT INTO cr_reservation (id, instance, period, budgets, amount, lease_until)
    VALUES (p_id, p_instance, p_period, p_budgets, p_amount, now() + make_interval(secs => p_lease_s));
  RETURN NULL;
END $$
"""

# Settle once: the reservation's hold leaves `reserved` (unless a peer reclaimed it after its lease ran out)
# and the real cost joins `spent`, in one transaction. Settling an id twice changes nothing. An id with no
# row was reserved while the database was unreachable (the offline share): its cost is charged all the same.
_SETTLE = """
CREATE FUNCTION cr_settle(p_id text, p_instance text, p_period text, p_budgets text[], p_caps bigint[],
                          p_actual bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  r cr_reservation;
  held bigint := 0;
  i int;
BEGIN
  SELECT * INTO r FROM cr_reservation WHERE id = p_id FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO cr_reservation (id, instance, period, budgets, amount, lease_until, settled_at, actual)
      VALUES (p_id, p_instance, p_period, p_budgets, 0, now(), now(), p_actual);
  ELSIF r.settled_at IS NOT NULL THEN
    RETURN false;
  ELSE
    IF r.reclaimed_at IS NULL THEN held := r.amount; END IF;
    UPDATE cr_reservation SET settled_at = now(), actual = p_actual WHERE id = p_id;
  END IF;
  FOR i IN 1 .. coalesce(array_length(p_budgets, 1), 0) LOOP
    INSERT INTO cr_ledger (budget, period, cap) VALUES (p_budgets[i], p_period, p_caps[i]) ON CONFLICT DO NOTHING;
    UPDATE cr_ledger SET reserved = greatest(reserved - held, 0), spent = spent + p_actual
     WHERE budget = p_budgets[i] AND period = p_period;
  END LOOP;
  RETURN true;
END $$
"""

# Any instance may reclaim: a reservation whose lease ran out (its instance stopped renewing: killed, cut off)
# gives its hold back. Should its request still finish, the settle charges the cost without a hold to remove.
_RECLAIM = """
CREATE FUNCTION cr_reclaim() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  b text;
  n int := 0;
BEGIN
  FOR r IN WITH x AS (
      UPDATE cr_reservation SET reclaimed_at = now()
       WHERE id IN (SELECT id FROM cr_reservation
                     WHERE lease_until < now() AND settled_at IS NULL AND reclaimed_at IS NULL
                     ORDER BY id FOR UPDATE SKIP LOCKED)
      RETURNING period, budgets, amount)
    SELECT * FROM x LOOP
    FOREACH b IN ARRAY r.budgets LOOP
      UPDATE cr_ledger SET reserved = greatest(reserved - r.amount, 0) WHERE budget = b AND period = r.period;
    END LOOP;
    n := n + 1;
  END LOOP;
  RETURN n;
END $$
"""

# Settle a request that was held against this instance's allowance (a reservation taken in advance, see
# budget.py) because the ledger was down or slow: its estimate leaves the allowance's hold, its cost joins spent.
# Idempotent by the request's own id. If the allowance was already given back (retired, or reclaimed after its
# lease), its hold is gone already and only the cost is charged.
_SETTLE_DRAW = """
CREATE FUNCTION cr_settle_draw(p_id text, p_parent text, p_instance text, p_period text, p_budgets text[],
                               p_caps bigint[], p_est bigint, p_actual bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  par cr_reservation;
  held bigint := 0;
  i int;
BEGIN
  PERFORM 1 FROM cr_reservation WHERE id = p_id;
  IF FOUND THEN
    RETURN false;
  END IF;
  SELECT * INTO par FROM cr_reservation WHERE id = p_parent FOR UPDATE;
  IF FOUND AND par.settled_at IS NULL AND par.reclaimed_at IS NULL THEN
    held := least(p_est, par.amount);
    UPDATE cr_reservation SET amount = amount - held WHERE id = p_parent;
  END IF;
  INSERT INTO cr_reservation (id, instance, period, budgets, amount, lease_until, settled_at, actual)
    VALUES (p_id, p_instance, p_period, p_budgets, 0, now(), now(), p_actual);
  FOR i IN 1 .. coalesce(array_length(p_budgets, 1), 0) LOOP
    INSERT INTO cr_ledger (budget, period, cap) VALUES (p_budgets[i], p_period, p_caps[i]) ON CONFLICT DO NOTHING;
    UPDATE cr_ledger SET reserved = greatest(reserved - held, 0), spent = spent + p_actual
     WHERE budget = p_budgets[i] AND period = p_period;
  END LOOP;
  RETURN true;
END $$
"""

MIGRATIONS: list[tuple[int, tuple[str, ...]]] = [
    (1, (
        "CREATE TABLE cr_instance (instance text PRIMARY KEY, host text, pid integer, version text,"
        " started_at timestamptz NOT NULL DEFAULT now(), beat_at timestamptz NOT NULL DEFAULT now(),"
        " info jsonb NOT NULL DEFAULT '{}')",
        "CREATE TABLE cr_ledger (budget text NOT NULL, period text NOT NULL, cap bigint NOT NULL DEFAULT 0,"
        " spent bigint NOT NULL DEFAULT 0, reserved bigint NOT NULL DEFAULT 0, PRIMARY KEY (budget, period))",
        "CREATE TABLE cr_reservation (id text PRIMARY KEY, instance text NOT NULL, period text NOT NULL,"
        " budgets text[] NOT NULL, amount bigint NOT NULL, lease_until timestamptz NOT NULL,"
        " created_at timestamptz NOT NULL DEFAULT now(), settled_at timestamptz, reclaimed_at timestamptz,"
        " actual bigint)",
        "CREATE INDEX cr_reservation_open ON cr_reservation (lease_until)"
        " WHERE settled_at IS NULL AND reclaimed_at IS NULL",
        "CREATE INDEX cr_reservation_instance ON cr_reservation (instance)"
        " WHERE settled_at IS NULL AND reclaimed_at IS NULL",
        _RESERVE, _SETTLE, _RECLAIM, _SETTLE_DRAW,
        "CREATE TABLE cr_breaker (provider text PRIMARY KEY, version bigint NOT NULL, state text NOT NULL,"
        " snapshot jsonb NOT NULL, instance text, updated_at timestamptz NOT NULL DEFAULT now(),"
        " probe_holder text, probe_until timestamptz)",
        _JOURNAL_DDL,
        "CREATE INDEX cr_journal_ts ON cr_journal (ts)",
        "CREATE INDEX cr_journal_provider_ts ON cr_journal (provider, ts)",
    )),
    # Team keys (issue 41, cluster/keys.py): a record per key (never a secret: HMAC digests only), a version
    # from one sequence (what instances poll), last use on its own (written behind, never a version bump), and
    # the hash key every instance hashes secrets with.
    (2, (
        "CREATE SEQUENCE cr_key_version",
        "CREATE TABLE cr_key (name text PRIMARY KEY, version bigint NOT NULL, record jsonb NOT NULL,"
        " last_used double precision, expiry_noted boolean NOT NULL DEFAULT false,"
        " updated_at timestamptz NOT NULL DEFAULT now())",
        "CREATE TABLE cr_key_meta (id integer PRIMARY KEY CHECK (id = 1), hash_key text NOT NULL)",
    )),
]

LATEST = MIGRATIONS[-1][0]


class SchemaTooNew(RuntimeError):
    pass


class SchemaConflict(RuntimeError):
    """The database answers, but what is there under our names is not ours (another application's tables, a
    cr_schema of another shape) or may not be created: no retry fixes that, a person must."""


# SQLSTATE classes that mean "the database answered and refused": 42 (syntax error or access rule violation:
# duplicate table/function, undefined column, insufficient privilege, wrong object type) and 22 (data exception).
_REFUSALS = ("42", "22")


def _conflict(e: BaseException) -> SchemaConflict | None:
    state = getattr(e, "sqlstate", None)
    if not isinstance(state, str) or not state.startswith(_REFUSALS):
        return None
    first = (str(e).splitlines() or [""])[0]
    return SchemaConflict(f"the database refuses coderouterd's schema ({first} [SQLSTATE {state}]): it holds "
                          "objects under coderouterd's names (cr_*) that coderouterd did not make, or the user "
                          "may not create them; give coderouterd a database (or user) of its own")


async def migrate(conn: Conn) -> tuple[int, int]:
    """Bring the schema to LATEST on an autocommit connection. Returns (version found, version now). Concurrent
    callers queue on the advisory lock, so each migration runs exactly once."""
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        return await _migrate_locked(conn)
    except Exception as e:
        conflict = _conflict(e)
        if conflict is not None:
            raise conflict from e
        raise
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


async def _migrate_locked(conn: Conn) -> tuple[int, int]:
    await conn.execute("CREATE TABLE IF NOT EXISTS cr_schema (version integer PRIMARY KEY,"
                       " applied_at timestamptz NOT NULL DEFAULT now())")
    cur = await conn.execute("SELECT coalesce(max(version), 0) FROM cr_schema")
    found = await scalar(cur)
    if found > LATEST:
        # A newer coderouterd migrated it: its tables may mean things this one would misread.
        raise SchemaTooNew(f"shared state schema is v{found}; this coderouterd knows up to v{LATEST}")
    for version, statements in MIGRATIONS:
        if version <= found:
            continue
        async with conn.transaction():
            for sql in statements:
                await conn.execute(sql)
            await conn.execute("INSERT INTO cr_schema (version) VALUES (%s)", (version,))
        log.info("shared state: schema migrated to v%d", version)
    return found, LATEST
