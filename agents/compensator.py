"""The dead-letter agent: each dead letter, in batches of at most 10, to the compensator.

The same ack discipline as the ``order-event`` agent: a batch is acknowledged only
when the loop asks for the next one, after every dead letter of it has its ledger
row saying what became of it (compensated, superseded, manual, or open with its
next retry due). A database that stays away past the budget, or anything else
unexpected, stops the process without acknowledging (``app.exits``). Rows that are
not due yet are left to the timer (``app.timers.compensation``): nothing loops
through Kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import faust

from app.adapters.kafka.records import source_record
from app.compensation.compensator import Compensator
from app.exits import stop_without_ack
from app.injection import Wire
from app.observability import metrics
from app.pipeline.outage import OutageGuard
from app.settings import Settings

log = logging.getLogger(__name__)


async def compensate_dead_letters(stream, *, settings: Settings, compensator: Compensator,
                                  guard: Callable[[], OutageGuard]) -> None:
    log.info("compensating %s as %s", settings.kafka.dlq_topic, compensator.processor.owner)
    async for batch in stream.take_events(settings.compensation.batch_size,
                                          within=settings.compensation.within_seconds):
        try:
            budget = guard()
            runs = set()        # unreadable record batches seen in this batch: one row stands for each
            for event in batch:
                record = source_record(event.message)
                if record.unreadable is not None:
                    run = (record.topic, record.partition, record.unreadable.first)
                    if run in runs:
                        metrics.COMPENSATIONS.labels("manual").inc()
                        continue
                    runs.add(run)
                ended = await compensator.handle_dead_letter(record, budget)
                metrics.COMPENSATIONS.labels(ended).inc()
        except BaseException as exc:  # noqa: B036 -- see app.exits
            stop_without_ack(exc)


def register(app: faust.App, topic: faust.TopicT, settings: Settings, wire: Wire):
    """The dead-letter agent on ``app``, working with the runtime's compensator (found as the agent starts)."""
    return app.agent(topic, name="compensator", concurrency=1)(wire.resolved(compensate_dead_letters))
