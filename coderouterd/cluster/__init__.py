"""Coordination between several coderouterd instances (issue 24, README: Several machines): what they agree on
through the shared state, above routing and guards (whose breakers and budget it shares) and below the daemon.

One job per module: `budget` (the budget guard over the shared ledger, with the offline share), `breakers`
(compare-and-set rows, NOTIFY/LISTEN and a poll, the half-open probe lease), `backend` (the state backend the
daemon holds: SQLite-only or shared, composing the storage of `state/shared/` with the two above).

The storage itself (pool, DSN, schema, ledger, journal shipping, heartbeats) is `state/shared/`, below routing.
Nothing but `backend` is imported unless `[state] backend = "postgres"`: psycopg is an optional extra."""
