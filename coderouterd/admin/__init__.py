"""The admin API on a Unix domain socket: the only control surface of the daemon (never the proxy's port)."""
