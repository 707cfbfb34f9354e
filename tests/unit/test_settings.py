"""Settings that cannot work are refused at start-up, with a message that says what to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import DatabaseSettings, Settings, explain


def refused(**overrides) -> str:
    """The sentence a process started with these settings prints (``app.settings.explain``)."""
    with pytest.raises(ValidationError) as info:
        Settings(**overrides)
    return explain(info.value)


def test_defaults_are_consistent():
    s = Settings()
    # Two batches in flight, 500 calls each, 128 at a time, each a lookup and a send of up to 3 s, plus the margin
    assert s.effects.lease_seconds >= 8 * 2 * s.effects.timeout_seconds + s.effects.lease_margin_seconds
    assert s.batches.in_flight * s.batches.size <= 8 * s.effects.concurrency
    assert s.batches.deadline_seconds < s.kafka.session_timeout_seconds
    assert s.longest_batch_seconds() < s.kafka.rebalance_timeout_seconds


@pytest.mark.parametrize("overrides, needed", [({"effect_concurrency": 64}, 98), ({"batch_size": 1000}, 98),
                                               ({"effect_timeout_seconds": 4}, 66), ({"batches_in_flight": 3}, 74)])
def test_a_lease_that_cannot_cover_the_batches_in_flight_is_refused(overrides, needed):
    message = refused(**overrides)
    assert "LEASE_SECONDS=60 cannot cover the calls in flight" in message and f"at least {needed}" in message
    assert "a lookup, then the send" in message and "batches of BATCH_SIZE" in message


def test_every_batch_in_flight_shares_the_calls_limit():
    """Two batches in flight share one limiter: the later batch's last call may wait for every call
    of the other. One batch at a time (BATCHES_IN_FLIGHT=1, or Faust's stream) needs half the lease."""
    assert "BATCHES_IN_FLIGHT=2" in refused(effect_concurrency=64)
    assert Settings(effect_concurrency=64, batches_in_flight=1).effects.lease_seconds == 60
    assert Settings(effect_concurrency=64, fetch_batches=False).effects.lease_seconds == 60


def test_the_compensators_calls_in_flight_must_fit_in_a_lease_too():
    """A drain round, a batch of the dead-letter agent and a bulk chunk share the compensator's limiter."""
    message = refused(effect_concurrency=64, batches_in_flight=1, compensation_drain_batch_size=500,
                      bulk_chunk_size=500)
    assert "the compensator's drain round" in message and "at least 98" in message


def test_without_the_lookup_a_call_counts_once():
    message = refused(effect_concurrency=32, sms_lookup=False)
    assert "at least 98" in message and "a lookup, then the send" not in message
    assert Settings(effect_concurrency=32, sms_lookup=False, lease_seconds=98).effects.lease_seconds == 98


def test_a_lease_that_covers_the_batches_is_accepted():
    assert Settings(effect_concurrency=32, lease_seconds=194,
                    broker_rebalance_timeout_seconds=400).effects.lease_seconds == 194
    assert Settings(batch_size=100, effect_concurrency=210, lease_seconds=3, effect_timeout_seconds=1,
                    lease_margin_seconds=0.5).effects.lease_seconds == 3


def test_a_batch_the_rebalance_cannot_wait_for_is_refused():
    """Every wait of a batch counts: phase 1's calls (the lease), phase 2 to its deadline and the
    calls still in flight, the dead letters' send, and the database waited out."""
    message = refused(broker_rebalance_timeout_seconds=200)
    assert "a batch may take up to 210 s" in message and "BROKER_REBALANCE_TIMEOUT_SECONDS=200" in message
    assert "INFRA_RETRY_BUDGET_SECONDS=60" in message
    assert Settings(broker_rebalance_timeout_seconds=200, infra_retry_budget_seconds=45).effects.lease_seconds == 60
    assert "a batch may take up to 340 s" in refused(lease_seconds=190)
    assert "BROKER_SESSION_TIMEOUT_SECONDS=30" in refused(batch_deadline_seconds=30)


def test_a_revoke_grace_the_rebalance_cannot_wait_for_is_refused():
    assert "KAFKA_REVOKE_GRACE_SECONDS=300 must stay under BROKER_REBALANCE_TIMEOUT_SECONDS=300" in \
        refused(kafka_revoke_grace_seconds=300)
    assert Settings(kafka_revoke_grace_seconds=0.5).kafka.revoke_grace_seconds == 0.5


def test_a_statement_timeout_shorter_than_the_lock_wait_is_refused():
    assert "must exceed DB_LOCK_WAIT_TIMEOUT_SECONDS" in refused(db_statement_timeout_seconds=10)
    assert "DB_TRANSACTION_TIMEOUT_SECONDS=12 must be at least" in refused(db_transaction_timeout_seconds=12)


@pytest.mark.parametrize("charset", ["latin1", "utf8", "utf8mb3"])
def test_a_mysql_url_with_another_charset_is_refused(charset):
    message = refused(mysql_url=f"mysql+aiomysql://u:p@db:3306/idem?charset={charset}")
    assert f"charset={charset}" in message and "utf8mb4" in message


def test_a_mysql_url_with_utf8mb4_is_accepted():
    assert Settings(mysql_url="mysql+aiomysql://u:p@db/idem?charset=utf8mb4").database.url.endswith("utf8mb4")


def test_a_partition_change_holds_the_pipeline_up_at_least_two_seconds_since_mariadb_waits_twice():
    assert "greater than or equal to 2" in refused(partition_lock_wait_seconds=1)
    assert Settings(partition_lock_wait_seconds=2).operations.partition_lock_wait_seconds == 2


def test_alert_links_point_at_the_public_url_when_there_is_one():
    assert Settings().web.base_url == "http://127.0.0.1:6066"
    assert Settings(web_public_url="https://desk.example/").web.base_url == "https://desk.example"


def test_tokens_with_surrounding_spaces_match_what_a_client_sends():
    """A request's token is compared stripped; a configured one with a trailing newline or spaces
    (a copy and paste, a YAML value) never matched."""
    s = Settings(web_token="  s3cret \n", web_read_token="\treader ")
    assert s.web.token.get_secret_value() == "s3cret" and s.web.read_token.get_secret_value() == "reader"
    assert Settings(web_token="   ").web.token is None


def test_the_web_views_answer_to_our_host_names_only():
    s = Settings(web_bind="0.0.0.0", web_public_url="https://desk.example.com:8443/", web_allowed_hosts="worker,[fe80::1]")
    assert s.web.host_names == {"127.0.0.1", "localhost", "::1", "desk.example.com", "worker", "fe80::1"}
    assert "10.0.0.5" in Settings(web_bind="10.0.0.5").web.host_names


def test_db_sql_mode_is_a_list_of_modes_or_nothing():
    assert Settings(db_sql_mode="ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES").database.sql_mode == \
        "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES"
    assert DatabaseSettings.model_fields["sql_mode"].default is None and Settings(db_sql_mode="").database.sql_mode == ""
    for bad in ("STRICT_TRANS_TABLES'; DROP TABLE t_idem; --", "STRICT_TRANS_TABLES, NO_ZERO_DATE", ","):
        assert refused(db_sql_mode=bad).startswith("DB_SQL_MODE: ")
