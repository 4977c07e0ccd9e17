"""Who may read the dashboard: the Host check (DNS rebinding), the key check, and the headers every answer carries.

Pure functions over a request's headers and the listening address, so they are tested without a server.

- Host: a page on another site that rebinds its own name to 127.0.0.1 makes the user's browser send *its* name
  as Host. Only the names this daemon is reached by on this machine are accepted (localhost, 127.0.0.1, [::1]
  and the configured listen address, each with the port the request came in on); anything else, or no Host at
  all, is refused before any data is read.
- Key: with `server.api_keys` set or any team key (`corectl keys`), a browser proves it holds one through a
  cookie set by the login form. The cookie holds an HMAC of the key under a secret drawn at start-up, never the
  key itself: it is worthless after a restart and stops working as soon as its key is removed from the config.
  A team key's cookie is `t.NAME.MAC`, the MAC over its name and its stored digest: it stops working when the
  key is revoked, expires or is rotated. HttpOnly (no script reads
  it), SameSite=Strict (no other site's page sends it), Path=/ui. Scripts may send the key as the proxy's
  clients do (x-api-key or Authorization: Bearer).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import TYPE_CHECKING

from ..ingress.auth import key_accepted, presented_key
from ..ingress.browsers import BrowserGuard, host_names
from ..keys.registry import Check

if TYPE_CHECKING:
    from ..keys.registry import KeyRegistry

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

    def team_token(self, name: str, digest: str) -> str:
        return hmac.new(self._secret, f"team:{name}:{digest}".encode(), hashlib.sha256).hexdigest()

    def authorized(self, headers: dict[str, str], keys: list[str], team: KeyRegistry | None = None) -> bool:
        """No keys configured and no team key: open (the Host check still applies). Otherwise the cookie or a
        key header (an operator key, or any valid team key)."""
        if not keys and (team is None or not team.required):
            return True
        given = cookie_value(headers)
        if given:
            if given.startswith("t.") and team is not None:
                name, _sep, mac = given[2:].rpartition(".")
                rec = team.get(name)
                # Made from the current secret, or from the previous one during a rotation's grace (login).
                for digest in (rec.digest, rec.prev_digest) if rec is not None else ():
                    if digest and hmac.compare_digest(mac.encode(), self.team_token(name, digest).encode()):
                        return team.verify_name_digest(name, digest) is not None
            # Every configured key's token is compared, so a cookie for a key since removed fails.
            elif any(hmac.compare_digest(given.encode(), self.token(k).encode()) for k in keys):
                return True
        presented = presented_key(headers)
        if keys and key_accepted(presented, keys):
            return True
        return team is not None and team.required and team.check(presented, time.time())[0] is Check.OK

    def login(self, key: str, keys: list[str], team: KeyRegistry | None = None) -> str | None:
        """The Set-Cookie value for a correct key (an operator key or a valid team key), else None."""
        key = key.strip()
        if keys and key_accepted(key, keys):
            return f"{COOKIE}={self.token(key)}; Path=/ui; HttpOnly; SameSite=Strict"
        if team is None or not team.required:
            return None
        verdict, k = team.check(key, time.time())
        rec = team.get(k.name) if verdict is Check.OK and k is not None else None
        if rec is None or team.hasher is None:
            return None
        # Bound to the digest of the secret presented (the previous one during a rotation's grace): the cookie
        # stops working when that secret does.
        digest = team.hasher.hex(key)
        return f"{COOKIE}=t.{rec.name}.{self.team_token(rec.name, digest)}; Path=/ui; HttpOnly; SameSite=Strict"


def origin_allowed(headers: dict[str, str], allowed: frozenset[str]) -> bool:
    """A form post must come from our own page: its Origin (when the browser sends one) names an allowed host."""
    origin = headers.get("origin")
    if origin is None:
        return True
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme == "http" and rest.lower() in allowed
