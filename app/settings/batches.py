"""Batches: how the order agent takes records from Kafka and works them (size, waits, batches in
flight, per-record retries and their deadline), the bounds on a record's and a batch's bytes, and
the dead letters a batch sends.
"""

from __future__ import annotations

from pydantic import model_validator

from app.settings._base import Group, setting


class BatchesSettings(Group):
    TITLE = "Batches"

    size: int = setting("BATCH_SIZE", 500, ge=1,
        description='Events per batch.')

    within_seconds: float = setting("BATCH_WITHIN_SECONDS", 1.0, gt=0,
        description='How long a batch waits to fill up.')

    fetch: bool = setting("FETCH_BATCHES", True,
        description="The agent takes whole fetches from Faust's consumer, bypassing its per-record stream path "
                    "([Benchmark](benchmarks.md)); `false`: Faust's stream and `take_events()`, record by record.")

    in_flight: int = setting("BATCHES_IN_FLIGHT", 2, ge=1, le=8,
        description="With `FETCH_BATCHES`, the records in flight (taken, not finished) are at most this many batches'"
                    ' worth (1-8): the next batch is taken once a whole one fits. Records are acked as they finish;'
                    " an order's records in a later batch wait for that order in the earlier one, nothing else "
                    'does ([Records finish on their own](exactly-once.md#records-finish-on-their-own)); `1`: one batch at a time.')

    settle_group: int = setting("SETTLE_GROUP", 100, ge=1,
        description='Finished calls are recorded (T3) in groups of up to this many outcomes...')

    settle_after_ms: int = setting("SETTLE_AFTER_MS", 20, ge=0, le=1000,
        description='... or once the first of the group finished this long ago, whichever comes first (or once '
                    'no other call of the run is left); an order is finished, and its records acked, when its '
                    "group's T3 has committed.")

    retry_backoff_ms: str = setting("RETRY_BACKOFF_MS", "200,800,3200",
        description='Per-record retry delays; their count is the retry limit.')

    deadline_seconds: float = setting("BATCH_DEADLINE_SECONDS", 15.0, gt=0,
        description='Records still retrying this long after their batch began are dead-lettered as '
                    '`deadline_exceeded` (retriable) and the batch finishes; must stay under '
                    '`BROKER_SESSION_TIMEOUT_SECONDS`.')

    max_event_bytes: int = setting("MAX_EVENT_BYTES", 1024 * 1024, ge=1, le=4 * 1024 * 1024,
        description='Larger records are dead-lettered as `oversized`; the ledger keeps an event up to this whole, so '
                    'it can be run again from there (at most 4 MiB).')

    max_batch_bytes: int = setting("MAX_BATCH_BYTES", 64 * 1024 * 1024, ge=1024 * 1024,
        description='The most one compressed record batch may decompress to; a larger one is never decompressed and '
                    'its records are dead-lettered as `oversized` (this bounds the memory one record can cost).')

    dlq_truncate_bytes: int = setting("DLQ_TRUNCATE_BYTES", 64 * 1024, ge=1024, le=4 * 1024 * 1024,
        description='An oversized record goes to the dead-letter topic as its first this-many bytes.')

    slow_seconds: float = setting("SLOW_BATCH_SECONDS", 5.0, gt=0,
        description='A batch slower than this is logged with the time of each phase.')

    dlq_send_timeout_seconds: float = setting("DLQ_SEND_TIMEOUT_SECONDS", 30.0, gt=0,
        description='A dead-letter send not acknowledged by then stops the worker (exit 70); each produce request may'
                    ' take a third of it (at least 2 s), so one sent on a connection a network cut left hung is given'
                    ' up and sent again on a fresh one, twice, within the bound (idempotent: written once).')

    dlq_retry_after_seconds: int = setting("DLQ_RETRY_AFTER_SECONDS", 60, ge=0,
        description='`next_retry_at` of a retriable dead letter in `t_compensation`; sooner when its error knows when'
                    " a retry may help (a lease's end, an unknown SMS outcome's settle), at least a second from when "
                    'it was written.')

    @property
    def retry_backoff(self) -> tuple[float, ...]:
        """The per-record retry delays in seconds."""
        return tuple(int(part) / 1000 for part in self.retry_backoff_ms.split(",") if part.strip())

    @model_validator(mode="after")
    def _check(self) -> BatchesSettings:
        try:
            delays = self.retry_backoff
        except ValueError:
            raise ValueError(f"RETRY_BACKOFF_MS must be comma-separated integers, got {self.retry_backoff_ms!r}") from None
        if any(d < 0 for d in delays):
            raise ValueError("RETRY_BACKOFF_MS delays must not be negative")
        return self
