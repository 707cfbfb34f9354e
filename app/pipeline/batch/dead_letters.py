"""Dead letters: the records a batch gives up on, sent in groups.

Each order's part, and the loose letters (records that are no event), add their letters to the batch's
letters group (``Batch.letters``) and wait until they are sent; one reader (:func:`deliver`) sends a
group at a time: the ledger rows, then the records on the dead-letter topic, acknowledged by the broker
(``app.pipeline.letters``). Only then are those records finished. A group goes once it holds 500
letters, 20 ms after its first, or once every order that may still add one has.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from app.pipeline import letters
from app.pipeline.batch.state import Batch, Item
from app.pipeline.errors import MalformedEvent, PipelineError
from app.pipeline.groups import Group
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import DeadLetter, SourceRecord

GROUP_SIZE = 500
GROUP_AFTER = 0.02


def group(producers: int) -> Group:
    """A batch's letters group, for ``producers`` (its orders, and its loose letters if any)."""
    return Group(GROUP_SIZE, GROUP_AFTER, producers=producers)


async def deliver(batch: Batch) -> None:
    """Send each group of the batch's letters as it fills, until the group is closed and empty."""
    crew = batch.crew
    while (taken := await batch.letters.next()) is not None:
        some = [letter for part, _ in taken for letter in part]
        batch.report.dead_letters.extend(await letters.deliver(
            some, store=crew.store, sink=crew.sink, group=crew.identity.group, owner=crew.processor.owner,
            retry_after=crew.policy.dlq_retry_after, guard=batch.guard))
        for _, sent in taken:
            sent.set_result(None)


async def send(batch: Batch, dead: list[DeadLetter], *, last: bool = True) -> None:
    """Hand ``dead`` to the letters group and wait until they are sent (``last``: the sender's last)."""
    sent = asyncio.get_running_loop().create_future()
    batch.letters.add((dead, sent), len(dead), last=last)
    await sent


async def send_order(batch: Batch, dead: list[DeadLetter], items: list[Item], *, last: bool) -> None:
    """An order's letters (of its ``items``), flagged where later records of the order ran after them."""
    letters.flag_overtaken(dead, {id(item.record): item.index for item in items},
                           {items[0].event.order_no: items[-1].index})
    await send(batch, dead, last=last)
    batch.report.outcomes[Outcome.DEAD_LETTER] += len(dead)


async def send_loose(batch: Batch, loose: list[tuple[DeadLetter, list[int]]]) -> None:
    """The letters of records that are no event; then those records are finished."""
    await send(batch, [letter for letter, _ in loose])
    batch.report.outcomes[Outcome.DEAD_LETTER] += len(loose) + sum(batch.report.covered.values())
    batch.tell([index for _, indices in loose for index in indices])


# -- the letters ------------------------------------------------------------------------------------


def of_item(batch: Batch, item: Item, error: PipelineError) -> DeadLetter:
    """The letter of an event the batch could not finish (it names the order and the step key)."""
    letter = letters.for_event(item.record, item.event, error, attempts=item.attempts,
                               first=item.first_failure or letters.now(), worker_id=batch.crew.identity.worker_id)
    return letter if batch.story is None else batch.story.dead_lettered(letter, [item.index])


def of_record(record: SourceRecord, error: PipelineError, worker_id: str) -> DeadLetter:
    """The letter of a record that never became an event."""
    return letters.for_record(record, error, attempts=1, first=letters.now(), worker_id=worker_id)


def of_run(unread: list[SourceRecord], worker_id: str) -> DeadLetter:
    """One letter for the unreadable records of one record batch in this batch: a record
    batch of 200,000 unreadable records is not 200,000 letters (each with the raw batch)."""
    first, last, problem = unread[0], unread[-1], unread[0].unreadable
    assert problem is not None          # a run holds only records that came unreadable
    where = (f"This letter stands for offsets {first.offset}..{last.offset} ({len(unread)} records) of that "
             f"record batch ({problem.first}..{problem.last}, {problem.last - problem.first + 1} records).")
    if first.offset != problem.first:
        where += f" The raw record batch is the value of the letter for offset {problem.first}."
    error = MalformedEvent(f"{problem.message} {where}", reason=problem.reason)
    return replace(of_record(first, error, worker_id), covers=(first.offset, last.offset, len(unread)))
