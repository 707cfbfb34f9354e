"""A migration run that waited for a metadata lock in vain is tried again, a bounded number of times."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from app.adapters.mysql.migration_locks import LockNotGranted, LockWaits


def failure(code: int) -> OperationalError:
    return OperationalError("ALTER TABLE t_idem ...", {}, Exception(code, "Lock wait timeout exceeded"))


class Runs:
    """A migration run that fails with ``codes`` in turn, then succeeds."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.codes:
            raise failure(self.codes.pop(0))


def test_a_run_that_waited_in_vain_is_tried_again_after_a_pause_twice_the_wait():
    runs, pauses = Runs(1205, 1205), []
    LockWaits(wait_seconds=2, tries=3).run(runs, sleep=pauses.append)
    assert runs.calls == 3
    assert pauses == [4.0, 4.0]


def test_after_the_last_try_it_stops_naming_the_settings_and_what_held_the_table():
    runs, pauses = Runs(1205, 1205, 1205), []
    with pytest.raises(LockNotGranted) as raised:
        LockWaits(wait_seconds=1, tries=2).run(runs, holders=lambda: "Transactions open longest: connection 7.",
                                                sleep=pauses.append)
    assert runs.calls == 2 and pauses == [2.0]
    assert "2 tries of 1s" in str(raised.value) and "MIGRATION_LOCK_WAIT_SECONDS" in str(raised.value)
    assert "connection 7" in str(raised.value)


def test_any_other_failure_is_not_tried_again():
    runs = Runs(1846)           # ALGORITHM=INSTANT is not supported: a migration that cannot run online
    with pytest.raises(OperationalError):
        LockWaits(wait_seconds=2, tries=5).run(runs, sleep=lambda s: None)
    assert runs.calls == 1


def test_the_session_waits_as_configured_or_as_the_server_says_when_zero():
    assert LockWaits(wait_seconds=3, tries=1).session_assignment() == "lock_wait_timeout = 3"
    assert LockWaits(wait_seconds=0, tries=1).session_assignment() is None
