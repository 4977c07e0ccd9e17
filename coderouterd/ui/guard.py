"""Who may read the dashboard: the Host check (DNS rebinding), the key check, and the headers every answer carries.

Pure functions over a request's headers and the listening address, so they are tested without a server.

- Host: a page on another site that rebinds its own name to 127.0.0.1 makes the user's browser send *its* name
  as Host. Only the names this daemon is reached by on this machine are accepted (localhost, 127.0.0.1, [::1]
  and the configured listen address, each with the port the request came in on); anything else, or no Host at
  all, is refused before any data is read.
- Key: with `server.api_keys` set, a browser proves it holds one through a cookie set by the login form. The
  cookie holds an HMAC of the key under a secret drawn at start-up, never the key itself: it is worthless
  after a restart and stops working as soon as its key is removed from the config. HttpOnly (no script reads
  it), SameSite=Strict (no other site's page sends it), Path=/ui. Scripts may send the key as the proxy's
  clients do (x-api-key or Authorization: Bearer).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from ..ingress.auth import key_accepted, presented_key
from ..ingress.browsers import BrowserGuard, host_names

COOKIE = "coderouter_ui"

# No inline script or style anywhere (the page's code is served as files); nothing loaded from elsewhere; the page
# cannot be framed, and its forms post only to itself.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

# Every /ui answer carries these. No Access-Control-* header ever: another origin's script gets nothing.
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: with no-referrer a browser sends `Origin: null` on a form post, and the
    # login form's Origin is what tells our own page from another site's.
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]

def allowed_hosts(listen_host: str, port: int) -> frozenset[str]:
    """The Host values a browser on this machine sends for this daemon (one definition with the API's check)."""
    return host_names(listen_host, port)


def host_allowed(host: str | None, allowed: frozenset[str], extra: BrowserGuard | None = None) -> bool:
    """`extra`: the API's guard, which also knows `[server] allowed_hosts`."""
    if not host:
        return False  # HTTP/1.0 without Host: nothing to check it against, so no
    if host.strip().lower() in allowed:
        return True
    return extra is not None and extra.host_ok(host.encode("latin-1"))


def cookie_value(headers: dict[str, str], name: str = COOKIE) -> str | None:
    """One cookie's value from the Cookie header (browsers join several with "; ")."""
    raw = headers.get("cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        k, sep, v = part.strip().partition("=")
        if sep and k == name:
            return v.strip()
    return None


class UiAuth:
    """The key check for the dashboard. `secret` is drawn per daemon process: cookies die with it."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else os.urandom(32)

    def token(self, key: str) -> str:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()

    def authorized(self, headers: dict[str, str], keys: list[str]) -> bool:
        """No keys configured: open (the Host check still applies). Otherwise the cookie or a key header."""
        if not keys:
            return True
        given = cookie_value(headers)
        if given:
            # Every configured key's token is compared, so a cookie for a key since removed fails.
            if any(hmac.compare_digest(given.encode(), self.token(k).encode()) for k in keys):
                return True
        return key_accepted(presented_key(headers), keys)

    def login(self, key: str, keys: list[str]) -> str | None:
        """The Set-Cookie value for a correct key, else None."""
        if not keys or not key_accepted(key.strip(), keys):
            return None
        return f"{COOKIE}={self.token(key.strip())}; Path=/ui; HttpOnly; SameSite=Strict"


def origin_allowed(headers: dict[str, str], allowed: frozenset[str]) -> bool:
    """A form post must come from our own page: its Origin (when the browser sends one) names an allowed host."""
    origin = headers.get("origin")
    if origin is None:
        return True
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme == "http" and rest.lower() in allowed
