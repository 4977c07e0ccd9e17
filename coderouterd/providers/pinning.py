"""Which addresses a managed provider's connections may go to: only those its server held when the supervisor
verified it at READY (issue 43, N9, the gap after READY).

The READY check proves that every listener that could take a connection to the URL is the tree we started. It
cannot stop another local user from binding, afterwards, an address the server left free: `localhost` names
127.0.0.1 and ::1, llama-server `--host 127.0.0.1` binds the first, and anyone may then bind [::1]:PORT. The HTTP
client resolves `localhost` to both and may connect to either (resolution order, happy eyeballs), so a prompt
would reach that listener. So a managed provider's pool keeps, of what a host name resolves to, only the
addresses one of the verified sockets takes: while that socket is held, nobody else can bind its address and
port (Linux refuses another user's socket there, SO_REUSEPORT included). Pure: the supervisor fills `Verified`
(psutil, in a thread), the pool's connector (pinned_connector.py) asks `pin` from memory on each new connection.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verified:
    """What the supervisor saw when a managed server became ready: (address, port) of every listening TCP
    socket of the tree it verified, and this machine's own addresses (a host name that resolves to none of them,
    nor to loopback, is another machine's: nothing local to pin)."""

    sockets: frozenset[tuple[str, int]]
    local: frozenset[str] = frozenset()


# The current instance is not verified (starting, stopped, crashed, or the process is not known yet): nothing it
# could answer at is known to be ours, so nothing is connected to.
NOT_READY = Verified(frozenset())

# provider name -> what its server's last READY verified; None when the provider's process has no ready_url (no
# check ran: connections are not pinned, as before).
PinLookup = Callable[[str], Verified | None]

_WILDCARD_V4, _WILDCARD_V6 = "0.0.0.0", "::"


def plain(ip: str) -> str:
    """An address as the kernel lists a socket's: no zone (fe80::1%eth0), IPv4-mapped as its IPv4 form."""
    ip = ip.split("%", 1)[0]
    return ip[7:] if ip.lower().startswith("::ffff:") and "." in ip else ip


def is_local(ip: str, local: frozenset[str]) -> bool:
    """Is a connection to `ip` one to this machine? Its own addresses, loopback, and the wildcards (connect() to
    0.0.0.0 or :: reaches a local listener)."""
    ip = plain(ip)
    if ip in local or ip in (_WILDCARD_V4, _WILDCARD_V6, ""):
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def covers(sockets: frozenset[tuple[str, int]], ip: str, port: int) -> bool:
    """Does one of `sockets` take a connection to ip:port? Bound to that address, or to its family's wildcard.
    A `::` socket is taken to accept IPv4 too (Linux's default, dual-stack): a server that sets IPV6_V6ONLY on
    it and is reached by an IPv4 address is the one case this trusts without proof (README, N9)."""
    ip = plain(ip)
    v4 = ":" not in ip
    for addr, p in sockets:
        if p != port:
            continue
        if plain(addr) == ip or addr == _WILDCARD_V6 or (v4 and addr == _WILDCARD_V4):
            return True
    return False


def pin(host: str, port: int, addrs: Sequence[str], verified: Verified | None, provider: str) -> list[str]:
    """Of the addresses host:port resolved to, those a connection may go to. Raises ConnectionRefusedError, with
    the reason, when none may."""
    if verified is None:
        return list(addrs)
    if verified is not NOT_READY and not any(is_local(a, verified.local) for a in addrs):
        return list(addrs)  # another machine's server: no local user can bind its port
    kept = [a for a in addrs if covers(verified.sockets, a, port)]
    if kept:
        return kept
    if verified is NOT_READY:
        why = "its managed server is not ready: no listener of it has been verified"
    else:
        held = ", ".join(sorted(f"{a}:{p}" for a, p in verified.sockets if p == port)) or f"no address of port {port}"
        why = (f"{host} is {', '.join(addrs)}, and the server verified when it became ready listens on {held}: "
               f"a listener at another address may be another user's")
    raise ConnectionRefusedError(errno.ECONNREFUSED, f"provider {provider}: not connected to {host}:{port}: {why}")
