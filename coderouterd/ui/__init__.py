"""The read-only web dashboard served at /ui on the proxy's port (README: "The dashboard").

Only `feed` is imported at start-up (the daemon subscribes it to the bus); the rest is imported by the first
request for /ui, so the daemon's start and the proxy's requests pay nothing for a page nobody opens."""
