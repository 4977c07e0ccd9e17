"""A managed provider's connections go only to the addresses its server was verified to hold at READY
(providers/pinning.py, providers/pinned_connector.py): the rule alone, then a real pool over loopback with our
listener on 127.0.0.1 and another on [::1] of the same port, `localhost` resolving to both (::1 first)."""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import orjson
import pytest

from coderouterd.providers.pinning import NOT_READY, Verified, covers, is_local, pin
from coderouterd.providers.pool import Pool

P = 8080
LOCALHOST = ["::1", "127.0.0.1"]  # as most machines resolve it (and glibc sorts it)


def test_only_the_addresses_a_verified_socket_takes_are_kept():
    ours = Verified(frozenset({("127.0.0.1", P)}), frozenset({"10.1.2.3"}))
    assert pin("localhost", P, LOCALHOST, ours, "llm") == ["127.0.0.1"]
    assert pin("127.0.0.1", P, ["127.0.0.1"], ours, "llm") == ["127.0.0.1"]
    # Each family's wildcard takes its own family; `::` is taken as dual-stack (Linux's default).
    assert pin("localhost", P, LOCALHOST, Verified(frozenset({("0.0.0.0", P)})), "llm") == ["127.0.0.1"]
    assert pin("localhost", P, LOCALHOST, Verified(frozenset({("::", P)})), "llm") == LOCALHOST
    assert pin("localhost", P, LOCALHOST, Verified(frozenset({("::1", P), ("127.0.0.1", P)})), "llm") == LOCALHOST
    # The machine's own address (not loopback) is local too, and an IPv4-mapped one is its IPv4 form.
    assert pin("box", P, ["10.1.2.3"], Verified(frozenset({("0.0.0.0", P)}), frozenset({"10.1.2.3"})),
               "llm") == ["10.1.2.3"]
    assert covers(frozenset({("::ffff:127.0.0.1", P)}), "127.0.0.1", P)
    assert is_local("::ffff:127.0.0.1", frozenset()) and is_local("0.0.0.0", frozenset())
    assert not is_local("192.0.2.7", frozenset({"10.1.2.3"}))


def test_a_socket_on_another_port_or_address_takes_nothing_and_the_refusal_says_why():
    ours = Verified(frozenset({("127.0.0.1", P), ("::1", P + 1)}))
    with pytest.raises(ConnectionRefusedError) as e:
        pin("localhost", P, ["::1"], ours, "llm")
    assert e.value.errno == errno.ECONNREFUSED
    assert e.value.strerror == (f"provider llm: not connected to localhost:{P}: localhost is ::1, and the server "
                                f"verified when it became ready listens on 127.0.0.1:{P}: a listener at another "
                                f"address may be another user's")
    with pytest.raises(ConnectionRefusedError, match="listens on no address of port 9"):
        pin("localhost", 9, LOCALHOST, ours, "llm")


def test_not_ready_connects_nowhere_and_no_check_changes_nothing():
    with pytest.raises(ConnectionRefusedError, match="its managed server is not ready"):
        pin("localhost", P, LOCALHOST, NOT_READY, "llm")
    with pytest.raises(ConnectionRefusedError):
        pin("far.example", P, ["192.0.2.7"], NOT_READY, "llm")  # not even another machine's: nothing is verified
    assert pin("localhost", P, LOCALHOST, None, "llm") == LOCALHOST  # no ready_url: not pinned, as before


def test_another_machines_server_is_not_pinned():
    ours = Verified(frozenset({("127.0.0.1", 1234)}), frozenset({"10.1.2.3"}))
    assert pin("gpu.example", P, ["192.0.2.7", "2001:db8::7"], ours, "llm") == ["192.0.2.7", "2001:db8::7"]


# -- a real pool -------------------------------------------------------------------------------------------------


