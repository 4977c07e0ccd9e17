"""The admin API's version, sent by the daemon on every answer and checked by corectl (see apitype.py).
A module of its own so that corectl's fast path reads two constants without building the typed shapes."""

API_VERSION = 1
API_VERSION_HEADER = "x-coderouter-api-version"
