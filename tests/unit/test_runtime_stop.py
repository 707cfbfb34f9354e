"""A worker's runtime closes its HTTP session and engine only after the background work in flight
(a drain round of the compensator) has finished, and starts none once it is stopping."""

from __future__ import annotations

import asyncio

import pytest

from app.background import RuntimeStopping
from app.bootstrap import Runtime
from app.settings import Settings


def test_stop_waits_for_the_round_in_flight_and_refuses_new_ones():
    async def scenario() -> None:
        runtime = Runtime(Settings())
        finished = asyncio.Event()
        background = runtime.background          # what the timers are handed
        async with background.working():
            stopping = asyncio.ensure_future(runtime.stop())
            await asyncio.sleep(0.05)
            assert background.stopping and not stopping.done(), "stop() did not wait for the round in flight"
            finished.set()
        await asyncio.wait_for(stopping, 5)
        with pytest.raises(RuntimeStopping):
            async with background.working():
                pass

    asyncio.run(scenario())