class _Recorder(ThreadingHTTPServer):
    def __init__(self, host: str, port: int, name: str) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.name = name
        self.paths: list[str] = []
        super().__init__((host, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        assert isinstance(server, _Recorder)
        server.paths.append(self.path)
        body = server.name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(host: str, port: int, name: str) -> _Recorder:
    srv = _Recorder(host, port, name)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def two_listeners(monkeypatch) -> Iterator[tuple[int, _Recorder, _Recorder]]:
    """Ours on 127.0.0.1:P, another on [::1]:P, and `localhost` resolving to ::1 first, then 127.0.0.1."""
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    ours = _serve("127.0.0.1", 0, "ours")
    port = ours.server_address[1]
    try:
        other = _serve("::1", port, "other")
    except OSError as e:
        ours.shutdown()
        ours.server_close()
        pytest.skip(f"[::1]:{port} cannot be bound here ({e})")
    real = socket.getaddrinfo

    def both(host, *args, **kwargs):
        if host == "localhost":
            p = args[0] if args else kwargs.get("port", 0)
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", p, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", both)
    try:
        yield port, ours, other
    finally:
        for srv in (ours, other):
            srv.shutdown()
            srv.server_close()


async def _get(pool: Pool, url: str) -> str:
    try:
        async with pool.session().get(url) as r:
            return await r.text()
    finally:
        await pool.close()


def test_the_pool_of_a_managed_provider_never_connects_to_the_other_listener(two_listeners):
    port, ours, other = two_listeners
    verified = Verified(frozenset({("127.0.0.1", port)}))
    url = f"http://localhost:{port}/v1/models"
    # The control: an unpinned pool takes ::1, the first address: the listener that is not ours.
    assert asyncio.run(_get(Pool(5.0), url)) == "other"
    assert other.paths == ["/v1/models"]
    for _ in range(3):  # a fresh session (and connection) each time: each one resolves again
        assert asyncio.run(_get(Pool(5.0, pinned=("llm", lambda: verified)), url)) == "ours"
    assert other.paths == ["/v1/models"] and ours.paths == ["/v1/models"] * 3


def test_each_connection_reads_the_current_verification(two_listeners):
    """A restart's READY verifies again: the next connection of the same pool goes where the new one says, and an
    address literal (which aiohttp resolves without asking any resolver) is held to it too."""
    port, ours, other = two_listeners
    current = [Verified(frozenset({("::1", port)}))]  # say the server we verified had listened on ::1
    pool = Pool(5.0, pinned=("llm", lambda: current[0]))

    async def scenario() -> None:
        try:
            async with pool.session().get(f"http://localhost:{port}/a", headers={"Connection": "close"}) as r:
                assert await r.text() == "other"
            current[0] = Verified(frozenset({("127.0.0.1", port)}))  # restarted: now it holds 127.0.0.1
            async with pool.session().get(f"http://localhost:{port}/b", headers={"Connection": "close"}) as r:
                assert await r.text() == "ours"
            with pytest.raises(aiohttp.ClientConnectorError, match="not connected to ::1"):
                await pool.session().get(f"http://[::1]:{port}/c")
            current[0] = NOT_READY  # crashed: nothing is verified until the next READY
            with pytest.raises(aiohttp.ClientConnectorError, match="its managed server is not ready"):
                await pool.session().get(f"http://127.0.0.1:{port}/d")
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert other.paths == ["/a"] and ours.paths == ["/b"]


# -- the warning of `corectl config check` ------------------------------------------------------------------------

MANAGED = """
[providers.llama]
base_url = "http://@HOST@:8080/v1"
[providers.llama.process]
command = ["/bin/sh", "-c", "exec llama-server --host 127.0.0.1 --port 8080"]
ready_url = "http://127.0.0.1:8080/health"
[providers.far]
base_url = "http://localhost:9090/v1"
[profiles.default]
providers = ["llama", "far"]
"""


@pytest.fixture
def localhost_is(monkeypatch, tmp_path):
    """`localhost` resolves to the addresses given (this machine's own resolver may give one or both)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("CODEROUTER_CONFIG", raising=False)
    real = socket.getaddrinfo

    def use(*addrs: str) -> None:
        def fake(host, *args, **kwargs):
            if host != "localhost":
                return real(host, *args, **kwargs)
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, 0, 0, 0)) if ":" in a
                    else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addrs]

        monkeypatch.setattr(socket, "getaddrinfo", fake)

    return use


def test_config_check_warns_of_a_managed_base_url_naming_several_local_addresses(capsys, tmp_path, localhost_is):
    from corectl.__main__ import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(MANAGED.replace("@HOST@", "localhost"))
    localhost_is("::1", "127.0.0.1")
    assert main(["config", "check", str(cfg)]) == 0  # a warning, not an error
    out = " ".join(capsys.readouterr().out.split())
    assert ('provider llama: base_url http://localhost:8080/v1 names localhost, which is 2 addresses of this machine '
            '(127.0.0.1, ::1): another local user could listen on one its server leaves free. coderouterd sends '
            'requests only where the server listened when it became ready; to leave nothing to chance, write '
            'base_url = "http://127.0.0.1:8080/v1" (and --host 127.0.0.1 in the server\'s command, 127.0.0.1 in '
            'ready_url)') in out, out
    assert "provider far" not in out  # not managed: not pinned, not warned about
    # One address for the name, or an address written out: nothing to say.
    localhost_is("127.0.0.1")
    assert main(["config", "check", str(cfg)]) == 0
    assert "addresses of this machine" not in capsys.readouterr().out
    localhost_is("::1", "127.0.0.1")
    cfg.write_text(MANAGED.replace("@HOST@", "127.0.0.1"))
    assert main(["config", "check", str(cfg), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["unused"] == []
