"""The app's own statements, captured as it would run them: a recording store stands in for MySQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any


class _NoRows:
    def __iter__(self):
        return iter(())

    def keys(self):
        return []

    def scalar(self):
        return 0

    def one(self):
        return (0, 0)

    def first(self):
        return None

    rowcount = 0


class _RecordingTx:
    def __init__(self, sink: list) -> None:
        self.sink = sink

    async def _exec(self, sql: str, params: Sequence = ()):
        self.sink.append((sql, list(params)))
        return _NoRows()


class RecordingStore:
    """Stands in for ``MySqlStore``: runs the work against a transaction that records each
    statement (and answers with no rows), so the bench EXPLAINs exactly what the app sends."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, list]] = []

    async def in_transaction(self, work):
        return await work(_RecordingTx(self.statements))


async def statements_of(call: Callable[[Any], Awaitable[Any]]) -> list[tuple[str, list]]:
    store = RecordingStore()
    await call(store)
    return store.statements


def execute_recorder(sink: list):
    async def execute(sql: str, params: Sequence = ()):
        sink.append((sql, list(params)))
        return _NoRows()
    return execute
