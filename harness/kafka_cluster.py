"""Kafka clusters a test owns: one or three combined KRaft nodes, optionally secure, optionally
behind proxies the test can cut.

    cluster = KafkaCluster(home, nodes=3, secure=True, proxied=True).start()
    env = cluster.env("sasl")            # KAFKA_* variables of a worker on SCRAM-SHA-512 over TLS
    cluster.kill(cluster.leader_of("t", 0))
    cluster.start_node(node_id)          # back, and in the ISR of every partition again
    cluster.stop()

Each node is a ``kafka.Kafka`` process (broker and controller at once) on free 127.0.0.1 ports
with its own data directory, rendered from ``ops/kafka/server.properties.in`` like the single
broker of ``make services``, plus the lines below. Listeners of a node:

    plain     PLAINTEXT, for clients (always)
    sasl      SASL_SSL: SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, user ``app``   (secure=True)
    mtls      SSL with ``ssl.client.auth=required``                             (secure=True)
    INTERNAL  PLAINTEXT between the brokers, never proxied
    CONTROLLER PLAINTEXT, the KRaft quorum

With ``proxied=True`` the client listeners are advertised at the port of a
``harness.proxy.BlackholeProxy`` in front of each (``proxies[node_id][listener]``), so
every client connection, bootstrap and after, goes through a proxy the test can blackhole.

This class knows nothing of pytest; the shared broker on 9092 is never touched.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields

from harness.java import kafka_libs
from harness.proxy import BlackholeProxy
from harness.services import ROOT, free_port

READY_TIMEOUT = 90.0
HEAP = ("-Xms128m", "-Xmx384m")          # several JVMs share two cores here
CERTS_SCRIPT = ROOT / "ops" / "kafka" / "certs.sh"
TEMPLATE = ROOT / "ops" / "kafka" / "server.properties.in"
USER = "app"
CLIENT_LISTENERS = ("plain", "sasl", "mtls")
PROTOCOLS = {"plain": "PLAINTEXT", "sasl": "SASL_SSL", "mtls": "SSL"}


class KafkaClusterError(AssertionError):
    """A node did not come up, or the cluster did not reach the state asked for."""


def new_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid`` makes one, never starting with ``-`` (the
    storage tool's argument parser would take it for an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def make_certificates(folder: Path) -> Path:
    """A throwaway CA, a broker certificate for 127.0.0.1/localhost and a client certificate
    (``ops/kafka/certs.sh``, the script ``ops/services.sh`` uses too); returns ``folder``."""
    done = subprocess.run(["bash", str(CERTS_SCRIPT), str(folder)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise KafkaClusterError(f"making certificates failed ({done.returncode}): {done.stderr[-2000:]}")
    return folder


def java(*args: str) -> list[str]:
    return ["java", *HEAP, f"-Dlog4j2.configurationFile={ROOT / 'ops' / 'kafka' / 'log4j2.properties'}",
            "-cp", f"{kafka_libs()}/*", *args]


@dataclass
class Node:
    node_id: int
    home: Path
    ports: dict[str, int]                 # plain, sasl, mtls, internal, controller
    proc: subprocess.Popen | None = None
    mark: int = 0                         # log size when the current process started
    ready_started: float = 0.0
    ready_seconds: list[float] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.home / "kafka.log"

    @property
    def properties(self) -> Path:
        return self.home / "server.properties"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def log_since_start(self) -> str:
        with open(self.log, "rb") as log:
            log.seek(self.mark)
            return log.read().decode(errors="replace")


class KafkaCluster:
    def __init__(self, home: Path, nodes: int = 1, secure: bool = False, proxied: bool = False) -> None:
        if nodes not in (1, 3):
            raise ValueError("nodes: 1 or 3")
        self.home = Path(home).resolve()
        self.secure = secure
        self.proxied = proxied
        self.password = secrets.token_urlsafe(18)       # SCRAM and PLAIN password of user ``app``
        self.user = USER
        self.certs = self.home / "certs"
        self.listeners = CLIENT_LISTENERS if secure else ("plain",)
        self.nodes: dict[int, Node] = {}
        for node_id in range(1, nodes + 1):
            ports = {name: free_port() for name in (*self.listeners, "internal", "controller")}
            self.nodes[node_id] = Node(node_id, self.home / f"node-{node_id}", ports)
        self.proxies: dict[int, dict[str, BlackholeProxy]] = {}
        if proxied:
            for node in self.nodes.values():
                self.proxies[node.node_id] = {name: BlackholeProxy("127.0.0.1", node.ports[name])
                                              for name in self.listeners}
        self.cluster_id = new_cluster_id()

    # -- files --------------------------------------------------------------------
    @property
    def ca(self) -> Path:
        return self.certs / "ca.pem"

    @property
    def client_cert(self) -> Path:
        return self.certs / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.certs / "client.key"

    def advertised_port(self, node_id: int, listener: str) -> int:
        if self.proxied:
            return self.proxies[node_id][listener].port
        return self.nodes[node_id].ports[listener]

    # -- configuration ------------------------------------------------------------
    def _properties(self, node: Node) -> str:
        count = len(self.nodes)
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.ports['controller']}" for n in self.nodes.values())
        names = {"plain": "PLAIN_CLIENT", "sasl": "SASL", "mtls": "MTLS"}
        listeners = [f"{names[name]}://127.0.0.1:{node.ports[name]}" for name in self.listeners]
        advertised = [f"{names[name]}://127.0.0.1:{self.advertised_port(node.node_id, name)}"
                      for name in self.listeners]
        protocol_map = [f"{names[name]}:{PROTOCOLS[name]}" for name in self.listeners]
        replication = min(3, count)
        min_isr = 2 if count >= 3 else 1
        lines = [
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            "listeners=" + ",".join([*listeners, f"INTERNAL://127.0.0.1:{node.ports['internal']}",
                                     f"CONTROLLER://127.0.0.1:{node.ports['controller']}"]),
            "advertised.listeners=" + ",".join([*advertised, f"INTERNAL://127.0.0.1:{node.ports['internal']}"]),
            "listener.security.protocol.map=" + ",".join([*protocol_map, "INTERNAL:PLAINTEXT",
                                                          "CONTROLLER:PLAINTEXT"]),
            "inter.broker.listener.name=INTERNAL",
            f"log.dirs={node.data}",
            f"offsets.topic.replication.factor={replication}",
            f"transaction.state.log.replication.factor={replication}",
            f"transaction.state.log.min.isr={min_isr}",
            f"share.coordinator.state.topic.replication.factor={replication}",
            f"share.coordinator.state.topic.min.isr={min_isr}",
            f"default.replication.factor={replication}",
            f"min.insync.replicas={min_isr}",
            "unclean.leader.election.enable=false",
            # A node killed with SIGKILL stays registered until its session times out (9 s by
            # default), and its next incarnation cannot register before that: 3 s here.
            "broker.session.timeout.ms=3000",
            "broker.heartbeat.interval.ms=500",
        ]
        if self.secure:
            jaas_plain = (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                          f'user_{self.user}="{self.password}";')
            scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            lines += [
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={self.certs / 'broker-keystore.pem'}",
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={self.ca}",
                "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
                f"listener.name.sasl.plain.sasl.jaas.config={jaas_plain}",
                f"listener.name.sasl.scram-sha-512.sasl.jaas.config={scram}",
                f"listener.name.sasl.scram-sha-256.sasl.jaas.config={scram}",
                "listener.name.mtls.ssl.client.auth=required",
            ]
        template = TEMPLATE.read_text().replace("@PORT@", str(node.ports["plain"])).replace(
            "@CONTROLLER_PORT@", str(node.ports["controller"])).replace("@DATA_DIR@", str(node.data))
        # java.util.Properties keeps the last value of a key: these lines win over the template's.
        return template + "\n# KafkaCluster (harness/kafka_cluster.py)\n" + "\n".join(lines) + "\n"

    def _format(self, node: Node) -> None:
        node.data.mkdir(parents=True)
        node.properties.write_text(self._properties(node))
        args = ["kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(node.properties)]
        if self.secure:
            for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
                args += ["--add-scram", f"{mechanism}=[name={self.user},password={self.password}]"]
        done = subprocess.run(java(*args), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise KafkaClusterError(f"formatting node {node.node_id} failed ({done.returncode}):\n"
                                    f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    # -- life and death -----------------------------------------------------------
    def start(self, timeout: float = READY_TIMEOUT) -> KafkaCluster:
        """Format every node, start them all, wait until each is ready; returns ``self``."""
        self._reap_leftovers()
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir(parents=True)
        if self.secure:
            make_certificates(self.certs)
        for proxies in self.proxies.values():
            for proxy in proxies.values():
                proxy.start()
        for node in self.nodes.values():
            self._format(node)
        try:
            for node in self.nodes.values():   # a quorum of 3 elects nobody until 2 run: start all, then wait
                self._spawn(node)
            for node in self.nodes.values():
                self._wait_started(node, timeout)
            self.wait_for(lambda: self._registered() == set(self.nodes), timeout=timeout,
                          what="every node registered")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM every node (SIGKILL after 30 s), then the proxies. Safe to call twice."""
        for node in self.nodes.values():
            if node.alive:
                node.proc.terminate()
        for node in self.nodes.values():
            if node.proc is not None:
                try:
                    node.proc.wait(30)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(30)
        for proxies in self.proxies.values():
            for proxy in proxies.values():
                if proxy._thread.is_alive():
                    proxy.stop()

    def blackhole(self, node_id: int) -> None:
        """Every client listener of ``node_id`` stops answering (its proxies; needs proxied=True)."""
        for proxy in self.proxies[node_id].values():
            proxy.blackhole()

    def restore(self, node_id: int) -> None:
        for proxy in self.proxies[node_id].values():
            proxy.restore()

    def kill(self, node_id: int) -> None:
        """SIGKILL: no shutdown at all, as a crash or the OOM killer does it."""
        node = self.nodes[node_id]
        if node.alive:
            node.proc.send_signal(signal.SIGKILL)
        if node.proc is not None:
            node.proc.wait(30)

    def terminate(self, node_id: int, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the controlled shutdown to finish; returns the exit code."""
        node = self.nodes[node_id]
        if node.alive:
            node.proc.terminate()
        return node.proc.wait(timeout) if node.proc is not None else 0

    def start_node(self, node_id: int, timeout: float = READY_TIMEOUT) -> float:
        """Start a stopped node on its data directory and ports again; return once it is ready
        and back in the ISR of every partition it holds (how long that took, in seconds)."""
        node = self.nodes[node_id]
        if node.alive:
            raise KafkaClusterError(f"node {node_id} is running")
        started = time.monotonic()
        self._spawn(node)
        self._wait_started(node, timeout)
        self.wait_for(lambda: node_id in self._registered(), timeout=timeout, what=f"node {node_id} registered")
        self.wait_for(lambda: self._in_every_isr(node_id), timeout=timeout,
                      what=f"node {node_id} back in the ISR of its partitions")
        took = round(time.monotonic() - started, 3)
        node.ready_seconds.append(took)
        return took

    def _spawn(self, node: Node) -> None:
        node.mark = node.log.stat().st_size if node.log.exists() else 0
        node.ready_started = time.monotonic()
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(java("kafka.Kafka", str(node.properties)), cwd=node.home,
                                         stdout=log, stderr=subprocess.STDOUT)
        (node.home / "kafka.pid").write_text(str(node.proc.pid))

    def _reap_leftovers(self) -> None:
        """SIGKILL nodes an earlier run in this home left behind (a test process that was itself
        killed): a pid file names each, and its command line must name this home."""
        for pid_file in self.home.glob("node-*/kafka.pid"):
            try:
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError):
                continue
            if str(self.home) in cmdline:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)

    def _wait_started(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if "Kafka Server started" in node.log_since_start() and _port_open(node.ports["plain"]):
                node.ready_seconds.append(round(time.monotonic() - node.ready_started, 3))
                return
            if node.proc.poll() is not None:
                raise KafkaClusterError(f"node {node.node_id} exited ({node.proc.returncode}) while starting; "
                                        f"{node.log}:\n{node.log_tail()}")
            if time.monotonic() > deadline:
                raise KafkaClusterError(f"node {node.node_id} not started within {timeout:.0f}s; "
                                        f"{node.log}:\n{node.log_tail()}")
            time.sleep(0.05)

    def wait_for(self, predicate, *, timeout: float = READY_TIMEOUT, what: str = "condition"):
        """Poll ``predicate`` (errors count as "not yet") until truthy; fail with every node's log tail."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except Exception as exc:          # the cluster is still moving: metadata not there yet
                last = exc
            time.sleep(0.2)
        tails = "\n".join(f"--- node {n.node_id} ({n.log}):\n{n.log_tail(15)}" for n in self.nodes.values())
        raise KafkaClusterError(f"{what} not reached within {timeout:.0f}s (last: {last!r})\n{tails}")

    # -- what clients need ---------------------------------------------------------
    def bootstrap(self, listener: str = "plain") -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...`` of the running nodes' ``listener`` (through the proxies
        when proxied)."""
        self._check_listener(listener)
        return ",".join(f"127.0.0.1:{self.advertised_port(n.node_id, listener)}" for n in self.nodes.values())

    def env(self, listener: str = "plain") -> dict[str, str]:
        """The worker's ``KAFKA_*`` environment variables for ``listener``."""
        self._check_listener(listener)
        env = {"KAFKA_BROKER": ";".join(f"kafka://{hp}" for hp in self.bootstrap(listener).split(","))}
        if listener == "plain":
            env["KAFKA_SECURITY_PROTOCOL"] = "PLAINTEXT"
        elif listener == "sasl":
            env.update(KAFKA_SECURITY_PROTOCOL="SASL_SSL", KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
                       KAFKA_SASL_USERNAME=self.user, KAFKA_SASL_PASSWORD=self.password,
                       KAFKA_SSL_CAFILE=str(self.ca))
        else:
            env.update(KAFKA_SECURITY_PROTOCOL="SSL", KAFKA_SSL_CAFILE=str(self.ca),
                       KAFKA_SSL_CERTFILE=str(self.client_cert), KAFKA_SSL_KEYFILE=str(self.client_key))
        return env

    def client_options(self, listener: str = "plain") -> dict:
        """aiokafka keyword arguments (bootstrap_servers, security_protocol, sasl_*, ssl_context) for
        ``listener``, through the proxies when proxied."""
        self._check_listener(listener)
        options: dict = {"bootstrap_servers": self.bootstrap(listener), "security_protocol": PROTOCOLS[listener]}
        if listener == "sasl":
            options.update(sasl_mechanism="SCRAM-SHA-512", sasl_plain_username=self.user,
                           sasl_plain_password=self.password, ssl_context=create_ssl_context(cafile=str(self.ca)))
        elif listener == "mtls":
            options["ssl_context"] = create_ssl_context(cafile=str(self.ca), certfile=str(self.client_cert),
                                                        keyfile=str(self.client_key))
        return options

    def direct_bootstrap(self) -> str:
        """The inter-broker PLAINTEXT listeners of the running nodes: never proxied, and advertised
        as themselves, so a client bootstrapped here keeps seeing the cluster while the test cuts
        the proxies (the fixture asks the cluster this way)."""
        running = [n for n in self.nodes.values() if n.alive] or list(self.nodes.values())
        return ",".join(f"127.0.0.1:{n.ports['internal']}" for n in running)

    def _check_listener(self, listener: str) -> None:
        if listener not in self.listeners:
            raise ValueError(f"listener {listener!r}: this cluster has {', '.join(self.listeners)}")

    # -- what the cluster says -------------------------------------------------------
    def _ask(self, question):
        """Run ``await question(admin)`` with an aiokafka admin client on ``direct_bootstrap()``."""
        async def ask():
            admin = AIOKafkaAdminClient(bootstrap_servers=self.direct_bootstrap(), request_timeout_ms=5000)
            await admin.start()
            try:
                return await question(admin)
            finally:
                await admin.close()

        return asyncio.run(ask())

    def _registered(self) -> set[int]:
        async def brokers(admin):
            return {b["node_id"] for b in (await admin.describe_cluster())["brokers"]}
        return self._ask(brokers)

    def partitions(self, topics: list[str] | None = None) -> dict[tuple[str, int], dict]:
        """``{(topic, partition): {"leader", "replicas", "isr", "error_code"}}`` of ``topics``
        (every topic when None)."""
        async def describe(admin):
            names = topics if topics is not None else await admin.list_topics()
            return await admin.describe_topics(list(names)) if names else []
        return {(t["topic"], p["partition"]): p for t in self._ask(describe) for p in t["partitions"]}

    def _in_every_isr(self, node_id: int) -> bool:
        return all(node_id in p["isr"] for p in self.partitions().values() if node_id in p["replicas"])

    def leader_of(self, topic: str, partition: int = 0, timeout: float = 60.0) -> int:
        """The node that leads ``topic``-``partition`` now (waits while it has none)."""
        def leader():
            p = self.partitions([topic]).get((topic, partition))
            return p["leader"] if p and p["error_code"] == 0 and p["leader"] in self.nodes else None
        return self.wait_for(leader, timeout=timeout, what=f"a leader of {topic}-{partition}")

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        return list(self.partitions([topic])[(topic, partition)]["isr"])

    def active_controller(self, timeout: float = 60.0) -> int:
        """The node id of the KRaft quorum's leader, the active controller (DescribeQuorum; in KRaft
        the metadata response names a random broker as "controller", not the active one)."""
        async def quorum(admin):
            response = await admin._send_request(DescribeQuorumRequest())
            partition = response.topics[0][1][0]
            return partition[2] if partition[1] == 0 else None    # (index, error_code, leader_id, ...)
        return self.wait_for(lambda: (lambda leader: leader if leader in self.nodes else None)(self._ask(quorum)),
                             timeout=timeout, what="an active controller")


