"""What a worker exports of the operator controls: every effect and every partition of the input has
its series, 0 when nothing holds or pauses it, so a dashboard and the alerts' filters (``== 1`` on the
right of ``unless``) read the same whether or not a person ever held or paused anything."""

from __future__ import annotations

from datetime import datetime, timedelta

from prometheus_client import REGISTRY

from app.pipeline.controls import Controls, Hold, Pause
from app.timers.controls import export


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_every_partition_and_effect_has_its_series_at_0_and_a_pause_or_hold_at_1():
    controls = Controls()
    export(controls, ("waybill", "sms"), "order-event", 4)
    assert [value("order_partition_paused", topic="order-event", partition=str(p)) for p in range(4)] == [0, 0, 0, 0]
    assert value("order_effect_held", effect="sms") == 0

    now = datetime(2026, 12, 7, 12, 0)
    controls.update([Hold(1, "sms", now, now + timedelta(hours=1), True, "maintenance", "web:alice", True)],
                    [Pause(2, "order-event", 3, "a poisoned stretch", "web:alice", now)])
    export(controls, ("waybill", "sms"), "order-event", 4)
    assert [value("order_partition_paused", topic="order-event", partition=str(p)) for p in range(4)] == [0, 0, 0, 1]
    assert (value("order_effect_held", effect="sms"), value("order_effect_held", effect="waybill")) == (1, 0)

    controls.update([], [])
    export(controls, ("waybill", "sms"), "order-event", 4)
    assert value("order_partition_paused", topic="order-event", partition="3") == 0
    assert value("order_effect_held", effect="sms") == 0
