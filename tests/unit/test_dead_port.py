"""A dead port stays dead for the whole test: connects are refused, and nobody else can take it."""

import errno
import socket

import pytest

from tests.support.ports import dead_port


def test_a_dead_port_refuses_connects_and_cannot_be_taken_by_a_listener():
    port = dead_port()
    with socket.socket() as client, pytest.raises(ConnectionRefusedError):
        client.connect(("127.0.0.1", port))
    # A server (uvicorn, aiohttp) sets SO_REUSEADDR before it binds: even so, the port is not given to it.
    with socket.socket() as taker:
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError) as e:
            taker.bind(("127.0.0.1", port))
        assert e.value.errno == errno.EADDRINUSE
