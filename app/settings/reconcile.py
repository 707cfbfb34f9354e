"""Reconciliation: how often the timer proves a trailing window of the input reached its ends, and
how much one run reads and keeps."""

from __future__ import annotations

from app.settings._base import Group, setting


class ReconcileSettings(Group):
    TITLE = "Reconciliation"

    every_seconds: float = setting("RECONCILE_EVERY_SECONDS", 600.0, ge=0,
        description='How often one worker (the holder of the lease `reconcile:<APP_ID>`) reconciles the trailing '
                    'window of `order-event`; 0 turns the timer off (`faust -A app reconcile` still runs) '
                    '([Reconciliation](compensation-and-console.md#reconciliation)).')

    window_seconds: float = setting("RECONCILE_WINDOW_SECONDS", 3600.0, gt=0,
        description='How much of the input one timed run reconciles: the records whose timestamps fall in the '
                    'window that ended `RECONCILE_LAG_SECONDS` ago.')

    lag_seconds: float = setting("RECONCILE_LAG_SECONDS", 600.0, ge=0,
        description="How far behind now the timer's window ends: records younger than this may still be in "
                    'their batch or their retries; a step pending for longer than `STUCK_PENDING_SECONDS` is a '
                    'finding either way.')

    chunk: int = setting("RECONCILE_CHUNK", 2000, ge=1, le=20_000,
        description='Records read and judged at once: each chunk costs three indexed reads of the database '
                    '(`t_idem`, the ledger, the waybill receipts).')

    keep_days: float = setting("RECONCILE_KEEP_DAYS", 30.0, gt=0,
        description="How long `t_reconcile_run` keeps a run (the timer deletes older ones after each of its runs).")

    keep_findings: int = setting("RECONCILE_KEEP_FINDINGS", 1000, ge=1, le=100_000,
        description="Findings a run's report keeps with their evidence (all are counted).")

    provider_margin_seconds: float = setting("RECONCILE_PROVIDER_MARGIN_SECONDS", 300.0, ge=0,
        description="How far either side of the range a provider's records are read, against our receipts of the "
                    "range: a receipt is written after the provider's record of its call, on another clock "
                    '([Provider reconciliation](compensation-and-console.md#provider-reconciliation)).')

    provider_slice_seconds: float = setting("RECONCILE_PROVIDER_SLICE_SECONDS", 300.0, gt=0,
        description="A provider's side is compared a slice of the range at a time, each read (with its margins) "
                    "up to `RECONCILE_PROVIDER_MAX_ROWS`: at the seeds' 9 million waybills a day, a slice of 300 s "
                    "and its two margins of 300 s read about 94,000.")

    provider_max_rows: int = setting("RECONCILE_PROVIDER_MAX_ROWS", 100_000, ge=1, le=10_000_000,
        description="The most of a provider's records, and of our receipts, one slice reads per effect (a page of "
                    "500 at a time); beyond, the effect is reported incomplete, without its missing receipts.")
