"""Bulk actions on the dead-letter queue: a job's pace, chunks, size limits and hold on its rows."""

from __future__ import annotations

from app.settings._base import Group, setting


class BulkSettings(Group):
    TITLE = "Bulk actions"

    rate_per_second: float = setting("BULK_RATE_PER_SECOND", 200.0, gt=0,
        description='The most dead letters a bulk job works per second (a job runs in one worker at a time): a '
                    'backlog retried in bulk leaves room for the live traffic and for a service that just came back '
                    '([Bulk actions](compensation-and-console.md#bulk-actions)).')

    chunk_size: int = setting("BULK_CHUNK_SIZE", 100, ge=1, le=500,
        description='Rows of a bulk job claimed and run through the pipeline at once (at most `BATCH_SIZE` is used).')

    max_rows: int = setting("BULK_MAX_ROWS", 50_000, ge=1,
        description='The most rows one bulk job may take; a wider filter is refused (narrow it, or run several jobs).')

    count_tolerance_percent: float = setting("BULK_COUNT_TOLERANCE_PERCENT", 1.0, ge=0, le=100,
        description='How far the rows a filter selects may move between the dry run and the start, in percent of the '
                    'count seen, rounded down (under 100 rows: not at all); beyond it the start is refused (409) with'
                    ' the count now.')

    lease_seconds: float = setting("BULK_LEASE_SECONDS", 30.0, gt=0,
        description="A worker's hold on a bulk job, renewed every third of it while a chunk runs and after every "
                    'chunk; a worker that died lets another take the job over after this.')

    timer_seconds: float = setting("BULK_TIMER_SECONDS", 2.0, gt=0,
        description='How often every worker looks for a bulk job to run when it has none.')

