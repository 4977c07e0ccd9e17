"""Prefix affinity: every turn goes where its prompt prefix is already cached.

Pure parts (session keys, canonical prefix, prefix index, slot choice, cache-bust naming) live in their own
modules with no I/O; `service` is the one place that talks to backends (slot discovery, save/restore) and
to the rest of the daemon."""
