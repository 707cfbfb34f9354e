"""How every Kafka client connects: the options built from the settings, and the secrets kept out
of everything a person or a log can read."""

from __future__ import annotations

import pytest

from app.adapters.kafka.connection import KafkaConfigError, KafkaConnection, connection_of
from app.settings import Settings, SettingsError, explain

PASSWORD = "s3cr3t-Pa55word"


def secure(**overrides) -> Settings:
    values = dict(kafka_broker="kafka://10.0.0.1:9093;kafka://10.0.0.2:9093", kafka_security_protocol="SASL_SSL",
                  kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="orders",
                  kafka_sasl_password=PASSWORD)
    values.update(overrides)
    return Settings(**values)


def test_plaintext_is_the_default_and_needs_nothing(monkeypatch):
    monkeypatch.delenv("KAFKA_BROKER", raising=False)      # the default, whatever the shell points at
    options = KafkaConnection.from_settings(Settings().kafka).client_options()
    assert options == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    assert KafkaConnection.from_settings(Settings().kafka).faust_credentials() is None


def test_sasl_ssl_gives_every_client_the_mechanism_the_user_the_password_and_a_tls_context():
    options = KafkaConnection.from_settings(secure().kafka).client_options()
    assert options["bootstrap_servers"] == "10.0.0.1:9093,10.0.0.2:9093"
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("orders", PASSWORD)
    assert options["ssl_context"].check_hostname is True


def test_faust_gets_the_same_credentials():
    credentials = KafkaConnection.from_settings(secure().kafka).faust_credentials()
    assert (credentials.username, credentials.password, credentials.mechanism.value) == ("orders", PASSWORD,
                                                                                          "SCRAM-SHA-512")
    assert credentials.protocol.value == "SASL_SSL"
    assert PASSWORD not in repr(credentials)


def test_the_password_is_in_no_repr_and_no_description():
    conn = KafkaConnection.from_settings(secure().kafka)
    for text in (repr(conn), str(conn), conn.describe(), repr(secure())):
        assert PASSWORD not in text
    assert "SCRAM-SHA-512 as 'orders'" in conn.describe()


@pytest.mark.parametrize("overrides, says", [
    ({"kafka_sasl_username": None}, "needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"),
    ({"kafka_sasl_password": ""}, "needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"),
    ({"kafka_ssl_certfile": __file__}, "KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE go together"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_ssl_cafile": __file__}, "does not use TLS"),
])
def test_contradictory_settings_are_refused_by_name_without_their_values(monkeypatch, overrides, says):
    env = {"KAFKA_BROKER": "kafka://10.0.0.1:9093", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "KAFKA_SASL_USERNAME": "orders", "KAFKA_SASL_PASSWORD": PASSWORD}
    for name, value in overrides.items():
        env.pop(name.upper(), None)
        if value is not None:
            env[name.upper()] = value
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from app.settings import get_settings

    get_settings.cache_clear()
    try:
        with pytest.raises(SettingsError) as raised:
            get_settings()
    finally:
        get_settings.cache_clear()
    assert says in str(raised.value)
    assert PASSWORD not in str(raised.value)


def test_a_bad_value_is_explained_without_echoing_any_value():
    with pytest.raises(Exception) as raised:
        Settings(kafka_security_protocol="SASL_TLS", kafka_sasl_password=PASSWORD)
    text = explain(raised.value)
    assert "KAFKA_SECURITY_PROTOCOL" in text and PASSWORD not in text and "SASL_TLS" not in text


def test_missing_certificate_files_are_named():
    with pytest.raises(KafkaConfigError, match="KAFKA_SSL_CAFILE=/nonexistent/ca.pem: no such file"):
        KafkaConnection(bootstrap="b:9093", security_protocol="SSL", ssl_cafile="/nonexistent/ca.pem")


def test_a_file_that_is_no_certificate_is_refused_by_name(tmp_path):
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(KafkaConfigError, match="could not be loaded"):
        KafkaConnection(bootstrap="b:9093", security_protocol="SSL", ssl_cafile=str(bogus)).client_options()


def test_a_bare_broker_list_is_a_plaintext_connection():
    assert connection_of("127.0.0.1:9092").security_protocol == "PLAINTEXT"
    assert Settings(kafka_broker="kafka://a:1;kafka://b:2,kafka://c:3").kafka.faust_broker == \
        "kafka://a:1;kafka://b:2;kafka://c:3"
