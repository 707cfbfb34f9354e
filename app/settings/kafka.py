"""Kafka: the brokers and how every client connects to them, the topics, the consumer group's timing,
and the watchdog and stop bound that derive from the group's session timeout.

The security rules (``KAFKA_SASL_*`` and ``KAFKA_SSL_*`` that contradict each other, certificate
files that do not exist) live here, as :func:`check_security`: the settings refuse them, and
``app.adapters.kafka.connection.KafkaConnection`` applies the same rules to a connection made
without settings.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import SecretStr, model_validator

from app.settings._base import Group, setting

SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def brokers(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` as (host, port) pairs; ValueError for a port that is no number."""
    found = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        found.append((host.strip("[]") or "127.0.0.1", int(port or 9092)))
    return found


def check_security(*, bootstrap: str, security_protocol: str, sasl_mechanism: str, sasl_username: str | None,
                   sasl_password: SecretStr | None, ssl_cafile: str | None, ssl_certfile: str | None,
                   ssl_keyfile: str | None) -> None:
    """Refuse security settings that cannot work, naming the settings to change (ValueError)."""
    uses_tls = security_protocol in ("SSL", "SASL_SSL")
    if security_protocol not in SECURITY_PROTOCOLS:
        raise ValueError(f"KAFKA_SECURITY_PROTOCOL={security_protocol!r}: expected one of "
                         f"{', '.join(SECURITY_PROTOCOLS)}")
    if security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        if sasl_mechanism not in SASL_MECHANISMS:
            raise ValueError(f"KAFKA_SASL_MECHANISM={sasl_mechanism!r}: expected one of {', '.join(SASL_MECHANISMS)}")
        if not sasl_username or sasl_password is None or not sasl_password.get_secret_value():
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL={security_protocol} needs "
                             "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise ValueError("KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE go together (a client certificate "
                         "and its private key, for mTLS): set both or neither")
    if not uses_tls and (ssl_cafile or ssl_certfile):
        raise ValueError(f"KAFKA_SSL_* is set but KAFKA_SECURITY_PROTOCOL={security_protocol} does "
                         "not use TLS: set it to SSL or SASL_SSL, or unset the certificate settings")
    for name, path in (("KAFKA_SSL_CAFILE", ssl_cafile), ("KAFKA_SSL_CERTFILE", ssl_certfile),
                       ("KAFKA_SSL_KEYFILE", ssl_keyfile)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{name}={path}: no such file")
    try:
        brokers(bootstrap)
    except ValueError:
        raise ValueError(f"KAFKA_BROKER must list host:port pairs, got {bootstrap!r}") from None


class KafkaSettings(Group):
    TITLE = "Kafka"

    broker: str = setting("KAFKA_BROKER", "kafka://127.0.0.1:9092", min_length=1,
        description='Broker URL(s), `;`- or `,`-separated.')

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = setting("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT",
        description='`PLAINTEXT`, `SSL` (TLS; with a client certificate: mTLS), `SASL_PLAINTEXT`, `SASL_SSL`: for '
                    'every Kafka client of the project ([Connecting to a managed '
                    'Kafka](connecting.md#connecting-to-a-managed-kafka)).')

    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = setting("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512",
        description='`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` (with `SASL_*`).')

    sasl_username: str | None = setting("KAFKA_SASL_USERNAME", None,
        description='The SASL user (required with `SASL_*`).')

    sasl_password: SecretStr | None = setting("KAFKA_SASL_PASSWORD", None,
        description='Its password (required with `SASL_*`); never in a log line, the banner, a web view, a metric or '
                    'an error message.')

    ssl_cafile: str | None = setting("KAFKA_SSL_CAFILE", None, shown="unset: the system's CAs",
        description="PEM file of the CA(s) that signed the brokers' certificates.")

    ssl_certfile: str | None = setting("KAFKA_SSL_CERTFILE", None,
        description="mTLS: PEM file of this client's certificate (with `KAFKA_SSL_KEYFILE`).")

    ssl_keyfile: str | None = setting("KAFKA_SSL_KEYFILE", None,
        description='mTLS: PEM file of its private key (unencrypted).')

    ssl_check_hostname: bool = setting("KAFKA_SSL_CHECK_HOSTNAME", True,
        description="Check that the broker's certificate names the host in `KAFKA_BROKER`; `false` is for tests only.")

    startup_wait_seconds: float = setting("KAFKA_STARTUP_WAIT_SECONDS", 300.0, ge=0,
        description='A process started while no broker answers waits this long (a log line per attempt, 1 s doubling '
                    'to 10 s apart), then exits 69; a broker that answers and refuses (wrong password, unknown CA, '
                    '...) stops it at once (exit 78).')

    require_replication: bool = setting("KAFKA_REQUIRE_REPLICATION", False,
        description="The worker reads `order-event`'s and the dead-letter topic's replication at start-up: below "
                    'replication 3 or `min.insync.replicas` 2 (or with unclean leader election on) it logs a warning '
                    'naming the risk; `true` makes it refuse to start (exit 78).')

    isolation_level: Literal["read_committed", "read_uncommitted"] = setting("KAFKA_ISOLATION_LEVEL", "read_committed",
        description='How the worker reads `order-event` and the dead-letter topic: `read_committed` never delivers a '
                    'record of an aborted or still open transaction of a transactional producer (an outbox relay, '
                    'Kafka Streams, Spring with exactly-once); `read_uncommitted` does ([Transactional '
                    'producers](exactly-once.md#transactional-producers-upstream)).')

    topic: str = setting("ORDER_EVENT_TOPIC", "order-event",
        description='The input topic.')

    partitions: int = setting("ORDER_EVENT_PARTITIONS", 8, ge=1,
        description='Its partitions, used when `make topics` creates it.')

    dlq_topic: str = setting("DLQ_TOPIC", "order-event-dlq",
        description='The dead-letter topic.')

    dlq_partitions: int = setting("DLQ_PARTITIONS", 3, ge=1,
        description='Its partitions.')

    store_watermark_topic: str = setting("STORE_WATERMARK_TOPIC", "order-event-store-watermark", min_length=1,
        description='Where the workers publish how far the store (the database) has come: one partition, compacted, a'
                    ' record per advance keyed by `APP_ID`. A store found behind it went back in time (a restore from'
                    ' backup) and opens a recovery window by itself ([After a failover or a '
                    'restore](operations.md#after-a-failover-or-a-restore)); `make topics` creates it. A worker that cannot read '
                    'it logs an error and notices only what it saw itself.')

    replication: int = setting("TOPIC_REPLICATION", 1, ge=1,
        description='Replication factor of created topics.')

    commit_interval_seconds: float = setting("BROKER_COMMIT_INTERVAL_SECONDS", 2.8, gt=0,
        description='How often acked offsets are committed.')

    session_timeout_seconds: float = setting("BROKER_SESSION_TIMEOUT_SECONDS", 30.0, ge=6,
        description='A worker that stops heartbeating loses its partitions after this long.')

    heartbeat_interval_seconds: float = setting("BROKER_HEARTBEAT_INTERVAL_SECONDS", 3.0, gt=0,
        description='Consumer heartbeat interval.')

    rebalance_timeout_seconds: float = setting("BROKER_REBALANCE_TIMEOUT_SECONDS", 300.0, gt=0,
        description="How long the group waits for a member to rejoin a rebalance (Kafka's `max.poll.interval.ms`, "
                    'also 5 minutes there); the longest a batch may take must stay under it, checked at start-up: '
                    'max(`LEASE_SECONDS`, `BATCH_DEADLINE_SECONDS` + 2 x `EFFECT_TIMEOUT_SECONDS`) + '
                    '`DLQ_SEND_TIMEOUT_SECONDS` + `INFRA_RETRY_BUDGET_SECONDS` + 2 x `DB_TRANSACTION_TIMEOUT_SECONDS`'
                    ' (210 s with the defaults). A member that does not rejoin in time is evicted and its batch done '
                    'again by another (safe, but work twice); the price of a long timeout: a member that dies in the '
                    'middle of a rebalance holds the group up until it runs out.')

    revoke_grace_seconds: float = setting("KAFKA_REVOKE_GRACE_SECONDS", 10.0, gt=0,
        description='On a rebalance, how long a worker waits for the records of its revoked partitions still in '
                    'flight (slow calls, retries, dead letters on their way) before it gives them up; the whole group '
                    'waits meanwhile. Records finished within it are committed; the ones given up are never acked, so '
                    'never committed: whoever gets their partitions reads them again, and their claims in `t_idem` '
                    'keep the effects to one ([Records finish on their own](exactly-once.md#records-finish-on-their-own)). Must stay '
                    'under `BROKER_REBALANCE_TIMEOUT_SECONDS`.')

    commit_every: int = setting("BROKER_COMMIT_EVERY", 10_000, ge=1,
        description='Also commit as soon as this many events were acked; with the interval, it bounds what a kill -9 '
                    'replays ([the budget](operations.md#the-capacity-budget)).')

    max_poll_records: int = setting("BROKER_MAX_POLL_RECORDS", 500, ge=1,
        description='Records handed to Faust per fetch.')

    max_partition_fetch_bytes: int = setting("KAFKA_MAX_PARTITION_FETCH_BYTES", 256 * 1024, ge=64 * 1024,
        description="The most one fetch brings of one partition (aiokafka's `max_partition_fetch_bytes`, 1 MiB by "
                    'default there): what a worker holds fetched ahead is about this times its partitions (a larger '
                    'record still comes, alone).')

    watchdog_enabled: bool = setting("WATCHDOG_ENABLED", True,
        description="Watch this worker's group membership, heartbeats and fetching, and heal it "
                    '([Self-healing](operations.md#self-healing)).')

    watchdog_interval_seconds: float = setting("WATCHDOG_INTERVAL_SECONDS", 1.0, gt=0,
        description='How often the watchdog looks.')

    watchdog_stall_seconds: float | None = setting("WATCHDOG_STALL_SECONDS", None, gt=0, shown='`BROKER_SESSION_TIMEOUT_SECONDS`',
        description='No assignment, no successful heartbeat, or no fetch progress while records wait, for this long: '
                    'the worker is unhealthy (`/readyz` 503 with the reason) and a rejoin of the group is forced.')

    watchdog_rejoin_grace_seconds: float | None = setting("WATCHDOG_REJOIN_GRACE_SECONDS", None, gt=0, shown='`BROKER_SESSION_TIMEOUT_SECONDS` / 3',
        description='Still unhealthy this long after the forced rejoin: the worker exits 70 for its supervisor to '
                    'start a fresh one.')

    stop_timeout_seconds: float | None = setting("STOP_TIMEOUT_SECONDS", None, gt=0, shown='`BROKER_SESSION_TIMEOUT_SECONDS`',
        description='The longest a worker takes to stop after SIGTERM, broker gone or hung included; then it exits 70'
                    ' without committing more.')

    @property
    def bootstrap(self) -> str:
        """The broker list as aiokafka wants it (no ``kafka://`` scheme)."""
        urls = [url.strip() for part in self.broker.split(";") for url in part.split(",") if url.strip()]
        return ",".join(url.split("://", 1)[-1] for url in urls)

    @property
    def faust_broker(self) -> str:
        """The broker list as Faust wants it (``kafka://a:1;kafka://b:2``)."""
        return ";".join(f"kafka://{hostport}" for hostport in self.bootstrap.split(","))

    @property
    def stop_timeout(self) -> float:
        return self.stop_timeout_seconds or self.session_timeout_seconds

    @property
    def watchdog_stall(self) -> float:
        return self.watchdog_stall_seconds or self.session_timeout_seconds

    @property
    def watchdog_rejoin_grace(self) -> float:
        return self.watchdog_rejoin_grace_seconds or self.session_timeout_seconds / 3

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        check_security(bootstrap=self.bootstrap, security_protocol=self.security_protocol,
                       sasl_mechanism=self.sasl_mechanism, sasl_username=self.sasl_username,
                       sasl_password=self.sasl_password, ssl_cafile=self.ssl_cafile,
                       ssl_certfile=self.ssl_certfile, ssl_keyfile=self.ssl_keyfile)
        return self
