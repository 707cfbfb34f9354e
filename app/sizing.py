"""The capacity model of a deployment's settings (``app.pipeline.capacity``): how many rows ``t_idem``
holds, what a worker reaches, what ``budget`` and the capacity check read."""

from __future__ import annotations

from app.adapters.kafka.topics import DLQ_RETENTION_MS
from app.pipeline.capacity import Budget, Inputs, budget
from app.pipeline.plan import keys_per_event
from app.settings import Settings

# The most events one worker processes per second, near the benchmark's ceiling for Faust alone
# (row f of ``make bench``; the docs' Benchmarks page): what a worker working off a backlog may reach.
WORKER_MAX_RATE = 20_000.0


def capacity(settings: Settings, **overrides) -> Budget:
    """The capacity model of the settings (``app.pipeline.capacity``); ``overrides`` replace inputs."""
    s = settings
    values = dict(
        rate=s.operations.capacity_events_per_second, peak_rate=s.operations.capacity_peak_events_per_second,
        worker_max_rate=WORKER_MAX_RATE, partitions=s.kafka.partitions, workers=1,
        retention_days=s.operations.idem_retention_days, commit_interval=s.kafka.commit_interval_seconds,
        commit_every=s.kafka.commit_every, max_poll_records=s.kafka.max_poll_records,
        batch_size=s.batches.size, batch_within=s.batches.within_seconds, keys_per_event=keys_per_event(),
        row_bytes=s.operations.capacity_row_bytes, offsets_retention_days=s.operations.kafka_offsets_retention_days,
        outage_sla_days=s.operations.capacity_outage_sla_days, dead_letter_days=DLQ_RETENTION_MS / 86_400_000)
    values.update({name: value for name, value in overrides.items() if value is not None})
    return budget(Inputs(**values))


def budget_rows(settings: Settings) -> int:
    """What the watermark divides by: IDEM_CAPACITY_BUDGET_ROWS, or the model's rows."""
    return settings.operations.idem_capacity_budget_rows or capacity(settings).rows
