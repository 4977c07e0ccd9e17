"""Browsers are not callers: the checks that keep a web page from spending a user's budget or reading answers.

A page on any site the user opens can make the browser send requests to 127.0.0.1. Three things tell such a
request from a coding agent's, and each closes one way in:

- Host. A DNS-rebinding page (its own name resolving to 127.0.0.1 after it loaded) is same-origin with its own
  name, so it can read answers; its requests carry *its* name as Host. Only this daemon's own names are served:
  localhost, 127.0.0.1, [::1] and the listen address, each with the port, plus `[server] allowed_hosts` (a name
  with a port matches exactly, one without matches any port; "*" turns the check off, deliberately).
- Origin / Sec-Fetch-Site. A browser marks every cross-origin POST with Origin (`null` from a sandboxed or
  opaque page) and, in current browsers, every request with Sec-Fetch-Site. Either one naming another site is
  refused unless the origin is listed in `[server] cors_origins`; a listed origin gets real CORS answers
  (preflight included). Agents and SDKs send neither header.
- Content type. `text/plain`, form types and a typeless Blob are what a page can POST without a preflight;
  every real client declares `application/json` (docs/decisions.md lists what each sends). A JSON route refuses
  anything else with 415, so even a request that slipped past the checks above is never parsed.

Pure over the raw ASGI header list, built once per (config, port): one pass over the headers per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .asgi import Message, Send

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")

# Routes whose POST body is JSON (the 415 check).
JSON_ROUTES = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/messages/count_tokens"})

# What a listed browser origin may send in a preflighted request, and what it may read back.
_ALLOW_METHODS = b"GET, POST, OPTIONS"
_ALLOW_HEADERS_DEFAULT = (b"content-type, authorization, x-api-key, x-goog-api-key, anthropic-version, anthropic-beta, "
                          b"x-coderouter-profile, x-request-id")
_EXPOSE_HEADERS = (b"x-coderouter-profile, x-coderouter-attempts, x-coderouter-provider, x-request-id, "
                   b"request-id, retry-after")
_PREFLIGHT_MAX_AGE = b"600"


def host_names(listen_host: str, port: int) -> frozenset[str]:
    """The Host values a client on this machine sends for this daemon (lower case, with the port; without it
    too on port 80, where clients leave it out)."""
    configured = f"[{listen_host}]" if ":" in listen_host and not listen_host.startswith("[") else listen_host
    names = {*_LOOPBACK_NAMES, configured.lower()}
    out = {f"{n}:{port}" for n in names}
    if port == 80:
        out |= names
    return frozenset(out)


def _split_host(value: str) -> tuple[str, str | None]:
    """`name[:port]` -> (name, port or None); an IPv6 literal keeps its brackets."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            return v, None
        rest = v[end + 1:]
        return v[:end + 1], rest[1:] if rest.startswith(":") else None
    name, sep, port = v.rpartition(":")
    if sep and port.isdigit():
        return name, port
    return v, None


def normalise_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    error_type: str
    reason: str  # host | origin | content_type (the metric's label)


