"""Settings that cannot work are refused at start-up, with a message that says what to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import Settings


def refused(**overrides) -> str:
    with pytest.raises(ValidationError) as info:
        Settings(**overrides)
    return str(info.value)


def test_defaults_are_consistent():
    s = Settings()
    assert s.lease_seconds >= 8 * s.effect_timeout_seconds + s.lease_margin_seconds
    assert s.batch_deadline_seconds < s.broker_session_timeout_seconds


@pytest.mark.parametrize("overrides, needed", [({"effect_concurrency": 16}, 98), ({"batch_size": 1000}, 50),
                                               ({"effect_timeout_seconds": 4}, 34)])
def test_a_lease_that_cannot_cover_a_batch_of_calls_is_refused(overrides, needed):
    message = refused(**overrides)
    assert "LEASE_SECONDS=30 cannot cover a batch" in message and f"at least {needed}" in message


def test_a_lease_that_covers_the_batch_is_accepted():
    assert Settings(effect_concurrency=16, lease_seconds=98).lease_seconds == 98
    assert Settings(batch_size=100, effect_concurrency=64, lease_seconds=3, effect_timeout_seconds=1,
                    lease_margin_seconds=0.5).lease_seconds == 3


def test_a_deadline_the_rebalance_cannot_wait_for_is_refused():
    assert "BROKER_REBALANCE_TIMEOUT_SECONDS=60" in refused(batch_deadline_seconds=28)
    assert "BROKER_SESSION_TIMEOUT_SECONDS=30" in refused(batch_deadline_seconds=30, dlq_send_timeout_seconds=5)


def test_a_statement_timeout_shorter_than_the_lock_wait_is_refused():
    assert "must exceed DB_LOCK_WAIT_TIMEOUT_SECONDS" in refused(db_statement_timeout_seconds=10)
    assert "DB_TRANSACTION_TIMEOUT_SECONDS=12 must be at least" in refused(db_transaction_timeout_seconds=12)


@pytest.mark.parametrize("charset", ["latin1", "utf8", "utf8mb3"])
def test_a_mysql_url_with_another_charset_is_refused(charset):
    message = refused(mysql_url=f"mysql+aiomysql://u:p@db:3306/idem?charset={charset}")
    assert f"charset={charset}" in message and "utf8mb4" in message


def test_a_mysql_url_with_utf8mb4_is_accepted():
    assert Settings(mysql_url="mysql+aiomysql://u:p@db/idem?charset=utf8mb4").mysql_url.endswith("utf8mb4")


def test_a_partition_change_holds_the_pipeline_up_at_least_two_seconds_since_mariadb_waits_twice():
    assert "greater than or equal to 2" in refused(partition_lock_wait_seconds=1)
    assert Settings(partition_lock_wait_seconds=2).partition_lock_wait_seconds == 2


def test_alert_links_point_at_the_public_url_when_there_is_one():
    assert Settings().public_url == "http://127.0.0.1:6066"
    assert Settings(web_public_url="https://desk.example/").public_url == "https://desk.example"
