"""Finishing: an order's part ends once its first try's results are in. Each record asking for what
an earlier one asks for follows its lead; those that ended well are counted; those that may end well
yet are retried (``retries``); the others, and the retries that gave up, are dead-lettered together
(``dead_letters``). Only then are the part's records told finished: their outcomes are committed, or
their dead letters are in the ledger and on the topic. An order's records finish together; other
orders do not wait for them."""

from __future__ import annotations

import asyncio

import app.pipeline.batch.dead_letters as dead_letters
import app.pipeline.batch.holds as holds
from app.pipeline import letters
from app.pipeline.batch.retries import Retry, copies_follow_their_lead, retry_order
from app.pipeline.batch.state import Batch, Item
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import DeadLetter


def skipped(batch: Batch, indices: list[int]) -> None:
    """Records of types not handled: finished as they are."""
    if indices:
        batch.report.outcomes[Outcome.SKIPPED] += len(indices)
        if batch.story is not None:
            batch.story.ended(indices, Outcome.SKIPPED)
        batch.tell(indices)


async def finish_part(batch: Batch, part: list[Item], items: list[Item], results: asyncio.Future, *,
                      last: bool) -> bool:
    """Records ``part`` of the order's ``items``, once their first try's ``results`` are in: retried,
    dead-lettered, then told finished. Whether it sent letters (``last``: the order's last part, whose
    letters end its turn in the letters group)."""
    dead: list[DeadLetter] = []
    retry: Retry = []
    for lead, result, copies in copies_follow_their_lead(part, await results):
        if result.ok:
            assert result.outcome is not None           # ok: it ended well
            batch.ended(lead, result.outcome, copies)
            continue
        if result.error is not None:
            for item in (lead, *copies):
                item.attempts, item.first_failure = 1, letters.now()
            if not (result.error.retriable and result.error.retry_in_batch) and not holds.waits(batch, result.error):
                dead.append(dead_letters.of_item(batch, lead, result.error))
                dead.extend(dead_letters.of_item(batch, item, letters.same_request(result.error, lead.record))
                            for item in copies)
                continue
        retry.append((lead, result.error))
        retry.extend((item, result.error) for item in copies)     # one piece of work again below
    if retry:
        async with batch.slots:
            await retry_order(batch, retry, dead, len(part))
    if dead:
        await dead_letters.send_order(batch, dead, items, last=last)
    batch.tell([item.index for item in part])
    return bool(dead) and last
