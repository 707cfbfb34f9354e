"""The proxies (harness/chaos/brokers.py for the cluster, harness/proxy.py for the rest): a broker that dies behind one looks dead to
its clients, closed at once, as it would without the proxy; a cut connection hangs, and goes
on once the cut heals; a retarget (a database failover's move) ends every open connection."""

from __future__ import annotations

import socket
import struct
import time
from contextlib import closing

import pytest

from harness.chaos.brokers import PassingProxy
from harness.proxy import BlackholeProxy


def _connected_through(proxy_class):
    server = socket.create_server(("127.0.0.1", 0))
    proxy = proxy_class("127.0.0.1", server.getsockname()[1]).start()
    client = socket.create_connection(("127.0.0.1", proxy.port))
    peer, _ = server.accept()
    client.sendall(b"request")
    peer.settimeout(5)
    assert peer.recv(16) == b"request"
    return server, proxy, client, peer


def _reset(peer: socket.socket) -> None:
    """Close with a reset, as the kernel closes the sockets of a SIGKILLed process with data unread."""
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()


def _outcome(client: socket.socket, wait: float) -> str:
    client.settimeout(wait)
    try:
        return "closed" if client.recv(16) == b"" else "data"
    except TimeoutError:
        return "hung"
    except ConnectionResetError:
        return "closed"


@pytest.mark.parametrize("proxy_class", [PassingProxy, BlackholeProxy])
def test_a_broker_reset_behind_the_proxy_reaches_the_client_as_a_close(proxy_class):
    server, proxy, client, peer = _connected_through(proxy_class)
    with closing(server), closing(client):
        try:
            _reset(peer)
            assert _outcome(client, 5) == "closed"
        finally:
            proxy.stop()


@pytest.mark.parametrize("proxy_class", [PassingProxy, BlackholeProxy])
def test_a_cut_connection_hangs_even_when_the_broker_goes_away(proxy_class):
    server, proxy, client, peer = _connected_through(proxy_class)
    with closing(server), closing(client):
        try:
            proxy.blackhole()
            deadline = time.monotonic() + 5
            while not proxy._holes and time.monotonic() < deadline:     # the cut reaches the proxy's loop
                time.sleep(0.01)
            _reset(peer)
            assert _outcome(client, 1.5) == "hung"        # a bound on seeing nothing: a hang has no event
        finally:
            proxy.stop()


def test_a_connection_the_cut_hung_goes_on_when_the_cut_heals():
    server, proxy, client, peer = _connected_through(PassingProxy)
    with closing(server), closing(client), closing(peer):
        try:
            proxy.blackhole()
            deadline = time.monotonic() + 5
            while not proxy._holes and time.monotonic() < deadline:
                time.sleep(0.01)
            client.sendall(b"held")
            assert _outcome(peer, 1.0) == "hung"          # a bound on seeing nothing: a hang has no event
            proxy.restore()
            peer.settimeout(5)
            assert peer.recv(16) == b"held"
        finally:
            proxy.stop()


def test_a_retarget_closes_every_open_connection_and_sends_new_ones_to_the_new_server():
    """A failover's move: the open connections end (a hung one too), the next one reaches the new server."""
    server, proxy, client, peer = _connected_through(BlackholeProxy)
    hung_client = socket.create_connection(("127.0.0.1", proxy.port))
    hung_peer, _ = server.accept()
    other = socket.create_server(("127.0.0.1", 0))
    other.settimeout(5)
    with closing(server), closing(client), closing(peer), closing(hung_client), closing(hung_peer), closing(other):
        try:
            proxy.blackhole()
            deadline = time.monotonic() + 5
            while not proxy._holes and time.monotonic() < deadline:
                time.sleep(0.01)
            hung_client.sendall(b"held")
            proxy.retarget("127.0.0.1", other.getsockname()[1])
            assert _outcome(client, 5) == "closed" and _outcome(hung_client, 5) == "closed"
            assert _outcome(peer, 5) == "closed" and _outcome(hung_peer, 5) == "closed"   # never got "held"
            fresh = socket.create_connection(("127.0.0.1", proxy.port))
            with closing(fresh):
                moved, _ = other.accept()
                with closing(moved):
                    fresh.sendall(b"after")
                    moved.settimeout(5)
                    assert moved.recv(16) == b"after"
        finally:
            proxy.stop()
