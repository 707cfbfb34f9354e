"""What the worker's aiokafka consumer knows of its group membership and fetching.

Faust 0.15.3 runs the aiokafka consumer in a thread of its own, on that thread's event loop
(``AIOKafkaConsumerThread``, ``app.consumer._thread``). From the main loop this module only
reads plain attributes (whole values under the GIL) and hands anything that acts on the
consumer to the consumer's loop with ``call_soon_threadsafe``.

aiokafka 0.14 keeps the time of the last successful heartbeat in a local variable of
``GroupCoordinator._heartbeat_routine``; :meth:`ConsumerProbe.read` therefore wraps the
coordinator's ``_do_heartbeat`` and ``_do_rejoin_group`` (on that one instance, through
``app.adapters.kafka.upstream.replace_on_instance``) to note when one succeeded, and since when a
join has been in flight.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiokafka.conn import CloseReason

from app.adapters.kafka import upstream
from app.pipeline.liveness import Observation

log = logging.getLogger(__name__)


class ConsumerProbe:
    def __init__(self, app: Any) -> None:
        self.app = app
        self._coordinator: Any = None
        self.heartbeat_ok_at: float | None = None
        self.joining_since: float | None = None

    def _consumer(self) -> Any:
        thread = getattr(self.app.consumer, "_thread", None)
        return getattr(thread, "_consumer", None)

    def read(self, batch_in_flight: bool) -> Observation | None:
        """One look at the consumer; None before it has started."""
        consumer = self._consumer()
        coordinator = getattr(consumer, "_coordinator", None)
        if consumer is None or coordinator is None:
            return None
        if coordinator is not self._coordinator:
            self._watch(coordinator)
        subscription = consumer._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        position = lag = 0
        if assignment is not None:
            for tp in list(assignment.tps):
                state = assignment.state_value(tp)
                if state is None or state._position is None:
                    continue
                position += state._position
                end = state.lso if state.lso is not None else state.highwater
                if end is not None:
                    lag += max(0, end - state._position)
        joining = self.joining_since
        return Observation(member=assignment is not None and assignment.active,
                           heartbeat_ok_at=self.heartbeat_ok_at, position=position, lag=lag,
                           batch_in_flight=batch_in_flight,
                           joining_for=None if joining is None else time.monotonic() - joining)

    def _watch(self, coordinator: Any) -> None:
        """Note every successful heartbeat and join of ``coordinator`` (this instance only)."""
        heartbeat, rejoin = coordinator._do_heartbeat, coordinator._do_rejoin_group

        async def _do_heartbeat() -> bool:
            ok = await heartbeat()
            if ok:
                self.heartbeat_ok_at = time.monotonic()
            return ok

        async def _do_rejoin_group(subscription: Any) -> bool:
            self.joining_since = time.monotonic()
            try:
                ok = await rejoin(subscription)
            finally:
                self.joining_since = None
            if ok:
                self.heartbeat_ok_at = time.monotonic()
            return ok

        upstream.replace_on_instance(coordinator, "_do_heartbeat", _do_heartbeat)
        upstream.replace_on_instance(coordinator, "_do_rejoin_group", _do_rejoin_group)
        self._coordinator = coordinator

    def force_rejoin(self) -> None:
        """Ask the consumer's loop to look the coordinator up again and rejoin the group."""
        consumer = self._consumer()
        thread = getattr(self.app.consumer, "_thread", None)
        if consumer is None or thread is None:
            return
        coordinator, client = consumer._coordinator, consumer._client

        def rejoin() -> None:
            # Every connection is closed first: after a network cut a connection may hang for
            # good (a firewall or NAT that dropped it), and a request on it waits out the request
            # timeout (Faust's 90 s) before aiokafka gives it up; its callers get a connection
            # error now and retry on a fresh one.
            for conn in list(getattr(client, "_conns", {}).values()):
                conn.close(reason=CloseReason.CONNECTION_BROKEN)
            # request_rejoin wakes the coordination routine, which joins again (keeping our
            # member id: a new one would leave a ghost member that holds the rebalance up for a
            # session timeout). coordinator_dead makes it look the coordinator up first: the
            # one it holds may be the node that went away.
            coordinator.request_rejoin()
            coordinator.coordinator_dead()
            client.force_metadata_update()

        thread.thread_loop.call_soon_threadsafe(rejoin)
