"""Faust commands: ``faust -A app <command>``."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from app.adapters.mysql.preflight import Target, _causes, explain
from app.adapters.mysql.tls import MySqlTls
from app.settings import Settings


@contextlib.asynccontextmanager
async def database_explained(settings: Settings) -> AsyncIterator[None]:
    """A command that cannot reach or is refused by the database ends with the sentence the
    worker's start-up check says (the setting to fix), not a driver's traceback."""
    try:
        yield
    except Exception as exc:
        if not any(_is_database_error(cause) for cause in _causes(exc)):
            raise
        why = explain(exc, MySqlTls.from_settings(settings.database), Target.of(settings.database.url))
        raise SystemExit(f"order-event-processor: cannot use the database: {why}") from None


def _is_database_error(exc: BaseException) -> bool:
    from pymysql.err import MySQLError
    from sqlalchemy.exc import DBAPIError

    from app.pipeline.errors import StoreUnavailable

    return isinstance(exc, (MySQLError, DBAPIError, StoreUnavailable, ssl.SSLError, ConnectionError))
