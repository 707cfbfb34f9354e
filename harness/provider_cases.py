"""What the tests of the providers' reconciliation share: a worker's lifecycle records produced and its
receipt awaited, the fake logistics API's records of an order, a reconcile's providers' side run in the
test's process on the worker's database and filed, a case read back."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from app.bootstrap import Runtime
from harness.events import event, record
from harness.services import produce, wait_for

LIFECYCLE = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")


@asynccontextmanager
async def runtime(settings, scratch_db, pair, fakes):
    """The runtime a reconcile run opens, on the worker's database, group and fakes."""
    urls = {name.lower(): value for name, value in fakes.env().items()}
    rt = await Runtime(settings.model_copy(update={"mysql_url": scratch_db.url, "app_id": pair.group, **urls})).start(
        kafka=False)
    try:
        yield rt
    finally:
        await rt.stop()


async def reconciled(rt, since: datetime):
    """The providers' section from ``since`` to a minute from now, its findings filed."""
    section = await rt.compare_providers(since, datetime.now(UTC) + timedelta(minutes=1))
    return section, await rt.adapters.reconcile_cases.file(section.findings, run_id=None)


def confirmed(settings, scratch_db, pair, worker, order: str) -> str:
    """``order`` created, paid and confirmed on the worker's topic: its receipt's waybill."""
    asyncio.run(produce(settings, pair.events, [record(event(order, t)) for t in LIFECYCLE]))
    return wait_for(lambda: scratch_db.scalar("SELECT waybill_no FROM t_waybill_receipt WHERE order_no = %s", order),
                    timeout=90, what=f"{order}'s receipt", workers=[worker])


def issued(fakes, order: str) -> list[dict]:
    """Every waybill the fake logistics API issued for ``order``."""
    return [w for w in fakes.ledger()["issued"] if w["order_no"] == order]


def case_of(scratch_db, group: str, kind: str, order: str) -> dict:
    [case] = scratch_db.query("SELECT * FROM t_reconcile_case WHERE consumer_group = %s AND kind = %s AND order_no = %s",
                              group, kind, order)
    return case
