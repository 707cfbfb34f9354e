"""How every Kafka client of the project connects: brokers, security protocol, credentials, certificates.

One :class:`KafkaConnection` is built from the settings (``KafkaConnection.from_settings(settings.kafka)``);
every client (Faust's consumer and producer, the dead-letter producer, the admin client, the lag reader,
the demo producer, the benchmark, the chaos suite) takes its options from :meth:`KafkaConnection.client_options`
or :meth:`KafkaConnection.faust_credentials`, and nothing else reads the ``KAFKA_SASL_*`` and
``KAFKA_SSL_*`` settings.

The password is a :class:`pydantic.SecretStr` until the moment a client is made: it is in no
``repr``, no :meth:`describe`, no error message of this module.

:func:`preflight` is what a process does before its first real client: it connects once, with a
bound, and turns what went wrong into a sentence that names the cause (a wrong password, a
certificate no configured CA signed, PLAINTEXT against a TLS listener, ...). A broker that does
not answer yet is waited for, up to ``KAFKA_STARTUP_WAIT_SECONDS``; a broker that answers and
refuses is not: retrying a wrong password only locks the account.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import SecretStr

from app.settings.kafka import SASL_MECHANISMS, SECURITY_PROTOCOLS, KafkaSettings, brokers, check_security

log = logging.getLogger(__name__)

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
__all__ = ["SASL_MECHANISMS", "SECURITY_PROTOCOLS", "KafkaConfigError", "KafkaConnection", "KafkaStartupError",
           "connection_of", "preflight"]


class KafkaConfigError(ValueError):
    """The security settings contradict each other (found before any connection)."""


class KafkaStartupError(RuntimeError):
    """Kafka cannot be used with these settings; the message says why, in the user's terms.

    ``retriable`` is true when the cause may go away by itself (no broker answers yet)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True)
class KafkaConnection:
    bootstrap: str                                  # "host:port,host:port" (aiokafka's form)
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True

    @classmethod
    def from_settings(cls, kafka: KafkaSettings) -> KafkaConnection:
        """How every Kafka client connects (the only reader of the KAFKA_SASL_*/KAFKA_SSL_* settings)."""
        return cls(bootstrap=kafka.bootstrap, security_protocol=kafka.security_protocol,
                   sasl_mechanism=kafka.sasl_mechanism, sasl_username=kafka.sasl_username,
                   sasl_password=kafka.sasl_password, ssl_cafile=kafka.ssl_cafile,
                   ssl_certfile=kafka.ssl_certfile, ssl_keyfile=kafka.ssl_keyfile,
                   ssl_check_hostname=kafka.ssl_check_hostname)

    def __post_init__(self) -> None:
        if isinstance(self.sasl_password, str):
            object.__setattr__(self, "sasl_password", SecretStr(self.sasl_password))
        self.check()

    # -- what the settings say --------------------------------------------------------------
    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def brokers(self) -> list[tuple[str, int]]:
        return brokers(self.bootstrap)

    def check(self) -> None:
        """Refuse settings that cannot work, naming the settings to change (the rules are the settings':
        :func:`app.settings.kafka.check_security`)."""
        try:
            check_security(bootstrap=self.bootstrap, security_protocol=self.security_protocol,
                           sasl_mechanism=self.sasl_mechanism, sasl_username=self.sasl_username,
                           sasl_password=self.sasl_password, ssl_cafile=self.ssl_cafile,
                           ssl_certfile=self.ssl_certfile, ssl_keyfile=self.ssl_keyfile)
        except ValueError as exc:
            raise KafkaConfigError(str(exc)) from None

    def describe(self) -> str:
        """For log lines and the start-up banner: everything but the password."""
        parts = [self.bootstrap, self.security_protocol]
        if self.uses_sasl:
            parts.append(f"{self.sasl_mechanism} as {self.sasl_username!r}")
        if self.uses_tls:
            parts.append(f"CA {self.ssl_cafile}" if self.ssl_cafile else "system CAs")
            if self.ssl_certfile:
                parts.append(f"client certificate {self.ssl_certfile}")
            if not self.ssl_check_hostname:
                parts.append("host names NOT checked")
        return ", ".join(parts)

    # -- what clients get --------------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        from aiokafka.helpers import create_ssl_context

        try:
            context = create_ssl_context(cafile=self.ssl_cafile, certfile=self.ssl_certfile,
                                         keyfile=self.ssl_keyfile)
        except ssl.SSLError as exc:
            raise KafkaConfigError(f"KAFKA_SSL_CAFILE/CERTFILE/KEYFILE could not be loaded ({exc.reason or exc}): "
                                   "they must be PEM files, the key matching the certificate") from None
        context.check_hostname = self.ssl_check_hostname
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaConsumer, AIOKafkaProducer and AIOKafkaAdminClient."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap,
                                   "security_protocol": self.security_protocol}
        if self.uses_tls:
            options["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password.get_secret_value())
        return options

    def faust_credentials(self) -> Any:
        """Faust's ``broker_credentials``: None for PLAINTEXT."""
        import faust

        if self.uses_sasl:
            return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password.get_secret_value(),
                                         mechanism=self.sasl_mechanism, ssl_context=self.ssl_context())
        if self.uses_tls:
            return faust.SSLCredentials(self.ssl_context())
        return None


