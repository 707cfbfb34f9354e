"""Workers that run bulk jobs in a test: the settings that make their leases run out within
seconds, and their web API called with the operator's token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

TOKEN = "bulk-token-for-tests"
# Short leases so that a killed worker's claims run out within seconds: a ledger claim lasts
# LEASE_SECONDS + INFRA_RETRY_BUDGET_SECONDS + 3 x DB_TRANSACTION_TIMEOUT_SECONDS (20 s here).
FAST = {"WEB_TOKEN": TOKEN, "LEASE_SECONDS": "8", "EFFECT_TIMEOUT_SECONDS": "1", "BATCH_SIZE": "100",
        "DB_STATEMENT_TIMEOUT_SECONDS": "3", "DB_LOCK_WAIT_TIMEOUT_SECONDS": "2", "DB_TRANSACTION_TIMEOUT_SECONDS": "3",
        "INFRA_RETRY_BUDGET_SECONDS": "3", "SMS_LOOKUP_SETTLE_SECONDS": "1", "COMPENSATION_BACKOFF_SECONDS": "1",
        "COMPENSATION_TIMER_SECONDS": "1", "BULK_LEASE_SECONDS": "4", "BULK_TIMER_SECONDS": "0.5"}


def call(worker, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """``method path`` on ``worker``'s web port as the operator: the status and the JSON answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{worker.web_port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def answering(worker) -> bool:
    """Whether ``worker``'s bulk API answers yet."""
    try:
        return call(worker, "GET", "/bulk/")[0] == 200
    except OSError:
        return False