class BrowserGuard:
    """The checks for one config generation and one listening port."""

    def __init__(self, listen_host: str, port: int, allowed_hosts: list[str] | tuple[str, ...] = (),
                 cors_origins: list[str] | tuple[str, ...] = ()) -> None:
        self.port = port
        self.any_host = "*" in allowed_hosts
        exact = set(host_names(listen_host, port))
        # Bare loopback names too: a browser leaves the port out only for port 80, and a page there is another
        # origin (refused by the Origin check); what rebinding needs, a foreign name, never gets in this way.
        exact |= set(_LOOPBACK_NAMES)
        names: set[str] = set()
        for h in allowed_hosts:
            if h == "*":
                continue
            name, p = _split_host(h)
            if p is None:
                names.add(name)
            else:
                exact.add(f"{name}:{p}")
        self._exact = frozenset(v.encode() for v in exact)
        self._names = frozenset(names)  # configured names that match with any port, or none
        self._own_origins = frozenset(f"http://{h}".encode() for h in host_names(listen_host, port))
        self._cors = frozenset(normalise_origin(o).encode() for o in cors_origins)

    # -- the three checks --------------------------------------------------------------------------------------

    def host_ok(self, host: bytes | None) -> bool:
        if self.any_host:
            return True
        if host is None:
            return True  # only HTTP/1.0 clients leave Host out, and browsers are not among them
        h = host.strip().lower()
        if h in self._exact:
            return True
        if self._names:
            name, _port = _split_host(h.decode("latin-1"))
            return name in self._names
        return False

    def cors_origin(self, origin: bytes | None) -> bytes | None:
        """The origin as listed in cors_origins (to be echoed in Access-Control-Allow-Origin), else None."""
        if origin is None or not self._cors:
            return None
        o = origin.strip().lower().rstrip(b"/")
        return o if o in self._cors else None

    def refusal(self, path: str, method: str, headers: list[tuple[bytes, bytes]], *,
                host_checked: bool = True) -> tuple[Refusal | None, bytes | None]:
        """(why this request is refused, or None; the listed CORS origin it came from, or None). `host_checked`
        False: the Host was vouched for otherwise (the request carries a valid key, dispatch.py)."""
        host = origin = fetch_site = ctype = None
        for k, v in headers:
            if k == b"host":
                host = v
            elif k == b"origin":
                origin = v
            elif k == b"sec-fetch-site":
                fetch_site = v
            elif k == b"content-type":
                ctype = v
        if host_checked and not self.host_ok(host):
            shown = (host or b"").decode("latin-1")[:100]
            return Refusal(403, f"Host {shown!r} is not one of this coderouterd's names; a web page reached it "
                                f"through DNS rebinding, or the daemon is behind a name it was not told about: "
                                f"send a valid API key (requests with one are served under any name), or add "
                                f"that name to [server] allowed_hosts", "permission_error", "host"), None
        listed = None
        if origin is not None:
            o = origin.strip().lower().rstrip(b"/")
            if o not in self._own_origins:
                listed = self.cors_origin(origin)
                if listed is None:
                    return Refusal(403, f"cross-origin request from {origin.decode('latin-1')[:100]!r} refused: "
                                        "browsers may call this API only from origins listed in [server] "
                                        "cors_origins", "permission_error", "origin"), None
        elif fetch_site in (b"cross-site", b"same-site"):
            return Refusal(403, "cross-site browser request refused (Sec-Fetch-Site: "
                                f"{fetch_site.decode('latin-1')}): list the page's origin in [server] cors_origins",
                           "permission_error", "origin"), None
        if method == "POST" and path in JSON_ROUTES and not is_json_type(ctype):
            shown = ctype.decode("latin-1")[:100] if ctype else "none"
            return Refusal(415, f"request body must be declared as JSON (content-type: application/json); got "
                                f"{shown}", "invalid_request_error", "content_type"), listed
        return None, listed

    # -- CORS answers for listed origins -----------------------------------------------------------------------

    @staticmethod
    def cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin"),
                (b"access-control-expose-headers", _EXPOSE_HEADERS)]

    @staticmethod
    def preflight_headers(origin: bytes, requested: bytes | None) -> list[tuple[bytes, bytes]]:
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin"),
                (b"access-control-allow-methods", _ALLOW_METHODS),
                (b"access-control-allow-headers", requested.strip() if requested else _ALLOW_HEADERS_DEFAULT),
                (b"access-control-max-age", _PREFLIGHT_MAX_AGE), (b"content-length", b"0")]


def is_json_type(ctype: bytes | None) -> bool:
    """application/json or a +json type, with any parameters (charset=utf-8 and such)."""
    if not ctype:
        return False
    media = ctype.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def with_cors(send: Send, origin: bytes) -> Send:
    """The server's send with CORS headers added to the response head, for a request from a listed origin."""
    extra = BrowserGuard.cors_headers(origin)

    def wrapped(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        return send(message)

    return wrapped


def _loopback_host(host: str) -> bool:
    import ipaddress

    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def remote_access(host: str, allowed_hosts: list[str] | tuple[str, ...]) -> str:
    """What another machine gets from this daemon, in words (`coderouterd --check`, the start-up log and
    `corectl status` say it). Binding beyond loopback needs [server] api_keys (config), so a key is always
    required there."""
    if _loopback_host(host):
        return f"other machines cannot connect (listening on {host}: this machine only)"
    names = [h for h in allowed_hosts if h != "*"]
    served = ("other machines: served only with a valid API key ([server] api_keys, or a team key from "
              "`corectl keys create`), under whatever host name they use")
    if "*" in allowed_hosts:
        without = "without a key: 401"
    elif names:
        without = f"without a key: 401 when they use {', '.join(names)}, 403 under any other name (the Host check)"
    else:
        without = "without a key: 403 (the Host check: the name they use is not in [server] allowed_hosts)"
    return f"{served}; a wrong key: 401; {without}"
