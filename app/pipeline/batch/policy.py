"""How a worker's batches are worked, and who works them: the values a batch handler is built with
(``app.bootstrap`` fills them from the settings)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPolicy:
    """The rules of a batch: how its records are retried, held and dead-lettered, and its deadline."""

    backoff: tuple[float, ...]        # the delays of a record's retries in its batch, one per retry
    max_event_bytes: int              # a record larger than this is dead-lettered unread
    infra_budget: float               # seconds the database may stay unreachable before the batch is Fatal
    max_lease_wait: float             # seconds a record waits, in all, for another claimant's lease
    # Seconds from the batch's start, well under the group's rebalance timeout: a rebalance waits for
    # the batch in flight, and a member that does not rejoin in time is evicted and its commit refused.
    deadline: float = 15.0
    dlq_retry_after: int = 60         # seconds before the compensator redrives a retriable letter
    concurrency: int = 64             # orders retrying at once
    hold_records: int = 0             # records held at most, in all, while their provider's breaker is open

    def __post_init__(self) -> None:
        object.__setattr__(self, "backoff", tuple(self.backoff))


@dataclass(frozen=True, slots=True)
class Identity:
    """Who works the batches: the consumer group (its ledger rows', its spans') and the worker (named in
    each dead letter)."""

    group: str
    worker_id: str
