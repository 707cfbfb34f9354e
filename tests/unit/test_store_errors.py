"""What the MySQL store makes of a driver error: a wait for the infrastructure
(:class:`StoreUnavailable`, waited out by the outage guard) or a statement refused
for good (:class:`StoreFailure`, a dead letter). A server that refuses writes because
it is read-only (a replica, a primary demoted in a failover) is the infrastructure's,
never the record's. No database here: the driver's errors are raised by a stand-in."""

from __future__ import annotations

import pymysql
import pytest
from sqlalchemy.exc import OperationalError

from app.adapters.mysql.store import MySqlStore
from app.pipeline.errors import StoreFailure, StoreUnavailable
from app.pipeline.outage import OutageGuard

READ_ONLY = "The MariaDB server is running with the --read-only option so it cannot execute this statement"


class Connection:
    """Enough of an ``AsyncConnection`` for one try of the store."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def start(self):
        self.engine.checkouts += 1
        return self

    async def commit(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def invalidate(self) -> None:
        self.engine.invalidated += 1


class Engine:
    def __init__(self) -> None:
        self.checkouts = 0
        self.invalidated = 0

    def connect(self) -> Connection:
        return Connection(self)


def driver_error(code: int, message: str) -> OperationalError:
    return OperationalError("INSERT INTO t_idem ...", {}, pymysql.err.OperationalError(code, message))


def failing(*errors: Exception, result: str = "written"):
    """A transaction's work that raises ``errors`` on its first runs, then returns ``result``."""
    pending = list(errors)

    async def work(tx) -> str:
        if pending:
            raise pending.pop(0)
        return result
    return work


async def no_sleep(seconds: float) -> None:
    pass


def store() -> MySqlStore:
    return MySqlStore(Engine(), sleep=no_sleep)


@pytest.mark.parametrize("code, message", [
    (1290, READ_ONLY),
    (1290, "The MySQL server is running with the --super-read-only option so it cannot execute this statement"),
    (1836, "Running in read-only mode"),
    (1792, "Cannot execute statement in a READ ONLY transaction"),
], ids=["1290-read-only", "1290-super-read-only", "1836", "1792"])
async def test_a_write_refused_by_a_read_only_server_is_an_infrastructure_wait(code, message):
    with pytest.raises(StoreUnavailable) as raised:
        await store().in_transaction(failing(driver_error(code, message)))
    assert raised.value.retriable and "read-only" in str(raised.value)


@pytest.mark.parametrize("code, message", [
    (1290, "The MariaDB server is running with the --secure-file-priv option so it cannot execute this statement"),
    (1146, "Table 'idem.t_nothing' doesn't exist"),
    (1406, "Data too long for column 'owner' at row 1"),
], ids=["1290-secure-file-priv", "1146", "1406"])
async def test_a_statement_refused_for_good_is_still_a_store_failure(code, message):
    with pytest.raises(StoreFailure):
        await store().in_transaction(failing(driver_error(code, message)))


async def test_a_read_only_server_is_waited_out_until_it_takes_writes():
    """A failover: the traffic reaches the replica before it is promoted. The guard waits, the write lands."""
    guard = OutageGuard(60, sleep=no_sleep)
    s = store()
    work = failing(*(driver_error(1290, READ_ONLY) for _ in range(3)))
    assert await guard(lambda: s.in_transaction(work)) == "written"
    assert s.engine.checkouts == 4


async def test_a_dead_pooled_connection_is_tried_again_at_once_on_another():
    """After a failover every pooled connection is dead: the first statement on one fails
    (2013), and the store tries once more on a connection of its own before calling it an outage."""
    s = store()
    assert await s.in_transaction(failing(driver_error(2013, "Lost connection to MySQL server during query"))) \
        == "written"
    assert s.engine.checkouts == 2
    with pytest.raises(StoreUnavailable):
        await store().in_transaction(failing(driver_error(2006, "MySQL server has gone away"),
                                             driver_error(2013, "Lost connection to MySQL server during query")))
