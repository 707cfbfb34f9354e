"""Building statements: values written into the SQL text where that is safe, parameters otherwise."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import date, datetime
from typing import Any

# Runs one statement (one round trip) of the open transaction.
Execute = Callable[[str, Sequence[Any]], Awaitable[Any]]

# Values made of these characters are written into the SQL text as they are,
# quoted: without quotes or backslashes they cannot end the literal (and without
# ``%`` they cannot disturb the driver's parameter formatting). Keys, hashes,
# tokens, dates and most addresses qualify (order numbers are validated ASCII), so
# a 500-row statement needs no per-value escaping in Python -- that escaping was a
# quarter of a batch's CPU time. Anything else goes through the driver.
_INLINE = re.compile(r"[A-Za-z0-9:_./+\-, ]*")
_inline = _INLINE.fullmatch
_DATES: dict[date, str] = {}        # date -> its literal: a batch's rows share a few dates


def marks(n: int, group: str = "%s") -> str:
    """``n`` placeholders (or placeholder groups), comma-separated."""
    return ", ".join([group] * n)


class Sql:
    """Builds a statement: ``lit`` inlines a value when that is safe, else adds a parameter.
    Call it once per place the value appears: a parameter fills one ``%s``."""

    __slots__ = ("params",)

    def __init__(self) -> None:
        self.params: list = []

    def lit(self, value) -> str:
        # The exact types first, in the order a batch meets them; subclasses (enums, str
        # subclasses) and everything else take the general path below.
        kind = type(value)
        if kind is str:
            if _inline(value):
                return f"'{value}'"
            self.params.append(value)
            return "%s"
        if value is None:
            return "NULL"
        if kind is int:
            return str(value)
        if kind is date:
            text = _DATES.get(value)
            if text is None:
                if len(_DATES) > 4096:
                    _DATES.clear()
                text = _DATES[value] = f"'{value.isoformat()}'"
            return text
        return self._general(value)

    def _general(self, value) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            return str(int(value))
        if isinstance(value, date) and not isinstance(value, datetime):
            return f"'{value.isoformat()}'"
        if isinstance(value, str) and _inline(value):
            return f"'{value}'"
        self.params.append(value)
        return "%s"

    def inline(self, value: str) -> str | None:
        """``value`` as a literal for the text, to be written in as many places as needed; None when
        it must go as a parameter (then :meth:`lit` once per place)."""
        return f"'{value}'" if type(value) is str and _inline(value) else None

    def tuple(self, *values) -> str:
        return "(" + ", ".join([self.lit(v) for v in values]) + ")"

    def list(self, values) -> str:
        lit = self.lit
        return ", ".join([lit(v) for v in values])
