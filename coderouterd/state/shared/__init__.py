"""Storage shared by several coderouterd instances through PostgreSQL (issue 24, README: Several machines).

One job per module: `dsn` (where, and how to show it without the password), `db` (the pool, the bound on
added latency, up/down), `schema` (versioned migrations under an advisory lock), `ledger` (budget
reservations that cannot overspend), `shipper` (the local journal shipped in batches), `journal_read` (reads of
the shipped journal), `instances` (heartbeats and lease renewal).

This is storage only, below routing and guards: the coordination built on it (shared breakers, the shared
budget, the backend the daemon holds) is `coderouterd/cluster/`, which may import routing and guards.

Nothing here is imported unless `[state] backend = "postgres"`: psycopg is an optional extra."""
