"""State shared by several coderouterd instances through PostgreSQL (issue 24, README: Several machines).

One job per module: `dsn` (where, and how to show it without the password), `db` (the pool, the bound on
added latency, up/down), `schema` (versioned migrations under an advisory lock), `ledger` (budget
reservations that cannot overspend), `budget` (the budget guard over the ledger, with the offline share),
`breakers` (compare-and-set rows, NOTIFY/LISTEN and a poll, the half-open probe lease), `shipper` (the local
journal shipped in batches), `instances` (heartbeats and lease renewal), `backend` (the state backend the
daemon holds: SQLite-only or shared).

Nothing here is imported unless `[state] backend = "postgres"`: psycopg is an optional extra."""
