"""Every setting of the processor, read once from the environment.

Nothing else in the project reads ``os.environ``: components receive the
values they need from a :class:`Settings` instance. Each field is listed in
the README's configuration table with its default.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Typed configuration; environment variable names are the upper-cased field names."""

    model_config = SettingsConfigDict(env_file=None, case_sensitive=False, extra="ignore")

    # -- identity -----------------------------------------------------------
    app_id: str = Field("order-event-processor", description="Faust app id = Kafka consumer group.")
    worker_id: str = Field(default_factory=_default_worker_id,
                           description="Names this process in t_idem.owner and dead-letter headers.")

    # -- Kafka --------------------------------------------------------------
    kafka_broker: str = "kafka://127.0.0.1:9092"
    order_event_topic: str = "order-event"
    order_event_partitions: int = Field(8, ge=1)
    dlq_topic: str = "order-event-dlq"
    dlq_partitions: int = Field(3, ge=1)
    topic_replication: int = Field(1, ge=1)
    broker_commit_interval_seconds: float = Field(2.8, gt=0)
    broker_session_timeout_seconds: float = Field(
        30.0, ge=6, description="A worker that stops heartbeating loses its partitions after this long.")
    broker_heartbeat_interval_seconds: float = Field(3.0, gt=0)
    broker_max_poll_records: int = Field(
        500, ge=1, description="Records handed to Faust per fetch; smaller keeps the event loop fair to batches.")

    # -- MariaDB / MySQL ----------------------------------------------------
    mysql_url: str = "mysql+aiomysql://idem:idem@127.0.0.1:3306/idem"
    db_pool_size: int = Field(4, ge=1)
    db_lock_retries: int = Field(5, ge=0, description="Retries of a transaction after a deadlock or lock-wait timeout.")
    db_lock_wait_timeout_seconds: int = Field(10, ge=1, description="innodb_lock_wait_timeout of our sessions.")
    infra_retry_budget_seconds: float = Field(
        60.0, gt=0, description="How long a batch waits out an unreachable database before the worker stops.")

    # -- external effects ---------------------------------------------------
    logistics_url: str = "http://127.0.0.1:8900"
    sms_url: str = "http://127.0.0.1:8900"
    effect_timeout_seconds: float = Field(3.0, gt=0)
    effect_concurrency: int = Field(64, ge=1, description="Effect calls in flight per worker.")
    lease_seconds: float = Field(
        30.0, gt=0, description="How long a claim on a pending effect is exclusive (>= 3 x timeout x attempts).")

    # -- batching -----------------------------------------------------------
    batch_size: int = Field(500, ge=1)
    batch_within_seconds: float = Field(1.0, gt=0)
    retry_backoff_ms: str = Field("200,800,3200", description="Per-record retry delays; their count is the retry limit.")
    max_event_bytes: int = Field(1024 * 1024, ge=1)
    slow_batch_seconds: float = Field(5.0, gt=0, description="A batch slower than this is logged with its phases.")
    dlq_send_timeout_seconds: float = Field(
        30.0, gt=0, description="How long a dead-letter send may take before the worker stops without committing.")
    dlq_retry_after_seconds: int = Field(
        60, ge=0, description="When a retriable dead letter becomes due for the compensator (next_retry_at).")

    # -- web ----------------------------------------------------------------
    web_bind: str = "127.0.0.1"
    web_port: int = Field(6066, ge=1, le=65535)

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
    def kafka_bootstrap(self) -> str:
        """The broker list as aiokafka wants it (no ``kafka://`` scheme)."""
        return ",".join(url.split("://", 1)[-1] for url in self.kafka_broker.split(";"))

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        try:
            delays = self.retry_backoff
        except ValueError:
            raise ValueError(f"RETRY_BACKOFF_MS must be comma-separated integers, got {self.retry_backoff_ms!r}")
        if any(d < 0 for d in delays):
            raise ValueError("RETRY_BACKOFF_MS delays must not be negative")
        if self.lease_seconds <= self.effect_timeout_seconds:
            raise ValueError(
                f"LEASE_SECONDS ({self.lease_seconds}) must exceed EFFECT_TIMEOUT_SECONDS "
                f"({self.effect_timeout_seconds}): a lease shorter than one call lets a second "
                "worker call the same effect while the first is still waiting for it")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
