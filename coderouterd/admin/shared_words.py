"""The shared database's problem in words (issue 43, E16): the driver's text ("OperationalError: connection failed:
connection to server at "10.0.0.5", port 5432 failed: Connection refused") says what happened to a socket; the
page says what it means for the user, and keeps the driver's text beside it for whoever digs further."""

from __future__ import annotations

# (a fragment of the driver's text, lower-cased) -> what it means. The first that matches wins: the specific
# ones first.
_MEANINGS: tuple[tuple[str, str], ...] = (
    ("password authentication failed", "it refused the password in the DSN"),
    ("no password supplied", "it wants a password and the DSN has none"),
    ('role "', "the user in the DSN does not exist on the server"),
    ('database "', "the database in the DSN does not exist on the server"),
    ("could not translate host name", "its host name does not resolve"),
    ("name or service not known", "its host name does not resolve"),
    ("nodename nor servname", "its host name does not resolve"),
    ("connection refused", "nothing listens at its address (the server is down or on another port)"),
    ("no route to host", "its host cannot be reached from here"),
    ("network is unreachable", "its network cannot be reached from here"),
    ("timeout", "it did not answer in time"),
    ("timed out", "it did not answer in time"),
    ("too many connections", "it has no connection left for us (too many clients)"),
    ("the database system is starting up", "it is starting up"),
    ("the database system is shutting down", "it is shutting down"),
    ("server closed the connection", "it closed the connection"),
    ("terminating connection", "it ended the connection (restarted or stopped by its operator)"),
    ("ssl", "the TLS handshake with it failed"),
    ("schema", "its schema is not one this coderouterd can use"),
)


def meaning(problem: str | None) -> str | None:
    """What the driver's text means, in a few words; None when there is no problem."""
    if not problem:
        return None
    low = problem.lower()
    for fragment, words in _MEANINGS:
        if fragment in low:
            return words
    return "it answered with an error"
