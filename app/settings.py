"""Every setting of the processor, read once from the environment.

Nothing else in the project reads ``os.environ``: components receive the
values they need from a :class:`Settings` instance. Each field is listed in
the README's configuration table with its default.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.exits import EXIT_CONFIG

if TYPE_CHECKING:
    from app.adapters.kafka.connection import KafkaConnection
    from app.adapters.mysql.tls import MySqlTls
    from app.pipeline.tokens import StepTokens


# Bytes per t_idem row, primary key and idx_status_modified included, as MariaDB reports them
# (information_schema DATA_LENGTH + INDEX_LENGTH / TABLE_ROWS) at 10 million rows (bench, cost row).
ROW_BYTES = 390


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Typed configuration; environment variable names are the upper-cased field names."""

    model_config = SettingsConfigDict(env_file=None, case_sensitive=False, extra="ignore")

    # -- identity -----------------------------------------------------------
    app_id: str = Field("order-event-processor", min_length=1, max_length=255,
                        description="Faust app id = Kafka consumer group.")
    worker_id: str = Field(default_factory=_default_worker_id, min_length=1, max_length=64,
                           description="Names this process in t_idem.owner and dead-letter headers.")

    # -- Kafka --------------------------------------------------------------
    kafka_broker: str = Field("kafka://127.0.0.1:9092", min_length=1,
                              description="The brokers: kafka://host:port, several joined by ';' or ','.")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: str | None = Field(None, description="PEM file of the CA(s) that signed the brokers' "
                                                           "certificates; unset: the system's CAs.")
    kafka_ssl_certfile: str | None = Field(None, description="mTLS: PEM file of this client's certificate.")
    kafka_ssl_keyfile: str | None = Field(None, description="mTLS: PEM file of its private key.")
    kafka_ssl_check_hostname: bool = True
    kafka_startup_wait_seconds: float = Field(
        300.0, ge=0, description="How long a process waits for a broker to answer at start-up before it gives up "
                                 "(a broker that answers and refuses, e.g. a wrong password, stops it at once).")
    kafka_require_replication: bool = Field(
        False, description="Refuse to start when order-event or the dead-letter topic has a replication factor "
                           "under 3 or min.insync.replicas under 2 (otherwise: a warning).")
    kafka_isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        "read_committed", description="How the worker reads order-event and the dead-letter topic: "
                                      "read_committed never delivers records of aborted (or still open) "
                                      "transactions of a transactional producer.")
    order_event_topic: str = "order-event"
    order_event_partitions: int = Field(8, ge=1)
    dlq_topic: str = "order-event-dlq"
    dlq_partitions: int = Field(3, ge=1)
    store_watermark_topic: str = Field(
        "order-event-store-watermark", min_length=1,
        description="Where the workers publish how far the store (the database) has come: a compacted topic of "
                    "one partition, keyed by APP_ID. A store found behind it went back in time (a restore from "
                    "backup) and opens a recovery window by itself.")
    topic_replication: int = Field(1, ge=1)
    broker_commit_interval_seconds: float = Field(2.8, gt=0)
    broker_session_timeout_seconds: float = Field(
        30.0, ge=6, description="A worker that stops heartbeating loses its partitions after this long.")
    broker_heartbeat_interval_seconds: float = Field(3.0, gt=0)
    broker_rebalance_timeout_seconds: float = Field(
        300.0, gt=0, description="How long the group waits for a member to rejoin a rebalance (Kafka's "
                                 "max.poll.interval.ms, 5 minutes by default there too); the longest a batch in "
                                 "flight may take must stay under it (checked at start-up).")
    broker_commit_every: int = Field(
        10_000, ge=1, description="Faust also commits as soon as this many events were acknowledged: with the "
                                  "commit interval, it bounds what a kill -9 replays (the budget command).")
    broker_max_poll_records: int = Field(
        500, ge=1, description="Records handed to Faust per fetch; smaller keeps the event loop fair to batches.")
    kafka_max_partition_fetch_bytes: int = Field(
        256 * 1024, ge=64 * 1024,
        description="The most one fetch brings of one partition (aiokafka's max_partition_fetch_bytes): what a "
                    "worker holds fetched ahead grows with it times its partitions.")

    # -- self-healing ---------------------------------------------------------
    watchdog_enabled: bool = Field(
        True, description="Watch this worker's group membership, heartbeats and fetching (app.pipeline.liveness).")
    watchdog_interval_seconds: float = Field(1.0, gt=0, description="How often the watchdog looks.")
    watchdog_stall_seconds: float | None = Field(
        None, gt=0, description="How long no assignment, no successful heartbeat, or no fetch progress while there "
                                "is lag, makes the worker unhealthy (/readyz 503, a forced rejoin); unset: "
                                "BROKER_SESSION_TIMEOUT_SECONDS.")
    watchdog_rejoin_grace_seconds: float | None = Field(
        None, gt=0, description="How long after the forced rejoin a worker still unhealthy exits 70; unset: "
                                "a third of BROKER_SESSION_TIMEOUT_SECONDS.")

    stop_timeout_seconds: float | None = Field(
        None, gt=0, description="The longest a worker takes to stop after SIGTERM, broker gone or not; then it "
                                "exits 70 without committing more (unset: BROKER_SESSION_TIMEOUT_SECONDS).")

    @property
    def stop_timeout(self) -> float:
        return self.stop_timeout_seconds or self.broker_session_timeout_seconds

    @property
    def watchdog_stall(self) -> float:
        return self.watchdog_stall_seconds or self.broker_session_timeout_seconds

    @property
    def watchdog_rejoin_grace(self) -> float:
        return self.watchdog_rejoin_grace_seconds or self.broker_session_timeout_seconds / 3

    # -- MariaDB / MySQL ----------------------------------------------------
    mysql_url: str = "mysql+aiomysql://idem:idem@127.0.0.1:3306/idem"
    mysql_ssl_mode: Literal["disabled", "required", "verify"] | None = Field(
        None, description="TLS to the database: disabled, required (encrypted, the server's certificate not "
                          "checked) or verify (checked against MYSQL_SSL_CA or the system's CAs); unset: verify "
                          "when MYSQL_SSL_CA or MYSQL_SSL_CERT is set, else disabled.")
    mysql_ssl_ca: str | None = Field(None, description="PEM file of the CA(s) that signed the database server's "
                                                       "certificate; unset: the system's CAs.")
    mysql_ssl_cert: str | None = Field(None, description="mTLS: PEM file of this client's certificate (with "
                                                         "MYSQL_SSL_KEY).")
    mysql_ssl_key: str | None = Field(None, description="mTLS: PEM file of its private key (unencrypted).")
    mysql_ssl_verify_identity: bool = Field(
        True, description="With verify: check that the server's certificate names the host of MYSQL_URL.")
    db_pool_size: int = Field(4, ge=1)
    db_server_check: bool = Field(
        True, description="Compare the database server of each new connection with the one the store last recorded; "
                          "another one (a failover, a restore onto a new server) opens a recovery window.")
    store_watermark_seconds: float = Field(
        10.0, gt=0, description="How often every worker advances the store's watermark in the database and publishes "
                                "it to STORE_WATERMARK_TOPIC (and compares the two); a clean stop does it once more.")
    recovery_auto_hours: float = Field(
        24.0, gt=0, le=2160, description="How long a recovery window opened by a server change lasts (a person "
                                         "ends it earlier with `recovery end`).")
    idem_token_secret: SecretStr | None = Field(
        None, description="The deployment's secret that every step's idempotency token is derived from (an "
                          "HMAC of the step's key): required; the same for every process of a deployment, "
                          "different between deployments (staging, production) that share a provider account.")
    db_lock_retries: int = Field(5, ge=0, description="Retries of a transaction after a deadlock or lock-wait timeout.")
    db_lock_wait_timeout_seconds: int = Field(10, ge=1, description="innodb_lock_wait_timeout of our sessions.")
    db_pool_timeout_seconds: float = Field(
        10.0, gt=0, description="How long a transaction waits for a pooled connection (an infrastructure wait).")
    db_connect_timeout_seconds: float = Field(5.0, gt=0, description="TCP connect timeout of a new connection.")
    db_statement_timeout_seconds: float = Field(
        15.0, gt=0, description="Client-side bound of one statement; must exceed DB_LOCK_WAIT_TIMEOUT_SECONDS.")
    db_transaction_timeout_seconds: float = Field(
        30.0, gt=0, description="Client-side bound of one transaction, connection checkout included.")
    db_keepalive_seconds: int = Field(
        30, ge=1, description="TCP keepalive idle time of database connections (probes every 10 s, 3 probes).")
    db_sql_mode: str | None = Field(
        None, pattern=r"^([A-Za-z_]+(,[A-Za-z_]+)*)?$",
        description="sql_mode of every session (comma-separated modes, e.g. MySQL 8's default on MariaDB); "
                    "unset or empty: the server's default.")
    infra_retry_budget_seconds: float = Field(
        60.0, gt=0, description="How long (wall clock) a batch waits out an unreachable database before the "
                                "worker stops.")

    # -- external effects ---------------------------------------------------
    logistics_url: str = "http://127.0.0.1:8900"
    sms_url: str = "http://127.0.0.1:8900"
    sms_lookup: bool = Field(
        True, description="The gateway answers GET /v1/sms/{client_ref}: an SMS whose outcome is unknown is "
                          "verified, not failed for a person to reconcile.")
    sms_lookup_settle_seconds: float = Field(
        30.0, ge=0, description="How long after an SMS call with an unknown outcome the gateway is asked: a "
                                "request still on its way to it must have landed by then.")
    effect_timeout_seconds: float = Field(3.0, gt=0, description="The longest one call to a service may take, "
                                                               "its connection included.")
    effect_connect_timeout_seconds: float = Field(
        1.0, gt=0, description="The longest a call may wait for its connection (a new one, or a free one of its "
                               "pool); at most half of EFFECT_TIMEOUT_SECONDS is used. A call that got none sent "
                               "nothing: it is retried as not delivered, never looked up as maybe sent.")

    @property
    def effect_connect_timeout(self) -> float:
        """EFFECT_CONNECT_TIMEOUT_SECONDS, at most half of the call's: the rest is the request's."""
        return min(self.effect_connect_timeout_seconds, self.effect_timeout_seconds / 2)

    effect_concurrency: int = Field(
        128, ge=1, description="Effect calls in flight per worker, for the order agent's batches in flight together "
                               "(and as many again for the compensator's); its batches' calls must fit in a lease.")
    lease_seconds: float = Field(
        60.0, gt=0, description="How long a claim on a pending effect is exclusive; must cover a batch's calls.")
    lease_margin_seconds: float = Field(
        2.0, ge=0, description="A call starts only if the claim has its timeout plus this much lease left.")
    worker_heartbeat_seconds: float = Field(
        2.0, gt=0, description="How often every process writes its heartbeat (t_worker.last_seen), on a connection "
                               "of its own; a beat not through within this long is abandoned for a fresh one.")
    worker_dead_after_seconds: float = Field(
        15.0, gt=0, description="A process whose heartbeat is this old is presumed dead: its claims are taken over "
                                "from then, not at their lease's end; a process starts a call only if the call ends "
                                "before its own heartbeat is this old.")

    # -- batching -----------------------------------------------------------
    batch_size: int = Field(500, ge=1)
    batch_within_seconds: float = Field(1.0, gt=0)
    fetch_batches: bool = Field(
        True, description="The agent takes whole fetches from Faust's consumer (app.adapters.kafka.batches); "
                          "false: through Faust's stream and take_events(), record by record.")
    batches_in_flight: int = Field(
        2, ge=1, le=8,
        description="With FETCH_BATCHES, batches worked at once, of disjoint partitions: one waits on the "
                    "database while the next is decoded and planned. 1: one batch at a time.")
    retry_backoff_ms: str = Field("200,800,3200", description="Per-record retry delays; their count is the retry limit.")
    batch_deadline_seconds: float = Field(
        15.0, gt=0, description="Records still retrying this long after a batch began are dead-lettered as "
                                "deadline_exceeded (retriable), and the batch finishes.")
    max_event_bytes: int = Field(
        1024 * 1024, ge=1, le=4 * 1024 * 1024,
        description="Larger records are dead-lettered as oversized; the ledger keeps an event whole up to this.")
    max_batch_bytes: int = Field(
        64 * 1024 * 1024, ge=1024 * 1024,
        description="The most a compressed record batch may decompress to; a larger one is not decompressed "
                    "and its records are dead-lettered as oversized.")
    dlq_truncate_bytes: int = Field(
        64 * 1024, ge=1024, le=4 * 1024 * 1024,
        description="An oversized record goes to the dead-letter topic as its first this-many bytes.")
    slow_batch_seconds: float = Field(5.0, gt=0, description="A batch slower than this is logged with its phases.")
    dlq_send_timeout_seconds: float = Field(
        30.0, gt=0, description="How long a dead-letter send may take before the worker stops without committing.")
    dlq_retry_after_seconds: int = Field(
        60, ge=0, description="When a retriable dead letter becomes due for the compensator (next_retry_at).")

    # -- compensation -------------------------------------------------------
    compensator_enabled: bool = Field(True, description="Run the dead-letter agent and its timer in this worker.")
    compensator_batch_size: int = Field(10, ge=1, le=10, description="Dead letters per batch of the dead-letter "
                                                                     "agent (<= 10).")
    compensation_drain_batch_size: int = Field(
        100, ge=1, description="Due dead letters each worker claims and runs at once while draining; at most "
                               "BATCH_SIZE is used (a batch's calls must fit in a lease).")

    @property
    def drain_batch_size(self) -> int:
        """COMPENSATION_DRAIN_BATCH_SIZE, at most BATCH_SIZE (the lease is checked for a batch of that)."""
        return min(self.compensation_drain_batch_size, self.batch_size)
    compensator_within_seconds: float = Field(1.0, gt=0)
    compensation_backoff_seconds: float = Field(
        60.0, gt=0, description="First wait before a dead letter is retried again; doubles per attempt.")
    compensation_backoff_max_seconds: float = Field(3600.0, gt=0, description="The longest such wait.")
    compensation_max_attempts: int = Field(
        5, ge=1, description="Compensation attempts before a dead letter is left to a person (manual).")
    compensation_timer_seconds: float = Field(
        30.0, gt=0, description="How often every worker looks for dead letters that are due when none was; while "
                                "some are due, it drains them without pause.")
    compensation_sla_seconds: float = Field(
        1800.0, gt=0, description="A dead letter open longer than this breaches its SLA: the stuck sweep alerts.")

    # -- bulk actions on the dead-letter queue ---------------------------------
    bulk_rate_per_second: float = Field(
        200.0, gt=0, description="The most ledger rows a bulk job works per second (one job runs in one worker "
                                 "at a time): a backlog retried in bulk leaves room for the live traffic and "
                                 "for a service that just came back.")
    bulk_chunk_size: int = Field(
        100, ge=1, le=500, description="Rows of a bulk job claimed and run through the pipeline at once (its "
                                       "calls must fit in a lease, like a batch's).")
    bulk_max_rows: int = Field(50_000, ge=1, description="The most rows one bulk job may take; a wider filter is "
                                                         "refused (narrow it, or run several jobs).")
    bulk_count_tolerance_percent: float = Field(
        1.0, ge=0, le=100, description="How far (percent of the count seen, rounded down) the rows a filter "
                                       "selects may move between the dry run and the start; beyond it the start "
                                       "is refused with the count now.")
    bulk_lease_seconds: float = Field(
        30.0, gt=0, description="How long a worker's hold on a bulk job lasts without renewal (renewed every third "
                                "of it while a chunk runs, and after every chunk); a worker that died lets another "
                                "take the job over after this.")
    bulk_timer_seconds: float = Field(
        2.0, gt=0, description="How often every worker looks for a bulk job to run when it has none.")

    # -- operations: the stuck sweep, alerts, metrics -----------------------
    stuck_pending_seconds: float = Field(
        600.0, gt=0, description="A t_idem row pending longer than this is stuck: alerted on, GET /idem/stuck/.")
    stuck_sweep_seconds: float = Field(
        300.0, gt=0, description="How often one worker (a database lease) sweeps for stuck rows and overdue "
                                 "dead letters.")
    stuck_sweep_limit: int = Field(1000, ge=1, description="The most stuck rows one sweep reports one by one.")
    compensation_sweep_limit: int = Field(
        1000, ge=1, description="The most dead letters one sweep reports one by one, those past their SLA (critical) "
                                "first; a limit of their own, so stuck rows never crowd them out.")
    idem_max_attempts: int = Field(
        20, ge=2, description="Claims of one step key before it is left to a person: a pending row claimed this "
                              "often is alerted on and never claimed again automatically.")
    alert_webhook_url: str | None = Field(
        None, description="The sweep POSTs its alerts here in Alertmanager's webhook format (unset: logs and "
                          "metrics only).")
    alert_webhook_timeout_seconds: float = Field(5.0, gt=0)
    metrics_refresh_seconds: float = Field(
        30.0, gt=0, description="How often every worker reads the gauges that live in the database and the "
                                "group's lag from the broker.")

    # -- the dedup store's retention and capacity -----------------------------
    idem_retention_days: int = Field(
        90, ge=1, description="Monthly t_idem partitions wholly older than this are dropped, and an event whose "
                              "order date is older is dead-lettered as beyond_dedup_retention, never run again.")
    partitions_ahead: int = Field(3, ge=1, description="Monthly t_idem partitions kept ready after the current one.")
    partition_timer_seconds: float = Field(
        3600.0, gt=0, description="How often one worker (a database lease) adds and drops t_idem partitions.")
    partition_lock_wait_seconds: int = Field(
        2, ge=2, le=60, description="The longest a partition change may hold the pipeline's statements up while "
                                    "it waits for the table's metadata lock; then it gives up and tries again "
                                    "later (its lock_wait_timeout is half this: MariaDB waits twice). Keep it "
                                    "under DB_STATEMENT_TIMEOUT_SECONDS, or a statement queued behind a change "
                                    "times out and is waited out like a database outage.")
    capacity_events_per_second: float = Field(
        10.0, gt=0, description="Average event rate over a day: sizes t_idem for the capacity budget.")
    capacity_peak_events_per_second: float = Field(
        50.0, gt=0, description="The group's event rate at the busiest hour: sizes the replay window.")
    capacity_outage_sla_days: float = Field(
        7.0, ge=0, description="The longest stop of the consumers the service must survive (the budget command).")
    kafka_offsets_retention_days: float = Field(
        7.0, gt=0, description="The broker's offsets.retention.minutes, in days (the budget command).")
    capacity_row_bytes: int = Field(
        ROW_BYTES, ge=1, description="Bytes per t_idem row, indexes included (measured at 10 million rows).")
    idem_capacity_budget_rows: int | None = Field(
        None, ge=1, description="The rows t_idem is sized for; unset: computed by the budget command's model "
                                "from the capacity settings.")

    # -- web ----------------------------------------------------------------
    web_bind: str = "127.0.0.1"
    web_port: int = Field(6066, ge=1, le=65535)
    web_token: SecretStr | None = Field(
        None, description="Bearer token every POST must carry (it also reads every view); without it, actions "
                          "answer 403.")
    web_read_token: SecretStr | None = Field(
        None, description="Bearer token that reads the data views (the queue, orders, t_idem rows); WEB_TOKEN "
                          "reads them too. Without either, they answer 403.")
    web_allowed_hosts: str = Field(
        "", description="Host names the web views answer to besides 127.0.0.1, localhost, ::1, WEB_BIND and the "
                        "host of WEB_PUBLIC_URL (comma-separated); other Host headers answer 421 (DNS rebinding).")
    web_max_body_bytes: int = Field(16 * 1024, ge=256, description="The largest request body a view reads.")
    web_public_url: str | None = Field(
        None, description="How people reach this worker's web views, for links in alerts (unset: "
                          "http://WEB_BIND:WEB_PORT).")

    log_level: str = "info"
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="uvloop makes Faust's per-event machinery about 15% cheaper.")
    data_dir: str = Field(".cache/faust", description="Faust's working folder (it keeps no state we rely on).")

    # -- fault injection (tests only) ----------------------------------------
    chaos_kill_at: str | None = Field(
        None, description="Kill this worker with SIGKILL at a cut point: before_a, a_b, b_c or after_c.")

    @property
    def retry_backoff(self) -> tuple[float, ...]:
        """The per-record retry delays in seconds."""
        return tuple(int(part) / 1000 for part in self.retry_backoff_ms.split(",") if part.strip())

    @property
    def public_url(self) -> str:
        return (self.web_public_url or f"http://{self.web_bind}:{self.web_port}").rstrip("/")

    @property
    def allowed_hosts(self) -> frozenset[str]:
        """The Host names the web views answer to (lower case, no port)."""
        names = {"127.0.0.1", "localhost", "::1"}
        if self.web_bind not in ("0.0.0.0", "::", ""):
            names.add(self.web_bind.strip("[]"))
        if self.web_public_url:
            public = urlsplit(self.web_public_url).hostname
            if public:
                names.add(public)
        names.update(name.strip().strip("[]") for name in self.web_allowed_hosts.split(",") if name.strip())
        return frozenset(name.lower() for name in names)

    @property
    def kafka_bootstrap(self) -> str:
        """The broker list as aiokafka wants it (no ``kafka://`` scheme)."""
        urls = [url.strip() for part in self.kafka_broker.split(";") for url in part.split(",") if url.strip()]
        return ",".join(url.split("://", 1)[-1] for url in urls)

    @property
    def kafka_faust_broker(self) -> str:
        """The broker list as Faust wants it (``kafka://a:1;kafka://b:2``)."""
        return ";".join(f"kafka://{hostport}" for hostport in self.kafka_bootstrap.split(","))

    @property
    def kafka(self) -> "KafkaConnection":
        """How every Kafka client connects (the only reader of the KAFKA_SASL_*/KAFKA_SSL_* settings)."""
        from app.adapters.kafka.connection import KafkaConnection

        return KafkaConnection(
            bootstrap=self.kafka_bootstrap, security_protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism, sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password, ssl_cafile=self.kafka_ssl_cafile,
            ssl_certfile=self.kafka_ssl_certfile, ssl_keyfile=self.kafka_ssl_keyfile,
            ssl_check_hostname=self.kafka_ssl_check_hostname)

    @property
    def mysql_tls(self) -> "MySqlTls":
        """How every database connection is secured (the only reader of the MYSQL_SSL_* settings)."""
        from app.adapters.mysql.tls import MySqlTls

        return MySqlTls.of(self.mysql_ssl_mode, ca=self.mysql_ssl_ca, cert=self.mysql_ssl_cert,
                           key=self.mysql_ssl_key, verify_identity=self.mysql_ssl_verify_identity)

    @field_validator("mysql_ssl_mode", mode="before")
    @classmethod
    def _mode_in_any_case(cls, value):
        return value.strip().lower() or None if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        try:
            delays = self.retry_backoff
        except ValueError:
            raise ValueError(f"RETRY_BACKOFF_MS must be comma-separated integers, got {self.retry_backoff_ms!r}")
        if any(d < 0 for d in delays):
            raise ValueError("RETRY_BACKOFF_MS delays must not be negative")
        self._check_lease()
        self._check_heartbeat()
        self._check_timeouts()
        self._check_mysql_url()
        self.kafka          # contradictory security settings are refused here, with their names
        self.mysql_tls      # the same for the database's
        # Surrounding spaces (a copy and paste, a YAML value) are no part of a token: a request's
        # token is compared stripped, so the configured one is too. WEB_TOKEN="" is no token.
        for name in ("web_token", "web_read_token", "idem_token_secret"):
            token = getattr(self, name)
            if token is not None:
                value = token.get_secret_value().strip()
                setattr(self, name, SecretStr(value) if value else None)
        return self

    def step_tokens(self) -> "StepTokens":
        """How steps get their idempotency tokens (``app.pipeline.tokens``): from IDEM_TOKEN_SECRET.

        Raises :class:`SettingsError` when it is unset: random tokens, or tokens under a
        secret everybody knows, would send a second waybill and a second SMS for every step
        a failover or a restore made the store forget."""
        from app.pipeline.tokens import StepTokens

        if self.idem_token_secret is None:
            raise SettingsError(
                "IDEM_TOKEN_SECRET is not set: every step's idempotency token is derived from it, so that a "
                "replay after the database lost rows (a failover, a restore from backup) asks the services "
                "the same question. Set it to a long random value (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'), the same for every process of this deployment, another "
                "one for each other deployment, and keep it like a password.")
        return StepTokens(self.idem_token_secret.get_secret_value().encode("utf-8"))

    def _check_lease(self) -> None:
        """Every call of the batches in flight must fit in one lease. A call starts only with its
        timeout plus the margin of lease left (a call that would not fit is not made; the key is
        claimed again instead), so settings that make that the rule rather than the exception are
        refused here.

        * The order agent works ``BATCHES_IN_FLIGHT`` batches at once (with ``FETCH_BATCHES``), each
          of up to ``BATCH_SIZE`` calls, through one limiter of ``EFFECT_CONCURRENCY`` calls: the
          last call of the later batch may wait for every call of the other before it starts.
        * The compensator's processor has a limiter of its own, shared by a drain round
          (``COMPENSATION_DRAIN_BATCH_SIZE``), a batch of the dead-letter agent
          (``COMPENSATOR_BATCH_SIZE``) and a chunk of a bulk job (``BULK_CHUNK_SIZE``).

        Each call may take ``EFFECT_TIMEOUT_SECONDS``; a call whose outcome is unknown, or any SMS in
        a recovery window, is looked up first (``SMS_LOOKUP``), then sent: two calls."""
        calls = 2 if self.sms_lookup else 1
        batches = self.batches_in_flight if self.fetch_batches else 1
        for in_flight, what in (
                (batches * self.batch_size,
                 f"{batches} batch{'es' if batches > 1 else ''} of BATCH_SIZE={self.batch_size} calls"
                 + (f" (BATCHES_IN_FLIGHT={batches})" if batches > 1 else "")),
                (self.drain_batch_size + self.compensator_batch_size + min(self.bulk_chunk_size, self.batch_size),
                 f"the compensator's drain round, dead-letter batch and bulk chunk (COMPENSATION_DRAIN_BATCH_SIZE="
                 f"{self.drain_batch_size} + COMPENSATOR_BATCH_SIZE={self.compensator_batch_size} + BULK_CHUNK_SIZE="
                 f"{min(self.bulk_chunk_size, self.batch_size)} calls)")):
            rounds = math.ceil(in_flight / self.effect_concurrency)
            needed = rounds * calls * self.effect_timeout_seconds + self.lease_margin_seconds
            if self.lease_seconds < needed:
                raise ValueError(
                    f"LEASE_SECONDS={self.lease_seconds:g} cannot cover the calls in flight: {what}, "
                    f"EFFECT_CONCURRENCY={self.effect_concurrency} at a time, take up to {rounds} x "
                    f"{'2 (a lookup, then the send: SMS_LOOKUP=true) x ' if calls == 2 else ''}"
                    f"EFFECT_TIMEOUT_SECONDS={self.effect_timeout_seconds:g}, plus LEASE_MARGIN_SECONDS="
                    f"{self.lease_margin_seconds:g}: {needed:g} s. Raise LEASE_SECONDS to at least "
                    f"{math.ceil(needed)}, or raise EFFECT_CONCURRENCY, or lower BATCH_SIZE, BATCHES_IN_FLIGHT "
                    "or EFFECT_TIMEOUT_SECONDS.")

    def _check_heartbeat(self) -> None:
        """A worker that beats must still be able to call: between two heartbeats (and one that is
        slow) there must be room for a whole call before its heartbeat is too old."""
        needed = 2 * self.worker_heartbeat_seconds + self.effect_timeout_seconds + self.lease_margin_seconds + 1
        if self.worker_dead_after_seconds < needed:
            raise ValueError(
                f"WORKER_DEAD_AFTER_SECONDS={self.worker_dead_after_seconds:g} leaves no room for a call: it must be at "
                f"least 2 x WORKER_HEARTBEAT_SECONDS={self.worker_heartbeat_seconds:g} + EFFECT_TIMEOUT_SECONDS="
                f"{self.effect_timeout_seconds:g} + LEASE_MARGIN_SECONDS={self.lease_margin_seconds:g} + 1: {needed:g} s")

    def longest_batch_seconds(self) -> float:
        """The longest one batch may take, every wait counted:

        * phase 1's calls all start inside the lease of its T1, so they end by then
          (``LEASE_SECONDS``); phase 2 retries until ``BATCH_DEADLINE_SECONDS`` and may then
          still wait for a lookup and a send in flight (2 x ``EFFECT_TIMEOUT_SECONDS``);
        * the dead letters: their ledger rows, then the send (``DLQ_SEND_TIMEOUT_SECONDS``);
        * an unreachable database is waited out for ``INFRA_RETRY_BUDGET_SECONDS`` from its
          first failure, which a statement may take a transaction's timeout to see, and a
          transaction begun at the end of the budget may take one more.
        """
        work = max(self.lease_seconds, self.batch_deadline_seconds + 2 * self.effect_timeout_seconds)
        return (work + self.dlq_send_timeout_seconds + self.infra_retry_budget_seconds
                + 2 * self.db_transaction_timeout_seconds)

    def _check_timeouts(self) -> None:
        if self.db_statement_timeout_seconds <= self.db_lock_wait_timeout_seconds:
            raise ValueError(
                f"DB_STATEMENT_TIMEOUT_SECONDS={self.db_statement_timeout_seconds:g} must exceed "
                f"DB_LOCK_WAIT_TIMEOUT_SECONDS={self.db_lock_wait_timeout_seconds}: a statement waiting for a "
                "row lock would be cut off before the server reports the lock wait")
        if self.db_transaction_timeout_seconds < self.db_statement_timeout_seconds:
            raise ValueError(
                f"DB_TRANSACTION_TIMEOUT_SECONDS={self.db_transaction_timeout_seconds:g} must be at least "
                f"DB_STATEMENT_TIMEOUT_SECONDS={self.db_statement_timeout_seconds:g}")
        longest = self.longest_batch_seconds()
        if longest >= self.broker_rebalance_timeout_seconds:
            raise ValueError(
                f"a batch may take up to {longest:g} s: max(LEASE_SECONDS={self.lease_seconds:g}, "
                f"BATCH_DEADLINE_SECONDS={self.batch_deadline_seconds:g} + 2 x EFFECT_TIMEOUT_SECONDS="
                f"{self.effect_timeout_seconds:g}) + DLQ_SEND_TIMEOUT_SECONDS={self.dlq_send_timeout_seconds:g} + "
                f"INFRA_RETRY_BUDGET_SECONDS={self.infra_retry_budget_seconds:g} + 2 x "
                f"DB_TRANSACTION_TIMEOUT_SECONDS={self.db_transaction_timeout_seconds:g}; it must stay under "
                f"BROKER_REBALANCE_TIMEOUT_SECONDS={self.broker_rebalance_timeout_seconds:g}: a rebalance waits "
                "for the batch in flight, and a member that does not rejoin in time is evicted and its batch "
                "done again by another. Raise BROKER_REBALANCE_TIMEOUT_SECONDS or lower one of the others.")
        if self.batch_deadline_seconds >= self.broker_session_timeout_seconds:
            raise ValueError(
                f"BATCH_DEADLINE_SECONDS={self.batch_deadline_seconds:g} must stay under "
                f"BROKER_SESSION_TIMEOUT_SECONDS={self.broker_session_timeout_seconds:g}")

    def _check_mysql_url(self) -> None:
        charsets = parse_qs(urlsplit(self.mysql_url).query).get("charset", [])
        if any(charset.lower() != "utf8mb4" for charset in charsets):
            raise ValueError(
                f"MYSQL_URL asks for charset={','.join(charsets)}; the processor needs utf8mb4 (order data is "
                "arbitrary Unicode, and a narrower connection charset silently mangles it). Remove the charset "
                "parameter or set it to utf8mb4.")


class SettingsError(ValueError):
    """Settings that cannot work, said without the values (a password must not reach a log)."""


def explain(exc: ValidationError) -> str:
    """One line per problem, naming the environment variable; never the values given."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False, include_context=False):
        where = ".".join(str(part) for part in error["loc"]).upper()
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use.

    Raises :class:`SettingsError` with the problems and none of the values."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(f"the settings cannot work: {explain(exc)}") from None


def get_settings_or_exit() -> Settings:
    """For entry points: the settings, or one line on stderr and exit 78 (EX_CONFIG)."""
    try:
        return get_settings()
    except SettingsError as exc:
        print(f"order-event-processor: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
