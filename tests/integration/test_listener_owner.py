"""`adopt.serves_from_tree`: whose listener answers a ready_url, against the tree a start of ours created. Real
sockets and processes on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from coderouterd.supervise import adopt
from tests.integration.test_supervise import free_port

LISTEN = "import socket, sys, time\ns = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n" \
         "print('up', flush=True); time.sleep(120)\n"


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def listener(procs: list, host: str, port: int, *, under: list[str] | None = None) -> subprocess.Popen:
    """A process that listens on host:port (through `under`, e.g. a shell that starts it as its child)."""
    argv = [*(under or []), sys.executable, "-c", LISTEN, host, str(port)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    return p


def sleeper(procs: list) -> subprocess.Popen:
    """The server "we started", holding no port (the other listeners in these tests are not in its tree)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    procs.append(p)
    return p


def test_a_listener_in_our_own_process_is_ours():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        v = adopt.serves_from_tree(f"http://127.0.0.1:{port}/health", os.getpid(), None)
    assert v.ok and f"port {port} is held by the server we started (pid {os.getpid()})" == v.reason, v


def test_a_listener_of_another_process_is_named_and_refused(procs):
    port = free_port()
    other = listener(procs, "127.0.0.1", port)
    ours = sleeper(procs)
    v = adopt.serves_from_tree(f"http://127.0.0.1:{port}/health", ours.pid, None)
    assert not v.ok and f"port {port} is held by pid {other.pid}" in v.reason, v
    assert "command " in v.reason and f"not by the server we started (pid {ours.pid})" in v.reason


def test_a_wildcard_listener_takes_a_loopback_url_too(procs):
    port = free_port()
    other = listener(procs, "0.0.0.0", port)
    v = adopt.serves_from_tree(f"http://localhost:{port}/health", sleeper(procs).pid, None)
    assert not v.ok and f"pid {other.pid}" in v.reason, v


def test_the_listener_of_a_child_of_the_started_process_is_ours(procs):
    """The configured command is a wrapper (a shell) and the server is its child: the tree holds the port."""
    port = free_port()
    wrapper = listener(procs, "127.0.0.1", port, under=["/bin/sh", "-c", '"$@"; exit', "sh"])
    v = adopt.serves_from_tree(f"http://127.0.0.1:{port}/health", wrapper.pid, None)
    assert v.ok, v


def test_a_listener_on_another_address_of_the_port_does_not_count(procs):
    """Ours on 127.0.0.1, someone else's on 127.0.0.2: a connection to 127.0.0.1 reaches ours only."""
    port = free_port()
    ours = listener(procs, "127.0.0.1", port)
    try:
        listener(procs, "127.0.0.2", port)
    except AssertionError:
        pytest.skip("127.0.0.2 cannot be bound here")
    assert adopt.serves_from_tree(f"http://127.0.0.1:{port}/health", ours.pid, None).ok
    assert not adopt.serves_from_tree(f"http://127.0.0.2:{port}/health", ours.pid, None).ok


def test_nobody_listening_is_refused_and_a_server_gone_is_said():
    port = free_port()
    v = adopt.serves_from_tree(f"http://127.0.0.1:{port}/health", os.getpid(), None)
    assert not v.ok and "no listener on it belongs to the server we started" in v.reason, v
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ctime = time.time() - 1000  # whatever holds the pid now was not created then
    v = adopt.serves_from_tree(f"http://127.0.0.1:{port}/health", gone.pid, ctime)
    assert not v.ok and f"the server we started (pid {gone.pid}) is gone" in v.reason, v


def test_a_host_that_is_not_this_machine_is_not_checked():
    v = adopt.serves_from_tree("http://192.0.2.7:8080/health", os.getpid(), None)  # TEST-NET-1: never local
    assert v.ok and "not this machine" in v.reason, v


@pytest.mark.parametrize("host, url_host", [
    ("127.0.0.1", "0.0.0.0"),  # connect() to 0.0.0.0 reaches this machine (loopback on Linux)
    ("127.0.0.1", "[::ffff:127.0.0.1]"),  # an IPv4-mapped loopback address is loopback
    ("::1", "[::]"),  # connect() to :: reaches ::1
])
def test_a_wildcard_or_mapped_ready_url_host_is_this_machine(procs, host, url_host):
    """A ready_url naming the wildcard address (as `--host 0.0.0.0` invites) or a mapped loopback address is
    answered by this machine: another user's listener there is an impostor, not "another host's" server."""
    port = free_port()
    try:
        other = listener(procs, host, port)
    except AssertionError:
        pytest.skip(f"{host} cannot be bound here")
    v = adopt.serves_from_tree(f"http://{url_host}:{port}/health", sleeper(procs).pid, None)
    assert not v.ok and f"pid {other.pid}" in v.reason, v


def test_adopting_the_configured_command_needs_every_listener_its_url_reaches(procs, monkeypatch):
    """Before a start (adopt = "verify"): the configured command listens on 127.0.0.1, and someone else on ::1 of the
    same port. A ready_url whose host names both (`localhost` on most machines) sends some connections to the other
    one, so the configured command is not adopted on the first listener's word."""
    port = free_port()
    ours = listener(procs, "127.0.0.1", port)  # first: the lower pid, the listener verify used to look at alone
    try:
        other = listener(procs, "::1", port)
    except AssertionError:
        pytest.skip("::1 cannot be bound here")
    real = socket.getaddrinfo

    def both(host, *args, **kwargs):  # a resolver that gives localhost both addresses, as most machines' do
        if host == "localhost":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", both)
    command = [sys.executable, "-c", LISTEN, "127.0.0.1", str(port)]
    assert adopt.verify(f"http://127.0.0.1:{port}/health", command).ok  # the control: its own address alone
    v = adopt.verify(f"http://localhost:{port}/health", command)
    assert not v.ok and f"pid {other.pid}" in v.reason and f"(pid {ours.pid})" in v.reason, v