def idempotent_producer_settings(settings_extra: Callable) -> Callable:
    """Faust's ``Producer._settings_extra`` (``settings_extra``), with acks=all and idempotence.

    Every producer of the project is idempotent with acks=all; Faust's is so only in its own
    exactly-once mode. It sends nothing of ours today (no tables, no topic written through it),
    but a retry through a leader change must never write twice. Put in place by
    ``app.adapters.kafka.upstream``."""
    @functools.wraps(settings_extra)
    def _settings_extra(self) -> dict[str, Any]:
        return {**settings_extra(self), "acks": "all", "enable_idempotence": True}
    return _settings_extra


def connection_of(kafka: KafkaConnection | str) -> KafkaConnection:
    """A connection, or a bare "host:port,..." list (PLAINTEXT: local tools and tests)."""
    return kafka if isinstance(kafka, KafkaConnection) else KafkaConnection(bootstrap=kafka)


# -- the first connection -------------------------------------------------------------------------

def _tls_error(conn: KafkaConnection, exc: ssl.SSLError) -> KafkaStartupError:
    text = f"{getattr(exc, 'reason', '') or ''} {exc}"
    where = conn.bootstrap
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        if "hostname" in text.lower() or "IP address mismatch" in text:
            detail = getattr(exc, "verify_message", None) or text.strip()
            return KafkaStartupError(
                f"the broker's TLS certificate at {where} does not name the host it was reached at ({detail}): "
                "connect by a name the certificate lists, or (tests only) KAFKA_SSL_CHECK_HOSTNAME=false")
        ca = f"KAFKA_SSL_CAFILE={conn.ssl_cafile}" if conn.ssl_cafile else "the system's CAs (KAFKA_SSL_CAFILE unset)"
        return KafkaStartupError(f"the broker's TLS certificate at {where} is not signed by a CA we trust: "
                                 f"{ca} does not vouch for it. Set KAFKA_SSL_CAFILE to the CA that signed "
                                 "the brokers' certificates")
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text or "UNEXPECTED_RECORD" in text:
        return KafkaStartupError(f"{where} does not speak TLS: KAFKA_SECURITY_PROTOCOL={conn.security_protocol} "
                                 "needs a TLS listener; is this the PLAINTEXT or SASL_PLAINTEXT port?")
    if any(alert in text for alert in ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE",
                                       "UNKNOWN_CA", "CERTIFICATE_UNKNOWN")):
        return _client_certificate_refused(conn, where, text.strip())
    return KafkaStartupError(f"TLS with the broker at {where} failed: {text.strip()}")


async def _tls_probe(host: str, port: int, timeout: float) -> bool:
    """Does the listener at host:port answer a TLS ClientHello with a TLS handshake?"""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), timeout)
    except ssl.SSLError as exc:
        # A TLS server that wanted a client certificate still spoke TLS.
        return "WRONG_VERSION_NUMBER" not in str(exc) and "record layer" not in str(exc)
    except (TimeoutError, OSError):
        return False
    writer.close()
    return True


class _Unclear(Exception):
    """This broker failed in a way that does not say why (it may be down behind a proxy or a
    load balancer, or be the wrong kind of listener): try the others, then look closer."""


