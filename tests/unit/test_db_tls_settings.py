"""TLS to the database: MYSQL_SSL_* settings that cannot work are refused with the settings' names
(never their values), the context every driver gets says what the settings say, and a refused
connection is explained in one sentence that names the setting to fix."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pymysql
import pytest
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from app.adapters.mysql.engine import ssl_context
from app.adapters.mysql.preflight import Target, explain, tls_failure
from app.adapters.mysql.tls import MySqlTls
from app.settings import Settings
from app.settings import explain as explain_settings

WHERE = Target("db.internal", 3306, "app")


@pytest.fixture(scope="module")
def pems(tmp_path_factory) -> Path:
    """A CA and a client certificate it signed (EC keys: milliseconds), a key that matches neither,
    an encrypted key and a file that is no PEM."""
    folder = tmp_path_factory.mktemp("db-tls-pems")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=unit CA", "-days", "1")
    openssl("req", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=app")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", "7",
            "-days", "1", "-out", "client.pem")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "other.key")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-aes256", "-pass",
            "pass:secret", "-out", "encrypted.key")
    (folder / "not-pem.txt").write_text("not a certificate\n")
    return folder


def refused(**overrides) -> str:
    """The sentence a process started with these settings prints (``app.settings.explain``)."""
    with pytest.raises(ValidationError) as info:
        Settings(**overrides)
    return explain_settings(info.value)


# -- settings refused ------------------------------------------------------------------------------

@pytest.mark.parametrize("given", ["cert", "key"])
def test_a_client_certificate_without_its_key_or_a_key_without_its_certificate_is_refused(pems, given):
    path = str(pems / ("client.pem" if given == "cert" else "client.key"))
    message = refused(**{f"mysql_ssl_{given}": path})
    assert "MYSQL_SSL_CERT and MYSQL_SSL_KEY go together" in message and "set both or neither" in message
    assert path not in message and str(pems) not in message


def test_a_file_that_does_not_exist_is_refused_by_name_not_by_path(tmp_path):
    missing = str(tmp_path / "nowhere" / "ca.pem")
    message = refused(mysql_ssl_ca=missing)
    assert "MYSQL_SSL_CA names no readable file" in message and missing not in message


def test_files_that_do_not_load_are_refused_with_the_settings(pems):
    assert "MYSQL_SSL_CA could not be loaded" in refused(mysql_ssl_ca=str(pems / "not-pem.txt"))
    mismatch = refused(mysql_ssl_cert=str(pems / "client.pem"), mysql_ssl_key=str(pems / "other.key"))
    assert "MYSQL_SSL_CERT and MYSQL_SSL_KEY could not be loaded (KEY_VALUES_MISMATCH)" in mismatch
    encrypted = refused(mysql_ssl_cert=str(pems / "client.pem"), mysql_ssl_key=str(pems / "encrypted.key"))
    assert "MYSQL_SSL_KEY is an encrypted private key" in encrypted


def test_modes_that_contradict_the_certificates_are_refused(pems):
    ca = str(pems / "ca.pem")
    assert "MYSQL_SSL_MODE=disabled, but MYSQL_SSL_CA" in refused(mysql_ssl_mode="disabled", mysql_ssl_ca=ca)
    assert "MYSQL_SSL_CA would be ignored" in refused(mysql_ssl_mode="required", mysql_ssl_ca=ca)
    message = refused(mysql_ssl_mode="sometimes")
    assert message.startswith("MYSQL_SSL_MODE:") and "sometimes" not in message


def test_the_environment_is_read_like_every_other_setting(pems, monkeypatch):
    monkeypatch.setenv("MYSQL_SSL_CERT", str(pems / "client.pem"))
    with pytest.raises(ValidationError) as info:
        Settings()
    assert "MYSQL_SSL_CERT and MYSQL_SSL_KEY go together" in explain_settings(info.value)
    monkeypatch.setenv("MYSQL_SSL_KEY", str(pems / "client.key"))
    monkeypatch.setenv("MYSQL_SSL_CA", "")              # empty: unset
    monkeypatch.setenv("MYSQL_SSL_VERIFY_IDENTITY", "false")
    assert MySqlTls.from_settings(Settings().database) == MySqlTls(mode="verify", cert=str(pems / "client.pem"),
                                            key=str(pems / "client.key"), verify_identity=False)


# -- what the drivers get --------------------------------------------------------------------------

def test_without_settings_there_is_no_tls():
    assert MySqlTls.from_settings(Settings().database).mode == "disabled" and ssl_context(Settings()) is None
    assert MySqlTls.from_settings(Settings(mysql_ssl_ca="", mysql_ssl_cert="", mysql_ssl_key="").database).enabled is False


def test_a_ca_means_the_certificate_and_the_host_name_are_checked(pems):
    context = ssl_context(Settings(mysql_ssl_ca=str(pems / "ca.pem")))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True
    assert context.cert_store_stats()["x509_ca"] == 1          # this CA, not the system's
    unchecked = ssl_context(Settings(mysql_ssl_ca=str(pems / "ca.pem"), mysql_ssl_verify_identity=False))
    assert unchecked.verify_mode == ssl.CERT_REQUIRED and unchecked.check_hostname is False


def test_required_encrypts_without_checking_and_verify_alone_uses_the_system_cas(pems):
    required = Settings(mysql_ssl_mode="REQUIRED", mysql_ssl_cert=str(pems / "client.pem"),
                        mysql_ssl_key=str(pems / "client.key"))
    assert MySqlTls.from_settings(required.database).mode == "required"
    context = ssl_context(required)
    assert context.verify_mode == ssl.CERT_NONE and context.check_hostname is False
    system = ssl_context(Settings(mysql_ssl_mode="verify"))
    assert system.verify_mode == ssl.CERT_REQUIRED and system.check_hostname is True
    assert "the system CAs" in MySqlTls.from_settings(Settings(mysql_ssl_mode="verify").database).describe()


# -- refusals explained ----------------------------------------------------------------------------

def wrapped(code: int, message: str, cause: BaseException | None = None) -> OperationalError:
    """A driver error as SQLAlchemy hands it over (``orig``; the driver's cause chained)."""
    orig = pymysql.err.OperationalError(code, message)
    orig.__cause__ = cause
    return OperationalError("SELECT 1", {}, orig)


def test_mysqls_refusal_of_insecure_transport_names_the_setting():
    error = explain(wrapped(3159, "Connections using insecure transport are prohibited while "
                                  "--require_secure_transport=ON."), MySqlTls(), WHERE)
    assert not error.retriable
    assert "accepts only TLS connections (require_secure_transport=ON)" in str(error) and "MYSQL_SSL_CA" in str(error)


def test_mariadbs_access_denied_mentions_tls_only_when_it_may_be_the_cause(pems):
    denied = wrapped(1045, "Access denied for user 'app'@'10.0.0.1' (using password: YES)")
    offered = explain(denied, MySqlTls(), WHERE, server_offers_tls=True)
    assert not offered.retriable and "require_secure_transport=ON" in str(offered) and "MYSQL_SSL_CA" in str(offered)
    assert "require_secure_transport" not in str(explain(denied, MySqlTls(), WHERE, server_offers_tls=False))
    without_cert = explain(denied, MySqlTls(mode="verify", ca=str(pems / "ca.pem")), WHERE)
    assert "REQUIRE X509" in str(without_cert) and "MYSQL_SSL_CERT and MYSQL_SSL_KEY are unset" in str(without_cert)


def test_a_certificate_no_ca_of_ours_signed_is_a_refusal_naming_the_ca_setting():
    untrusted = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                                "self-signed certificate in certificate chain")
    error = explain(wrapped(2003, "Can't connect to MySQL server on 'db.internal'", untrusted),
                    MySqlTls(mode="verify", ca="/etc/db/ca.pem"), WHERE)
    assert not error.retriable
    assert "is not signed by a CA we trust" in str(error) and "Set MYSQL_SSL_CA" in str(error)
    mismatch = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                               "Hostname mismatch, certificate is not valid for 'db.internal'.")
    error = explain(wrapped(2003, "Can't connect", mismatch), MySqlTls(mode="verify"), WHERE)
    assert "does not name the host 'db.internal'" in str(error) and "MYSQL_SSL_VERIFY_IDENTITY=false" in str(error)


def test_a_server_that_does_not_answer_is_waited_for():
    refused_tcp = ConnectionRefusedError(111, "Connection refused")
    error = explain(wrapped(2003, "Can't connect to MySQL server on 'db.internal'", refused_tcp), MySqlTls(), WHERE)
    assert error.retriable and "does not answer" in str(error)


def test_an_outage_s_log_line_names_a_tls_cause_the_driver_reports_as_cant_connect():
    """A worker already running meets a server whose new certificate it does not trust: the store
    waits it out like an outage, and its lines say why (the next start-up refuses it, exit 78)."""
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    assert tls_failure(wrapped(2003, "Can't connect", untrusted)) == " (TLS: unable to get local issuer certificate)"
    assert tls_failure(wrapped(2003, "Can't connect", ConnectionRefusedError(111, "refused"))) == ""