# DescribeQuorum (API key 55) v0, which aiokafka does not define: the leader of the
# ``__cluster_metadata`` partition is the active controller.
_REPLICA = CompactArray(("replica_id", Int32), ("log_end_offset", Int64), ("tags", TaggedFields))


class DescribeQuorumResponse_v0(Response):
    API_KEY = 55
    API_VERSION = 0
    SCHEMA = Schema(
        ("error_code", Int16),
        ("topics", CompactArray(
            ("topic_name", CompactString("utf-8")),
            ("partitions", CompactArray(
                ("partition_index", Int32), ("error_code", Int16), ("leader_id", Int32), ("leader_epoch", Int32),
                ("high_watermark", Int64), ("current_voters", _REPLICA), ("observers", _REPLICA),
                ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class DescribeQuorumRequest_v0(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 55
    API_VERSION = 0
    RESPONSE_TYPE = DescribeQuorumResponse_v0
    SCHEMA = Schema(
        ("topics", CompactArray(
            ("topic_name", CompactString("utf-8")),
            ("partitions", CompactArray(("partition_index", Int32), ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class DescribeQuorumRequest(Request[DescribeQuorumRequest_v0]):
    API_KEY = 55

    def build(self, request_struct_class: type[DescribeQuorumRequest_v0]) -> DescribeQuorumRequest_v0:
        return request_struct_class([("__cluster_metadata", [(0, {})], {})], {})


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
