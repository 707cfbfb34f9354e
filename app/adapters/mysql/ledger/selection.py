"""Which of the ledger's rows a person picks: the filter of the console's queue and the CLI's
list, and the selection a bulk job is made over (``bulk_jobs``), the same fields for both."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.pipeline.states import LedgerStatus


@dataclass(frozen=True)
class QueueFilter:
    status: LedgerStatus | None = None
    reason: str | None = None
    order_no: str | None = None
    older_than_seconds: int | None = None
    fingerprint: str | None = None        # the error group
    since: datetime | None = None         # first failure at or after (UTC)
    until: datetime | None = None         # first failure before (UTC)
    before_id: int | None = None          # keyset: rows with a smaller id (the list runs newest first)
    limit: int = 50
