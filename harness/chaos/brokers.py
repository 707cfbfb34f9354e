"""The run's brokers, one way for the driver and the storm to speak of either kind:

    SingleBroker    today's run: one KRaft node (``harness.own_servers.Kafka``), PLAINTEXT,
                    everybody straight to it; SIGKILLed once and started again
    SecureCluster   ``--cluster``: three combined KRaft nodes (``harness.kafka_cluster``),
                    replication 3, ``min.insync.replicas`` 2, each client listener behind a
                    proxy of the test; the workers on SASL_SSL (SCRAM-SHA-512), the run's
                    producer on mTLS, the drain and the checker on SASL_SSL

The workers' listener and the producer's have proxies of their own, so cutting the brokers
cuts the workers alone: an upstream producer is somewhere else on the network, and the run
must go on writing (and the test on seeing acknowledgements) while the workers are blind.

The cluster's proxies are :class:`PassingProxy`: a node SIGKILLed behind one must look to its
clients as it would without the proxy (the kernel resets its connections: closed at once),
not hung; only a cut hangs. A cut of the brokers is a partition that heals: while it lasts,
every connection hangs and new ones hang (never refused); when it ends, what was held goes
through, as TCP delivers it once packets pass again.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from app.adapters.kafka.connection import KafkaConnection
from harness.kafka_cluster import KafkaCluster
from harness.own_servers import Kafka
from harness.proxy import BlackholeProxy

WORKERS, PRODUCER, CHECKER = "sasl", "mtls", "sasl"


class SingleBroker:
    nodes = 1
    proxied = False

    def __init__(self, home: Path) -> None:
        self.kafka = Kafka(home)

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    def bring_up(self) -> float:
        self.kafka.reap_leftover()
        self.kafka.install()
        return self.kafka.start()

    def kill(self) -> None:
        self.kafka.kill()

    def start(self) -> float:
        return self.kafka.start()

    def stop(self) -> None:
        self.kafka.stop()

    def remove_data(self) -> None:
        shutil.rmtree(self.kafka.datadir, ignore_errors=True)

    def connection(self) -> KafkaConnection:
        return KafkaConnection(bootstrap=self.bootstrap)

    def producer_options(self) -> dict:
        return {"bootstrap_servers": self.bootstrap}

    def java_producer(self) -> tuple[str, dict[str, str]]:
        return self.bootstrap, {}

    def worker_env(self) -> dict[str, str]:
        return {"KAFKA_BROKER": f"kafka://{self.bootstrap}"}

    def manifest(self) -> dict:
        return {"bootstrap": self.bootstrap, "security_protocol": "PLAINTEXT", "nodes": 1, "proxied": False}

    def ready_seconds(self) -> dict:
        return {"kafka": self.kafka.ready_seconds}


class PassingProxy(BlackholeProxy):
    """BlackholeProxy, but when either side of a connection ends (a close, or a reset: the broker
    was SIGKILLed) the other is closed too, unless the connection is cut. BlackholeProxy leaves
    the client's side open after a reset from the broker's side, so a dead broker looks hung:
    every request in flight on it waits out its client's request timeout.

    ``restore()`` heals every connection, those the cut hung included (BlackholeProxy leaves
    those hung for good, as a firewall that forgot the connection would: ``restore(heal=False)``)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self._switches: set[asyncio.Event] = set()       # every open connection's

    def restore(self, heal: bool = True) -> None:
        def heal_all():
            self._holes = False
            self._live.clear()
            for switch in self._switches if heal else ():
                switch.set()
                self._live.append(switch)
        self._loop.call_soon_threadsafe(heal_all)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        switch = asyncio.Event()
        if not self._holes:
            switch.set()
            self._live.append(switch)
        self._switches.add(switch)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            self._switches.discard(switch)
            client_w.close()
            return
        pumps = [asyncio.ensure_future(self._pass(client_r, server_w, switch)),
                 asyncio.ensure_future(self._pass(server_r, client_w, switch))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            await switch.wait()            # a cut connection tells neither side anything, ever
        finally:
            self._switches.discard(switch)
            for pump in pumps:
                pump.cancel()
            for writer in (client_w, server_w):
                writer.close()

    @staticmethod
    async def _pass(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, switch: asyncio.Event) -> None:
        try:
            while data := await reader.read(65536):
                await switch.wait()        # a cut connection holds its bytes for ever
                writer.write(data)
                await writer.drain()
        except OSError:                    # reset by the peer: the end of the connection all the same
            pass


class SecureCluster:
    nodes = 3
    proxied = True

    def __init__(self, home: Path) -> None:
        self.cluster = KafkaCluster(home, nodes=3, secure=True, proxied=True)
        # Before the nodes' properties are written (start()): they advertise these ports.
        for proxies in self.cluster.proxies.values():
            for listener, proxy in list(proxies.items()):
                proxies[listener] = PassingProxy(*proxy.target)

    @property
    def bootstrap(self) -> str:
        """The workers' (and the checker's) listener, through the proxies."""
        return self.cluster.bootstrap(WORKERS)

    def bring_up(self) -> float:
        took = _timed(self.cluster.start)
        # Connections still hung at the end are cancelled when a proxy stops: not worth a traceback.
        for proxies in self.cluster.proxies.values():
            for proxy in proxies.values():
                proxy._loop.call_soon_threadsafe(proxy._loop.set_exception_handler, lambda loop, context: None)
        return took

    def stop(self) -> None:
        self.cluster.stop()

    def remove_data(self) -> None:
        for node in self.cluster.nodes.values():
            shutil.rmtree(node.data, ignore_errors=True)

    # -- faults --------------------------------------------------------------------------
    def leader_of(self, topic: str, partition: int) -> int:
        return self.cluster.leader_of(topic, partition)

    def active_controller(self) -> int:
        return self.cluster.active_controller()

    def kill_node(self, node_id: int) -> None:
        self.cluster.kill(node_id)

    def start_node(self, node_id: int) -> float:
        """Started again on its data, and back in the ISR of every partition it holds."""
        return self.cluster.start_node(node_id)

    def wait_for(self, predicate, *, timeout: float, what: str):
        return self.cluster.wait_for(predicate, timeout=timeout, what=what)

    def cut(self) -> None:
        """Every connection of the workers' listener hangs, and every new one (never refused)."""
        for proxies in self.cluster.proxies.values():
            proxies[WORKERS].blackhole()

    # False (``--cut-forgets``): the connections the cut hung stay hung after it, as behind a
    # stateful firewall or NAT that dropped them; only new connections pass.
    heal_cuts = True

    def restore(self) -> None:
        for proxies in self.cluster.proxies.values():
            proxies[WORKERS].restore(heal=self.heal_cuts)

    # -- how each party connects -----------------------------------------------------------
    def connection(self) -> KafkaConnection:
        """The drain's (app code may be used there): the workers' own settings."""
        env = self.worker_env()
        return KafkaConnection(bootstrap=self.bootstrap, security_protocol=env["KAFKA_SECURITY_PROTOCOL"],
                               sasl_mechanism=env["KAFKA_SASL_MECHANISM"], sasl_username=env["KAFKA_SASL_USERNAME"],
                               sasl_password=env["KAFKA_SASL_PASSWORD"], ssl_cafile=env["KAFKA_SSL_CAFILE"])

    def producer_options(self) -> dict:
        return self.cluster.client_options(PRODUCER)

    def java_producer(self) -> tuple[str, dict[str, str]]:
        """Kafka's Java client on the mTLS listener: its PEM keystore is one file, key then chain."""
        keystore = self.cluster.certs / "client-keystore.pem"
        if not keystore.exists():
            keystore.write_text(self.cluster.client_key.read_text() + self.cluster.client_cert.read_text())
        return self.cluster.bootstrap(PRODUCER), {
            "security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.cluster.ca),
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)}

    def worker_env(self) -> dict[str, str]:
        return {**self.cluster.env(WORKERS), "KAFKA_REQUIRE_REPLICATION": "true"}

    def manifest(self) -> dict:
        """For the checker, which builds its own clients from this (the password is the checker's;
        the report never copies it)."""
        env = self.cluster.env(CHECKER)
        return {"bootstrap": self.cluster.bootstrap(CHECKER), "security_protocol": env["KAFKA_SECURITY_PROTOCOL"],
                "sasl_mechanism": env["KAFKA_SASL_MECHANISM"], "sasl_username": env["KAFKA_SASL_USERNAME"],
                "sasl_password": env["KAFKA_SASL_PASSWORD"], "ssl_cafile": env["KAFKA_SSL_CAFILE"],
                "ssl_check_hostname": True, "nodes": self.nodes, "proxied": True,
                "workers_listener": WORKERS, "producer_listener": PRODUCER}

    def ready_seconds(self) -> dict:
        return {f"kafka_node_{n.node_id}": n.ready_seconds for n in self.cluster.nodes.values()}


def _timed(start) -> float:
    clock = time.monotonic()
    start()
    return time.monotonic() - clock
