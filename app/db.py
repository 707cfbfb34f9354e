"""The database engine, configured once for every adapter."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.settings import Settings


def create_engine(settings: Settings, *, url: str | None = None) -> AsyncEngine:
    """An aiomysql engine in READ COMMITTED (locking reads lock rows, never gaps),
    with the session clock in UTC: every DATETIME column holds UTC."""
    return create_async_engine(
        url or settings.mysql_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_recycle=3600,
        isolation_level="READ COMMITTED",
        connect_args={"init_command": "SET SESSION time_zone = '+00:00', "
                                      f"innodb_lock_wait_timeout = {int(settings.db_lock_wait_timeout_seconds)}, "
                                      "lock_wait_timeout = 30"},
    )