async def _tcp(host: str, port: int, timeout: float) -> str | None:
    """None when host:port accepts a TCP connection, else why not."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer.close()
        return None
    except TimeoutError:
        return f"{host}:{port} did not answer within {timeout:g} s"
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


async def _speaks_plaintext_kafka(host: str, port: int, timeout: float) -> bool:
    from aiokafka.conn import create_conn

    try:
        probe = await asyncio.wait_for(create_conn(host, port, request_timeout_ms=int(timeout * 1000)), timeout)
    except Exception:
        return False
    probe.close()
    return True


async def _connect_once(conn: KafkaConnection, timeout: float) -> None:
    """Log in to one broker after the other until one lets us in, then ask the cluster a question.

    A broker that answers and refuses (a wrong password, a certificate we do not trust) ends it:
    the others would say the same. A broker that fails without saying why is skipped."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaConnectionError, KafkaError

    unclear: list[str] = []
    reached: list[tuple[str, int]] = []
    for host, port in conn.brokers:
        why = await _tcp(host, port, min(timeout, 5.0))
        if why is not None:
            unclear.append(why)
            continue
        reached.append((host, port))
        try:
            await _log_in(conn, host, port, timeout)
            break
        except _Unclear as exc:
            unclear.append(str(exc))
    else:
        if not reached:
            raise KafkaStartupError(f"no broker of KAFKA_BROKER={conn.bootstrap} answers: {'; '.join(unclear)}",
                                    retriable=True)
        # Every broker that took the connection dropped it: the wrong kind of listener, or all
        # of them down behind something that accepts for them.
        host, port = reached[0]
        if not conn.uses_tls and await _tls_probe(host, port, 5.0):
            raise KafkaStartupError(f"{host}:{port} is a TLS listener but KAFKA_SECURITY_PROTOCOL="
                                    f"{conn.security_protocol}: set it to SSL or SASL_SSL (with KAFKA_SSL_CAFILE)")
        if conn.uses_tls and await _speaks_plaintext_kafka(host, port, 5.0):
            raise KafkaStartupError(f"{host}:{port} does not speak TLS: KAFKA_SECURITY_PROTOCOL="
                                    f"{conn.security_protocol} needs a TLS listener; is this the PLAINTEXT or "
                                    "SASL_PLAINTEXT port?")
        raise KafkaStartupError("; ".join(unclear), retriable=True)
    # A broker let us in: what fails from here on is the cluster's state (a node not ready, no
    # controller yet, a leader moving), which passes by itself.
    client = AIOKafkaAdminClient(request_timeout_ms=int(timeout * 1000), **conn.client_options())
    try:
        await asyncio.wait_for(client.start(), timeout)
        await asyncio.wait_for(client.list_topics(), timeout)
    except (TimeoutError, KafkaConnectionError, KafkaError, OSError) as exc:
        raise KafkaStartupError(f"the cluster at {conn.bootstrap} is not ready: {type(exc).__name__}: "
                                f"{exc or 'no detail'}", retriable=True) from None
    finally:
        try:
            await asyncio.wait_for(client.close(), 5)
        except Exception:
            pass


async def _log_in(conn: KafkaConnection, host: str, port: int, timeout: float) -> None:
    from aiokafka.conn import create_conn
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError

    # A TLS handshake of our own first: ssl errors are clear here; inside aiokafka they become
    # "Unable to bootstrap from ..." after its retries.
    if conn.uses_tls:
        await _handshake(conn, host, port, timeout)
    # One connection of aiokafka's own, which raises the broker's SASL answer as it is (its
    # bootstrap turns a refused login into "Unable to bootstrap", which looks like an outage).
    options = conn.client_options()
    del options["bootstrap_servers"]
    try:
        probe = await asyncio.wait_for(create_conn(host, port, request_timeout_ms=int(timeout * 1000), **options),
                                       timeout)
        probe.close()
    except SaslAuthenticationFailed:
        raise KafkaStartupError(f"the brokers at {conn.bootstrap} refused our SASL login: user "
                                f"{conn.sasl_username!r}, mechanism {conn.sasl_mechanism}: a wrong "
                                "KAFKA_SASL_PASSWORD, an unknown user, or a mechanism this user has no "
                                "credentials for") from None
    except UnsupportedSaslMechanismError as exc:
        raise KafkaStartupError(f"the brokers at {conn.bootstrap} do not offer KAFKA_SASL_MECHANISM="
                                f"{conn.sasl_mechanism} on this listener: {exc}") from None
    except Exception as exc:
        maybe = "SASL (SASL_PLAINTEXT / SASL_SSL)"
        if conn.uses_tls and not conn.ssl_certfile:
            maybe = "a client certificate (mTLS: KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE) or SASL (SASL_SSL)"
        raise _Unclear(f"{host}:{port} took the connection but did not answer Kafka's protocol with "
                       f"KAFKA_SECURITY_PROTOCOL={conn.security_protocol} ({type(exc).__name__}: "
                       f"{exc or 'no detail'}): is it down, or does this listener require {maybe}?") from None


