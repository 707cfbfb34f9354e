"""The pipeline in this process against real MariaDB and the fake services over real HTTP."""

from __future__ import annotations

import itertools

import aiohttp

from app.adapters.effects import EffectClients
from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import create_engine
from app.bootstrap import EFFECT_CLIENTS
from app.pipeline.batch import BatchHandler, BatchPolicy, Identity
from app.pipeline.events import decode
from app.pipeline.ports import SourceRecord
from app.pipeline.processor import Processor, ProcessorPolicy, Safeguards
from app.pipeline.tokens import StepTokens
from demo.fakes.registry import worker_settings
from harness.events import event, order_no, record
from harness.services import TEST_TOKEN_SECRET

_owners = itertools.count(1)
_offsets = itertools.count(1)


def ev(order: str, type_: str, **kw):
    return decode(*record(event(order, type_, **kw)), max_bytes=1 << 20)


def source(doc: dict, topic: str = "order-event") -> SourceRecord:
    key, value = record(doc)
    return SourceRecord(topic, 0, next(_offsets), 1_764_000_000_000, key, value)


class MemorySink:
    """A dead-letter sink that keeps what it was given (the pipeline's view; Kafka is not the subject)."""

    def __init__(self) -> None:
        self.sent = []

    def prepare(self, letters):
        return list(letters)

    async def publish(self, letters) -> None:
        self.sent += list(letters)


class Harness:
    """Processors with their own engines (own connections), sharing one fake server."""

    def __init__(self, settings, db, base_url):
        self.settings, self.db, self.base_url = settings, db, base_url
        self._closers = []

    def store(self, store_class=MySqlStore, *, pool_size=None, max_overflow=None, **options) -> MySqlStore:
        engine = create_engine(self.settings, url=self.db.url, pool_size=pool_size, max_overflow=max_overflow)
        self._closers.append(engine.dispose)
        return store_class(engine, **options)

    async def processor(self, *, lease=30.0, timeout=2.0, sms_url=None, owner=None, concurrency=64, margin=0.0,
                        store=None, lease_check=True, sms_lookup=True, settle=30.0,
                        providers=None, limits=None) -> Processor:
        """``providers``: settings by nested name (``{"effects__waybill__provider": "express"}``).
        ``lease_check=False`` plays a worker that stalls in the middle of a call (a GC pause,
        SIGSTOP) past its lease, which the check before each call cannot prevent."""
        session = aiohttp.ClientSession()
        self._closers.append(session.close)
        urls = {name.lower(): url for name, url in worker_settings(self.base_url).items()}
        settings = self.settings.model_copy(update={**urls, "effects__sms__url": sms_url or self.base_url,
                                                    "effect_timeout_seconds": timeout, "effects__sms__lookup": sms_lookup,
                                                    "effects__sms__lookup_settle_seconds": settle, **(providers or {})})
        effects = EffectClients({name: make(session, settings.effects) for name, make in EFFECT_CLIENTS.items()})
        policy = ProcessorPolicy(lease_seconds=lease, effect_concurrency=concurrency,
                                 effect_timeout=timeout if lease_check else 0.0, lease_margin=margin)
        return Processor(store or self.store(), effects, owner=owner or f"test-{next(_owners)}/main/x",
                         tokens=StepTokens(TEST_TOKEN_SECRET.encode()), policy=policy,
                         safeguards=Safeguards(limits) if limits is not None else None)

    def batches(self, processor: Processor, sink=None, *, group: str = "test-group", **policy) -> BatchHandler:
        """``policy``: the fields of :class:`BatchPolicy` to set otherwise."""
        rules = dict(backoff=(0.05, 0.1, 0.2), max_event_bytes=1 << 20, infra_budget=10, max_lease_wait=5, deadline=15)
        return BatchHandler(processor, processor.store, sink or MemorySink(), identity=Identity(group, "test-worker"),
                            policy=BatchPolicy(**{**rules, **policy}))

    async def close(self):
        for close in reversed(self._closers):
            await close()

    def idem(self, key):
        return self.db.query("SELECT * FROM t_idem WHERE biz_key = %s", key)

    def order(self, order):
        rows = self.db.query("SELECT * FROM t_order WHERE order_no = %s", order)
        return rows[0] if rows else None


async def paid_orders(processor: Processor, n: int, prefix: str) -> list[str]:
    orders = [order_no(prefix=prefix) for _ in range(n)]
    results = await processor.run([ev(o, t) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID")])
    assert all(r.outcome == "applied" for r in results)
    return orders
