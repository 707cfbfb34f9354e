"""Dead letters: records the batch gives up on, and how they leave it.

A dead letter goes first to the compensation ledger (``t_compensation``, one row
per record and consumer group, so a replay adds nothing), then to the
dead-letter topic, acknowledged by the broker; only then may the batch be
committed. If either step fails, :class:`Fatal`: the worker stops without
committing, and Kafka delivers the batch again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime

from app.pipeline.errors import DeadlineExceeded, Fatal, PipelineError, StoreFailure
from app.pipeline.events import OrderEvent
from app.pipeline.plan import step_keys
from app.pipeline.ports import DeadLetter, DeadLetterSink, SourceRecord, Store

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


def for_record(record: SourceRecord, error: PipelineError, *, attempts: int, first: datetime,
               worker_id: str) -> DeadLetter:
    """A letter for a record that never became an event (it broke the contract)."""
    return DeadLetter(record=record, reason=error.reason, message=str(error), retriable=error.retriable,
                      attempts=attempts, first_failure_at=first, worker_id=worker_id, retry_in=error.wait_seconds)


def for_event(record: SourceRecord, event: OrderEvent, error: PipelineError, *, attempts: int, first: datetime,
              worker_id: str) -> DeadLetter:
    """A letter for an event the pipeline could not finish: it names the order and the step key."""
    keys = step_keys(event)
    return replace(for_record(record, error, attempts=max(attempts, 1), first=first, worker_id=worker_id),
                   order_no=event.order_no, event_id=event.event_id, biz_key=keys[0], step_keys=tuple(keys))


def same_request(error: PipelineError, lead: SourceRecord) -> PipelineError:
    """``lead``'s error, for a record that asked for the same thing and was not tried on its own."""
    shared = PipelineError(f"same request as {lead.topic}[{lead.partition}]@{lead.offset}, which ended: {error}",
                           reason=error.reason)
    shared.retriable, shared.wait_seconds = error.retriable, error.wait_seconds
    return shared


def past_deadline(error: PipelineError | None, deadline: float) -> DeadlineExceeded:
    last = "not tried: its order's earlier records took the time" if error is None else \
        f"last error {error.reason}: {error}"
    return DeadlineExceeded(f"the batch's {deadline:g}s deadline passed while retrying; {last}",
                            wait_seconds=None if error is None else error.wait_seconds)


def flag_overtaken(letters: list[DeadLetter], positions: dict[int, int], last_of_order: dict[str, int]) -> None:
    """Flag letters whose order had later events in this batch (those ran after them).

    ``positions`` maps ``id(record)`` to its index in the batch, ``last_of_order`` an
    order to the index of its last event there."""
    letters[:] = [replace(letter, may_be_superseded=True)
                  if letter.order_no and last_of_order.get(letter.order_no, -1) > positions.get(id(letter.record), -1)
                  else letter
                  for letter in letters]


async def deliver(letters: list[DeadLetter], *, store: Store, sink: DeadLetterSink, group: str, owner: str,
                  retry_after: int, guard: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]) -> list[DeadLetter]:
    """The ledger rows, then the records on the topic; returns the letters as sent.

    The claims ``owner`` holds on the letters' steps are released with the ledger rows:
    nobody works those records here any more, and the compensator (or a person's retry)
    must not wait out a lease for them."""
    letters = sink.prepare(sorted(letters, key=lambda letter: (letter.record.topic, letter.record.partition,
                                                                letter.record.offset)))
    # As they will be sent (the ledger says which records went out truncated). The row
    # first: the same record dead-lettered twice (a replay) finds its row and adds none.
    async def record(some: list[DeadLetter]) -> None:
        await guard(lambda: store.in_transaction(lambda tx: tx.record_dead_letters(
            some, group=group, retry_after_seconds=retry_after, release_owner=owner)))

    try:
        await record(letters)
    except StoreFailure as exc:
        # A letter the database refuses for good would refuse it after every restart: find it,
        # and keep what the ledger can take of it (the record itself is on the topic).
        log.error("the ledger refused %d dead letters (%r); writing them one by one", len(letters), exc)
        for letter in letters:
            try:
                await record([letter])
            except StoreFailure as refused:
                log.error("the ledger refused the dead letter of %s[%s]@%s (%r); keeping it without its record",
                          letter.record.topic, letter.record.partition, letter.record.offset, refused)
                await record([_without_record(letter, refused)])
    try:
        await sink.publish(letters)
    except Exception as exc:
        raise Fatal(f"{len(letters)} dead letters not acknowledged by the broker: {exc!r}") from exc
    for letter in letters:
        log.warning("dead-lettered %s[%s]@%s (%s): %s", letter.record.topic, letter.record.partition,
                    letter.record.offset, letter.reason, letter.message[:300])
    return letters



def _without_record(letter: DeadLetter, refused: Exception) -> DeadLetter:
    """``letter`` as the ledger can always take it: its coordinates and reason, not its bytes."""
    bare = replace(letter.record, key=None, value=None, headers=())
    return replace(letter, record=bare, event_id=None, worker_id=(letter.worker_id or "")[:128] or None,
                   message=(f"the ledger could not keep this letter as it is ({refused!r:.300}); the record is on the "
                            f"dead-letter topic. {letter.message}")[:1024])