def _client_certificate_refused(conn: KafkaConnection, where: str, detail: str) -> KafkaStartupError:
    mine = f"KAFKA_SSL_CERTFILE={conn.ssl_certfile}" if conn.ssl_certfile else "none (KAFKA_SSL_CERTFILE unset)"
    return KafkaStartupError(f"the broker at {where} refused our TLS client certificate ({detail}): this listener "
                             f"requires a client certificate it trusts (mTLS); ours: {mine}")


async def _handshake(conn: KafkaConnection, host: str, port: int, timeout: float) -> None:
    where = f"{host}:{port}"
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            host, port, ssl=conn.ssl_context(), server_hostname=host), timeout)
    except ssl.SSLError as exc:
        if isinstance(exc, ssl.SSLEOFError):
            raise _Unclear(f"{where} closed the connection during the TLS handshake: is it down, or not a "
                           f"TLS listener (KAFKA_SECURITY_PROTOCOL={conn.security_protocol})?") from None
        raise _tls_error(conn, exc) from None
    except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
        raise _Unclear(f"{where} closed the connection during the TLS handshake: is it down, or not a "
                       f"TLS listener (KAFKA_SECURITY_PROTOCOL={conn.security_protocol})?") from None
    except TimeoutError:
        raise _Unclear(f"{where} took the connection but did not complete a TLS handshake within {timeout:g} s: "
                       f"is it hung, or not a TLS listener (KAFKA_SECURITY_PROTOCOL={conn.security_protocol})?") \
            from None
    # With TLS 1.3 the client's side of the handshake ends before the server has judged the
    # client's certificate: a refusal arrives as the first thing read. A broker says nothing
    # unasked, so silence for a moment means it accepted us.
    try:
        data = await asyncio.wait_for(reader.read(1), 0.5)
        if not data:
            raise _client_certificate_refused(conn, where, "it closed the connection after the handshake")
    except ssl.SSLError as exc:
        raise _client_certificate_refused(conn, where, getattr(exc, "reason", None) or str(exc)) from None
    except (ConnectionResetError, BrokenPipeError):
        raise _client_certificate_refused(conn, where, "it reset the connection after the handshake") from None
    except TimeoutError:
        pass
    finally:
        writer.close()


async def preflight(conn: KafkaConnection, *, wait_seconds: float, attempt_timeout: float = 10.0,
                    stopping: Callable[[], bool] = lambda: False) -> None:
    """Connect once before anything else does. Waits, with a log line per attempt, while no broker
    answers (up to ``wait_seconds``); raises :class:`KafkaStartupError` at once when a broker
    answers and refuses, and when the wait is over."""
    deadline = time.monotonic() + wait_seconds
    delay = 1.0
    attempt = 0
    while True:
        attempt += 1
        try:
            await _connect_once(conn, attempt_timeout)
            if attempt > 1:
                log.warning("Kafka answers at %s (attempt %d)", conn.bootstrap, attempt)
            return
        except KafkaStartupError as exc:
            left = deadline - time.monotonic()
            if not exc.retriable or left <= 0 or stopping():
                if exc.retriable:
                    raise KafkaStartupError(f"{exc} (waited {wait_seconds:g} s: KAFKA_STARTUP_WAIT_SECONDS)",
                                            retriable=True) from None
                raise
            log.warning("waiting for Kafka (%s): %s; next attempt in %.0f s, giving up in %.0f s",
                        conn.describe(), exc, min(delay, left), left)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 10.0)

