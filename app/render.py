"""Showing stored values to people, the same way in the web views and the CLI."""

from __future__ import annotations

import base64
import re
from datetime import date, datetime
from decimal import Decimal
from typing import Any

ACTOR = re.compile(r"[A-Za-z0-9_.@+-]{1,64}")      # who acts: a name for the audit trail


def readable(data: bytes | None) -> dict | None:
    """Bytes for people: the text if it is UTF-8, base64 otherwise (never both guessed)."""
    if data is None:
        return None
    try:
        return {"text": data.decode("utf-8"), "bytes": len(data)}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode(), "bytes": len(data)}


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for what the database hands back."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray)):
        return readable(bytes(value))
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def with_record(row: dict) -> tuple[bytes | None, bytes | None]:
    """A ledger row for people: its record's key, value and headers as :func:`readable` under
    ``record`` (in place). Returns the raw key and value (to decode, or to mask for a viewer)."""
    key, value = row.pop("record_key"), row.pop("record_value")
    headers = row.pop("record_headers")
    row["record"] = {"key": readable(key), "value": readable(value),
                     "headers": [{"key": k, "value": readable(v)} for k, v in headers]}
    return key, value
