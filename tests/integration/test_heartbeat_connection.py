"""A worker's heartbeat on a database connection that hangs (a cut, a restart behind a proxy that
leaves the old connections half-open): the beat is abandoned within its interval and the next one
goes through on a fresh connection, long before the worker's own fence would stop its calls. A beat
that waited a transaction's whole timeout (30 s) left the worker refusing every call for 20 s
while its claims went through: each claim then cost its step an attempt for nothing. Real
MariaDB behind a TCP proxy the test owns."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.bootstrap import Runtime
from harness.proxy import proxied_database


@pytest.fixture
def proxied_url(scratch_db):
    with proxied_database(scratch_db.url) as (proxy, url):
        yield proxy, url


async def test_a_heartbeat_on_a_connection_that_hung_is_abandoned_and_the_next_gets_through(settings, proxied_url):
    proxy, url = proxied_url
    runtime = await Runtime(settings.model_copy(update={"mysql_url": url})).start(kafka=False)
    fence, needs = runtime.fence, runtime.processor.call_needs
    try:
        while fence.last_beat is None:
            await asyncio.sleep(0.05)
        # Every connection open now hangs for good; connections opened from now on go through.
        proxy.blackhole()
        proxy.restore()
        await asyncio.sleep(0.2)           # the proxy's own thread has applied both
        cut = time.monotonic()
        while fence.last_beat < cut:
            now = time.monotonic()
            refused = fence.refusal(now, needs, now)
            assert refused is None, f"{now - cut:.1f}s after the cut, no heartbeat got through: {refused}"
            await asyncio.sleep(0.1)
    finally:
        await runtime.stop()
