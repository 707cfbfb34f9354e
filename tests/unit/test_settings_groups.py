"""The settings by concern: every environment variable keeps its name and reaches its field, flat
names given in code land in their group or are refused, problems are said with the variable's
name, and the configuration reference is the one the fields' descriptions render."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from app.settings import GROUPS, Settings, SettingsError, _Environment, env_names, explain, get_settings, reference

# Every variable the flat Settings of before the groups read; none may be renamed or lost.
VARIABLES = sorted(
    ['ALERT_WEBHOOK_TIMEOUT_SECONDS', 'ALERT_WEBHOOK_URL', 'APP_ID', 'BATCHES_IN_FLIGHT', 'BATCH_DEADLINE_SECONDS',
    'BATCH_SIZE', 'BATCH_WITHIN_SECONDS', 'BREAKER_HOLD_RECORDS', 'BROKER_COMMIT_EVERY', 'BROKER_COMMIT_INTERVAL_SECONDS',
    'BROKER_HEARTBEAT_INTERVAL_SECONDS', 'BROKER_MAX_POLL_RECORDS', 'BROKER_REBALANCE_TIMEOUT_SECONDS',
    'BROKER_SESSION_TIMEOUT_SECONDS', 'BULK_CHUNK_SIZE', 'BULK_COUNT_TOLERANCE_PERCENT', 'BULK_LEASE_SECONDS',
    'BULK_MAX_ROWS', 'BULK_RATE_PER_SECOND', 'BULK_TIMER_SECONDS', 'CAPACITY_EVENTS_PER_SECOND',
    'CAPACITY_OUTAGE_SLA_DAYS', 'CAPACITY_PEAK_EVENTS_PER_SECOND', 'CAPACITY_ROW_BYTES', 'CHAOS_KILL_AT',
    'COMPENSATION_BACKOFF_MAX_SECONDS', 'COMPENSATION_BACKOFF_SECONDS', 'COMPENSATION_DRAIN_BATCH_SIZE',
    'COMPENSATION_MAX_ATTEMPTS', 'COMPENSATION_SLA_SECONDS', 'COMPENSATION_SWEEP_LIMIT', 'COMPENSATION_TIMER_SECONDS',
    'COMPENSATOR_BATCH_SIZE', 'COMPENSATOR_ENABLED', 'COMPENSATOR_WITHIN_SECONDS', 'CONTROLS_REFRESH_SECONDS', 'DATA_DIR',
    'DB_CONNECT_TIMEOUT_SECONDS', 'DB_KEEPALIVE_SECONDS', 'DB_LOCK_RETRIES', 'DB_LOCK_WAIT_TIMEOUT_SECONDS',
    'DB_POOL_SIZE', 'DB_POOL_TIMEOUT_SECONDS', 'DB_SERVER_CHECK', 'DB_SQL_MODE', 'DB_STATEMENT_TIMEOUT_SECONDS',
    'DB_TRANSACTION_TIMEOUT_SECONDS', 'DLQ_PARTITIONS', 'DLQ_RETRY_AFTER_SECONDS', 'DLQ_SEND_TIMEOUT_SECONDS',
    'DLQ_TOPIC', 'DLQ_TRUNCATE_BYTES', 'EFFECT_CONCURRENCY', 'EFFECT_CONNECT_TIMEOUT_SECONDS',
    'EFFECT_TIMEOUT_SECONDS', 'EVENT_DATA_FROM', 'EVENT_ENVELOPE', 'EVENT_ID_FROM', 'EVENT_LOOP', 'EVENT_ORDER_NO_FROM',
    'EVENT_SCHEMA_VERSIONS', 'EVENT_TIME_FROM', 'EVENT_TYPES', 'EVENT_TYPE_FROM', 'EVENT_VERSION_FROM', 'FETCH_BATCHES', 'IDEM_CAPACITY_BUDGET_ROWS', 'IDEM_MAX_ATTEMPTS',
    'IDEM_RETENTION_DAYS', 'IDEM_TOKEN_SECRET', 'INFRA_RETRY_BUDGET_SECONDS', 'KAFKA_BROKER', 'KAFKA_ISOLATION_LEVEL',
    'KAFKA_MAX_PARTITION_FETCH_BYTES', 'KAFKA_OFFSETS_RETENTION_DAYS', 'KAFKA_REQUIRE_REPLICATION', 'KAFKA_REVOKE_GRACE_SECONDS',
    'KAFKA_SASL_MECHANISM', 'KAFKA_SASL_PASSWORD', 'KAFKA_SASL_USERNAME', 'KAFKA_SECURITY_PROTOCOL',
    'KAFKA_SSL_CAFILE', 'KAFKA_SSL_CERTFILE', 'KAFKA_SSL_CHECK_HOSTNAME', 'KAFKA_SSL_KEYFILE',
    'KAFKA_STARTUP_WAIT_SECONDS', 'LEASE_MARGIN_SECONDS', 'LEASE_SECONDS', 'LOGISTICS_URL', 'LOG_LEVEL',
    'MAX_BATCH_BYTES', 'MAX_EVENT_BYTES', 'METRICS_REFRESH_SECONDS', 'MIGRATION_LOCK_TRIES',
    'MIGRATION_LOCK_WAIT_SECONDS', 'MYSQL_SSL_CA', 'MYSQL_SSL_CERT',
    'MYSQL_SSL_KEY', 'MYSQL_SSL_MODE', 'MYSQL_SSL_VERIFY_IDENTITY', 'MYSQL_URL', 'ORDER_EVENT_PARTITIONS',
    'ORDER_EVENT_TOPIC', 'PARTITIONS_AHEAD', 'PARTITION_LOCK_WAIT_SECONDS', 'PARTITION_TIMER_SECONDS',
    'RECONCILE_CHUNK', 'RECONCILE_EVERY_SECONDS', 'RECONCILE_KEEP_DAYS', 'RECONCILE_KEEP_FINDINGS', 'RECONCILE_LAG_SECONDS',
    'RECONCILE_PROVIDER_MARGIN_SECONDS', 'RECONCILE_PROVIDER_MAX_ROWS', 'RECONCILE_PROVIDER_SLICE_SECONDS', 'RECONCILE_WINDOW_SECONDS',
    'RECOVERY_AUTO_HOURS', 'RETRY_BACKOFF_MS', 'SETTLE_AFTER_MS', 'SETTLE_GROUP', 'SLOW_BATCH_SECONDS', 'SMS_LOOKUP', 'SMS_LOOKUP_SETTLE_SECONDS',
    'SMS_URL', 'STOP_TIMEOUT_SECONDS', 'STORE_WATERMARK_SECONDS', 'STORE_WATERMARK_TOPIC', 'STUCK_PENDING_SECONDS',
    'STUCK_SWEEP_LIMIT', 'STUCK_SWEEP_SECONDS', 'TOPIC_REPLICATION', 'UNHANDLED_EVENT_TYPES', 'WATCHDOG_ENABLED', 'WATCHDOG_INTERVAL_SECONDS',
    'WATCHDOG_REJOIN_GRACE_SECONDS', 'WATCHDOG_STALL_SECONDS', 'WEB_ALLOWED_HOSTS', 'WEB_BIND', 'WEB_MAX_BODY_BYTES',
    'WEB_PORT', 'WEB_PUBLIC_URL', 'WEB_READ_TOKEN', 'WEB_TOKEN', 'WEB_TOKENS_FILE', 'WORKER_DEAD_AFTER_SECONDS',
    'WORKER_HEARTBEAT_SECONDS', 'WORKER_ID',
    'OTEL_SDK_DISABLED', 'OTEL_TRACES_EXPORTER', 'OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT',
    'OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_TRACES_SAMPLER', 'OTEL_TRACES_SAMPLER_ARG', 'OTEL_SERVICE_NAME',
    'FOREIGN_EVENT_TYPES', 'NEW_SKIPPED_TYPE_SECONDS'])


def test_every_variable_keeps_its_name():
    assert sorted(env_names().values()) == VARIABLES
    assert len(set(env_names().values())) == len(env_names())


def test_every_variable_reaches_its_field(monkeypatch):
    for env in VARIABLES:
        monkeypatch.setenv(env.lower() if env.startswith("B") else env, f"value of {env}")   # any case
    found = _Environment(Settings)()
    for (group, name), env in env_names().items():
        assert (found[name] if group is None else found[group][name]) == f"value of {env}", env


def test_the_environment_is_parsed_as_the_fields_say(monkeypatch):
    monkeypatch.setenv("batch_size", "7")
    monkeypatch.setenv("SMS_LOOKUP", "false")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "orders")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cr3t")
    monkeypatch.setenv("WEB_PORT", "7070")
    monkeypatch.setenv("APP_ID", "orders-a")
    s = Settings()
    assert (s.batches.size, s.effects.sms_lookup, s.web.port, s.app_id) == (7, False, 7070, "orders-a")
    assert s.kafka.security_protocol == "SASL_SSL" and isinstance(s.kafka.sasl_password, SecretStr)
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(s.model_dump())


def test_a_bad_value_in_a_group_is_said_with_its_variable(monkeypatch):
    monkeypatch.setenv("BATCH_SIZE", "many")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cr3t")
    get_settings.cache_clear()
    try:
        with pytest.raises(SettingsError) as raised:
            get_settings()
    finally:
        get_settings.cache_clear()
    assert str(raised.value).startswith("the settings cannot work: BATCH_SIZE: Input should be a valid integer")
    assert "many" not in str(raised.value) and "batches" not in str(raised.value)
    with pytest.raises(ValidationError) as info:
        Settings(worker_heartbeat_seconds=10)           # a group's own rule: its message names the variables
    assert explain(info.value).startswith("WORKER_DEAD_AFTER_SECONDS=15 leaves no room for a call")


def test_flat_names_land_in_their_group_or_are_refused():
    s = Settings(order_event_partitions=2, mysql_url="mysql+aiomysql://u:p@db/idem")
    assert (s.kafka.partitions, s.database.url) == (2, "mysql+aiomysql://u:p@db/idem")
    copy = s.model_copy(update={"order_event_partitions": 3, "db_sql_mode": "ANSI", "app_id": "x"})
    assert (copy.kafka.partitions, copy.database.sql_mode, copy.app_id) == (3, "ANSI", "x")
    assert (s.kafka.partitions, s.database.sql_mode, s.app_id) == (2, None, "order-event-processor")
    copy.batches.size = 9                               # a copy's groups are its own
    assert s.batches.size == 500
    with pytest.raises(ValidationError, match="no_such_setting"):
        Settings(no_such_setting=1)
    for update in ({"no_such_setting": 1}, {"partitions": 2}):
        with pytest.raises(ValueError):
            s.model_copy(update=update)
    with pytest.raises(ValueError):
        s.kafka.model_copy(update={"order_event_partitions": 2})
    with pytest.raises(ValueError):
        s.order_event_partitions = 2


def test_every_group_is_a_field_of_the_root():
    assert set(GROUPS) == {"kafka", "database", "effects", "events", "batches", "compensation", "bulk", "operations", "reconcile", "web",
                           "tracing"}


def test_every_setting_has_a_description():
    assert reference.missing_descriptions() == [], "describe these settings (Field description=...)"


def test_the_configuration_page_is_what_the_fields_render():
    assert reference.PAGE.is_file(), f"docs/configuration.md is missing: run `{reference.COMMAND}`"
    assert reference.PAGE.read_text() == reference.render(), \
        f"docs/configuration.md is not what the settings say: run `{reference.COMMAND}`"


def test_the_reference_command_prints_the_page_and_writes_it_only_when_asked(capsys, monkeypatch, tmp_path):
    page = tmp_path / "configuration.md"
    monkeypatch.setattr(reference, "PAGE", page)
    assert reference.main([]) == 0
    assert capsys.readouterr().out == reference.render()
    assert not page.exists()
    assert reference.main(["--write"]) == 0
    assert page.read_text() == reference.render()
    assert reference.main(["--other"]) == 2


def test_each_effect_has_nested_settings_with_todays_names_as_aliases(monkeypatch):
    monkeypatch.setenv("LOGISTICS_URL", "http://old-name:1")
    monkeypatch.setenv("SMS_LOOKUP", "false")
    monkeypatch.setenv("effects__sms__url", "http://gateway:2")            # any case
    monkeypatch.setenv("EFFECTS__WAYBILL__PROVIDER", "express")
    monkeypatch.setenv("EFFECTS__WAYBILL__TIMEOUT_SECONDS", "9")          # no more than EFFECT_TIMEOUT_SECONDS
    monkeypatch.setenv("EFFECTS__WAYBILL__SECRET", " s3cr3t ")
    s = Settings()
    waybill, sms = s.effects.effect("waybill"), s.effects.effect("sms")
    assert (waybill.url, waybill.provider, waybill.timeout_seconds) == ("http://old-name:1", "express", 3.0)
    assert waybill.secret is not None and waybill.secret.get_secret_value() == "s3cr3t"
    assert (sms.url, sms.lookup) == ("http://gateway:2", False)
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(s.model_dump())
    monkeypatch.setenv("EFFECTS__WAYBILL__URL", "http://new-name:3")       # the nested name wins over its alias
    assert Settings().effects.effect("waybill").url == "http://new-name:3"
    assert s.effects.lookups() == []


def test_a_bad_nested_setting_is_named_and_its_value_never_shown(monkeypatch):
    monkeypatch.setenv("EFFECTS__WAYBILL__TIMEOUT_SECONDS", "-1")
    monkeypatch.setenv("EFFECTS__WAYBILL__COLOUR", "blue")
    with pytest.raises(ValidationError) as caught:
        Settings()
    said = explain(caught.value)
    assert "EFFECTS__WAYBILL__TIMEOUT_SECONDS" in said and "EFFECTS__WAYBILL__COLOUR" in said
    assert "blue" not in said


def test_a_lookup_of_any_effect_counts_in_the_lease_check():
    with pytest.raises(ValidationError, match="the lookup of parcel is on"):
        Settings(sms_lookup=False, effects__parcel__lookup=True, lease_seconds=30, effect_timeout_seconds=3,
                 batch_size=500, effect_concurrency=128)
    Settings(sms_lookup=False, lease_seconds=30, effect_timeout_seconds=3, batch_size=500, effect_concurrency=128)
