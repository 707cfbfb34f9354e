"""Receipt writers, by effect name: an effect whose receipt has a table of its own writes
it here, in T3, in the same transaction as its key's pending -> done. An effect without
a writer keeps its receipt in ``t_idem`` alone (its ``outcome``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from app.adapters.mysql.sql import Execute, marks
from app.pipeline.ports import Finished
from app.pipeline.steps import ISSUE_WAYBILL

Writer = Callable[[Execute, Sequence[Finished]], Awaitable[None]]


async def write_waybills(execute: Execute, done: Sequence[Finished]) -> None:
    """One receipt per order, written only with the fenced pending -> done of its key:
    an existing one can only be this T3's own, from a commit that was lost."""
    params = [v for f in done for v in (f.job.order_no, f.receipt.reference, f.job.token, f.job.biz_key,
                                        f.job.attempt)]
    await execute(
        "INSERT INTO t_waybill_receipt (order_no, waybill_no, idem_token, biz_key, attempt, gmt_create) "
        f"VALUES {marks(len(done), '(%s, %s, %s, %s, %s, NOW(3))')} ON DUPLICATE KEY UPDATE order_no = order_no",
        params)


WRITERS: Mapping[str, Writer] = {ISSUE_WAYBILL.name: write_waybills}
