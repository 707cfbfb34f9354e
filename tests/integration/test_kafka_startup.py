"""The start-up check against real listeners: a broker that is down behind something that
accepts for it is skipped, not taken for a refusal; the wrong kind of listener is named.

Against the shared PLAINTEXT broker; the secure listeners' refusals are in test_kafka_security.py.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from app.adapters.kafka.connection import KafkaConnection, KafkaStartupError, preflight
from app.settings import Settings


class Closer:
    """Accepts every connection and closes it at once: a node down behind a proxy or a load
    balancer, as a client sees it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                peer, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            peer.close()

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def closer():
    made = Closer()
    yield made
    made.close()


def test_a_first_broker_that_drops_every_connection_is_skipped_for_the_next(closer):
    shared = Settings().kafka.bootstrap
    conn = KafkaConnection(bootstrap=f"127.0.0.1:{closer.port},{shared}")
    asyncio.run(preflight(conn, wait_seconds=0))
    assert closer.accepted >= 1


def test_brokers_that_all_drop_the_connection_are_waited_for_not_refused(closer):
    conn = KafkaConnection(bootstrap=f"127.0.0.1:{closer.port}")
    with pytest.raises(KafkaStartupError) as raised:
        asyncio.run(preflight(conn, wait_seconds=2))
    assert raised.value.retriable, str(raised.value)
    assert "KAFKA_STARTUP_WAIT_SECONDS" in str(raised.value)


def test_tls_against_a_plaintext_listener_is_named_at_once():
    conn = KafkaConnection(bootstrap=Settings().kafka.bootstrap, security_protocol="SSL")
    with pytest.raises(KafkaStartupError) as raised:
        asyncio.run(preflight(conn, wait_seconds=60))
    assert not raised.value.retriable
    assert "does not speak TLS" in str(raised.value)
