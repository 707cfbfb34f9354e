"""Every worker reads the operator controls every ``CONTROLS_REFRESH_SECONDS`` (``app.pipeline.controls``):
the effects people hold and the partitions they pause reach it within that long, and it exports
them (``order_effect_held``, ``order_partition_paused``...). A read that fails keeps what was read
last (logged once per failing spell): a hold or a pause never lapses because the database was away.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC

import faust

from app.adapters.mysql.controls import MySqlControls
from app.background import BackgroundWork, RuntimeStopping
from app.injection import Wire
from app.observability import metrics
from app.pipeline.controls import Controls
from app.settings import Settings

log = logging.getLogger(__name__)


class _Reading:
    failing = False


async def read_controls(*, controls: Controls, operator_controls: MySqlControls, background: BackgroundWork,
                        effect_names: tuple[str, ...], settings: Settings) -> None:
    try:
        async with background.working():
            holds, pauses = await operator_controls.in_force()
    except RuntimeStopping:
        return
    except Exception as exc:
        if not _Reading.failing:
            log.warning("the operator controls could not be read (%r): the holds and pauses read last stay in force",
                        exc)
        _Reading.failing = True
        return
    if _Reading.failing:
        log.info("the operator controls are read again")
    _Reading.failing = False
    before_held, before_paused = controls.held(), controls.paused()
    if controls.update(holds, pauses):
        said(controls, before_held, before_paused)
    export(controls, effect_names, settings.kafka.topic, settings.kafka.partitions)


def said(controls: Controls, before_held: frozenset[str], before_paused: frozenset[tuple[str, int]]) -> None:
    """One log line per hold or pause that began or ended, as this worker saw it."""
    for effect in sorted(controls.held() - before_held):
        hold = controls.hold_of(effect)
        assert hold is not None
        log.warning("%s is held by %s until %s%s: %s (its records wait; nothing is dead-lettered for it)", effect,
                    hold.held_by, hold.ends_at.isoformat(), "" if hold.auto_release else " or until released",
                    hold.reason)
    for effect in sorted(before_held - controls.held()):
        log.warning("%s is no longer held: its records go on, at its provider's pace", effect)
    for topic, partition in sorted(controls.paused() - before_paused):
        log.warning("%s[%d] is paused by a person: none of its records is handed out", topic, partition)
    for topic, partition in sorted(before_paused - controls.paused()):
        log.warning("%s[%d] is resumed", topic, partition)


def export(controls: Controls, effect_names: tuple[str, ...], topic: str, partitions: int) -> None:
    for effect in effect_names:
        hold = controls.hold_of(effect)
        metrics.EFFECT_HELD.labels(effect).set(1 if hold else 0)
        metrics.EFFECT_HOLD_PLANNED_END.labels(effect).set(hold.ends_at.replace(tzinfo=UTC).timestamp() if hold else 0)
        metrics.EFFECT_HOLD_OVERDUE.labels(effect).set(hold.overdue_seconds if hold else 0)
    metrics.PARTITION_PAUSED.clear()
    for partition in range(partitions):               # every partition of the input has its series, 0 or 1
        metrics.PARTITION_PAUSED.labels(topic, str(partition)).set(0)
    for paused_topic, partition in controls.paused():
        metrics.PARTITION_PAUSED.labels(paused_topic, str(partition)).set(1)
    metrics.CONTROLS_READ.set(time.time())


def register(app: faust.App, settings: Settings, wire: Wire):
    return app.timer(interval=settings.operations.controls_refresh_seconds)(wire(read_controls))
