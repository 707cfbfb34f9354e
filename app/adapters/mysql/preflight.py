"""The worker's first connection to the database, and what a refused one means in the user's terms.

:func:`preflight` runs before the worker's first batch: a probe that sends no credentials (the
server's greeting, then, with TLS, the handshake and a moment of listening: a server that
refuses our client certificate says so then, under TLS 1.3, and says nothing unasked
otherwise), then one login through the engine. What went wrong becomes one sentence naming the
setting to change (:func:`explain`, also used by Alembic's environment). A server that does not
answer is waited for; one that answers and refuses is not: a restart changes nothing.

MySQL 8 refuses a connection without TLS under ``require_secure_transport=ON`` with error 3159;
MariaDB 10.11 (measured) answers it with 1045, access denied, as it does a wrong password. Both
drivers report a TLS failure as error 2003 or 2013 ("Can't connect", "Lost connection") with the
``ssl.SSLError`` underneath.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.adapters.mysql.tls import CLIENT_SSL, CR_SSL_CONNECTION_ERROR, MySqlTls

log = logging.getLogger(__name__)

ER_ACCESS_DENIED = 1045             # also MariaDB's answer under require_secure_transport=ON
ER_SECURE_TRANSPORT_REQUIRED = 3159  # MySQL's answer to a connection without TLS that it requires


class DatabaseStartupError(RuntimeError):
    """The database cannot be used with these settings; the message says why, in the user's terms.

    ``retriable`` is true when the cause may go away by itself (the server does not answer yet)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


# -- what went wrong, in the user's terms ------------------------------------------------------------

def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what it wraps: SQLAlchemy's ``orig``, the drivers' ``__cause__`` and
    PyMySQL's ``original_exception`` (both drivers turn an ``ssl.SSLError`` into error 2003/2013)."""
    found: list[BaseException] = []
    todo: list[Any] = [exc]
    while todo:
        item = todo.pop(0)
        if not isinstance(item, BaseException) or any(item is seen for seen in found):
            continue
        found.append(item)
        todo += [getattr(item, "orig", None), item.__cause__, item.__context__,
                 getattr(item, "original_exception", None)]
    return found


def tls_failure(exc: BaseException) -> str:
    """`` (TLS: <reason>)`` when a TLS error lies under ``exc`` (the drivers report it as error 2003
    or 2013, "Can't connect"), else nothing: for the store's log lines of an outage."""
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLError):
            return f" (TLS: {getattr(cause, 'verify_message', None) or getattr(cause, 'reason', None) or cause})"
    return ""


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) and not isinstance(exc, OSError) else None


@dataclass(frozen=True)
class Target:
    """Where the settings point (for messages: no password)."""
    host: str
    port: int
    user: str
    unix_socket: str | None = None      # MYSQL_URL's ?unix_socket=, which the drivers then use instead

    @classmethod
    def of(cls, url: str) -> Target:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        socket = parsed.query.get("unix_socket")
        return cls(host=parsed.host or "localhost", port=parsed.port or 3306, user=parsed.username or "",
                   unix_socket=socket if isinstance(socket, str) else None)

    def open(self) -> Any:
        if self.unix_socket:
            return asyncio.open_unix_connection(self.unix_socket)
        return asyncio.open_connection(self.host, self.port)

    def __str__(self) -> str:
        return self.unix_socket or f"{self.host}:{self.port}"


def _tls_refusal(tls: MySqlTls, where: Target, error: ssl.SSLError | OSError) -> str | None:
    text = f"{getattr(error, 'reason', '') or ''} {error}"
    if isinstance(error, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        if "mismatch" in text.lower() or "hostname" in text.lower():
            return (f"the database server's TLS certificate at {where} does not name the host {where.host!r} of "
                    f"MYSQL_URL ({getattr(error, 'verify_message', None) or text.strip()}): connect by a name the "
                    "certificate lists, or set MYSQL_SSL_VERIFY_IDENTITY=false")
        ca = "the CA of MYSQL_SSL_CA" if tls.ca else "any of the system's CAs (MYSQL_SSL_CA is unset)"
        return (f"the database server's TLS certificate at {where} is not signed by a CA we trust "
                f"({getattr(error, 'verify_message', None) or text.strip()}): not by {ca}. Set MYSQL_SSL_CA to "
                "the CA that signed the server's certificate")
    alerts = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE",
              "ACCESS_DENIED", "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED")
    if any(alert in text for alert in alerts):
        return _client_certificate_refused(tls, where, getattr(error, "reason", None) or text.strip())
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        return (f"TLS with the database server at {where} failed ({text.strip()}): is MYSQL_URL's port a MySQL "
                "server's?")
    return None


def _client_certificate_refused(tls: MySqlTls, where: Target, detail: str) -> str:
    if tls.cert:
        return (f"the database server at {where} refused our TLS client certificate ({detail}): MYSQL_SSL_CERT "
                "is not signed by a CA the server trusts (its ssl_ca), or has expired")
    return (f"the database server at {where} refused the TLS handshake for want of a client certificate ({detail}): "
            "set MYSQL_SSL_CERT and MYSQL_SSL_KEY")


def explain(exc: BaseException, tls: MySqlTls, where: Target, *, server_offers_tls: bool | None = None) \
        -> DatabaseStartupError:
    """One sentence for a failed connection, naming the setting to change; ``retriable`` unless
    the server answered and refused."""
    causes = _causes(exc)
    for cause in causes:
        if isinstance(cause, ssl.SSLError):
            sentence = _tls_refusal(tls, where, cause)
            if sentence:
                return DatabaseStartupError(sentence)
    codes = [code for code in map(_code, causes) if code is not None]
    server = f"the database server at {where}"
    if CR_SSL_CONNECTION_ERROR in codes:
        return DatabaseStartupError(_no_tls_offered(tls, where))
    if ER_SECURE_TRANSPORT_REQUIRED in codes:
        return DatabaseStartupError(
            f"{server} accepts only TLS connections (require_secure_transport=ON) and MYSQL_SSL_* is unset: set "
            "MYSQL_SSL_CA to the CA of the server's certificate (or MYSQL_SSL_MODE=required to encrypt without "
            "checking it)")
    if ER_ACCESS_DENIED in codes:
        because = "a wrong user or password in MYSQL_URL"
        if not tls.enabled and server_offers_tls is not False:
            because += (", or the server requires TLS and MYSQL_SSL_* is unset (MariaDB answers a connection "
                        "without TLS this way under require_secure_transport=ON, as it does for an account "
                        "REQUIRE SSL or X509: set MYSQL_SSL_CA)")
        elif tls.enabled and not tls.cert:
            because += (", or the account requires a client certificate (REQUIRE X509, SUBJECT or ISSUER) and "
                        "MYSQL_SSL_CERT and MYSQL_SSL_KEY are unset")
        elif tls.cert:
            because += ", or the account's REQUIRE SUBJECT or ISSUER does not match MYSQL_SSL_CERT"
        return DatabaseStartupError(f"{server} refused user {where.user!r} (error 1045, access denied): {because}")
    if 1044 in codes or 1049 in codes:
        return DatabaseStartupError(f"{server} refused the database of MYSQL_URL for user {where.user!r} "
                                    f"({_message(causes)}): create it, or grant the user access to it")
    if any(code in (1251, 1275) for code in codes):
        return DatabaseStartupError(f"{server} refused our login ({_message(causes)})")
    if any(code < 2000 for code in codes):
        # The server answered and refused (a server error, not a client one: 2xxx are the
        # driver's), e.g. 1231 for a DB_SQL_MODE it does not know.
        return DatabaseStartupError(f"{server} refused our session ({_message(causes)})")
    return DatabaseStartupError(f"{server} does not answer: {_message(causes)}", retriable=True)


def _message(causes: list[BaseException]) -> str:
    return "; ".join(dict.fromkeys(f"{type(c).__name__}: {c}" for c in causes[1:] or causes))


def _no_tls_offered(tls: MySqlTls, where: Target) -> str:
    return (f"the database server at {where} does not offer TLS, which MYSQL_SSL_* asks for (mode {tls.mode}): give "
            "the server a certificate and key (ssl_cert, ssl_key; MariaDB then shows have_ssl=YES), or unset "
            "MYSQL_SSL_*")


# -- the probe and the first login -------------------------------------------------------------------

async def _read_packet(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(4)
    return await reader.readexactly(int.from_bytes(header[:3], "little"))


async def probe(tls: MySqlTls, where: Target, timeout: float) -> bool:
    """Read the server's greeting and, with TLS, shake hands and listen a moment; no credentials
    are sent. Returns whether the server offers TLS; raises :class:`DatabaseStartupError`."""
    try:
        reader, writer = await asyncio.wait_for(where.open(), timeout)
    except (TimeoutError, OSError) as exc:
        raise DatabaseStartupError(f"the database server at {where} does not answer: "
                                   f"{type(exc).__name__}: {exc or 'timed out'}", retriable=True) from None
    try:
        try:
            greeting = await asyncio.wait_for(_read_packet(reader), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            raise DatabaseStartupError(f"the database server at {where} took the connection but sent no greeting "
                                       f"({type(exc).__name__}): is it starting, or is this not its port?",
                                       retriable=True) from None
        if greeting[:1] == b"\xff":       # an error instead of a greeting: too many connections, host blocked
            code = int.from_bytes(greeting[1:3], "little")
            raise DatabaseStartupError(f"the database server at {where} turned us away: error {code}: "
                                       f"{greeting[3:].decode(errors='replace')}", retriable=code in (1040, 1203))
        version_end = greeting.index(b"\0", 1)
        capabilities = int.from_bytes(greeting[version_end + 14:version_end + 16], "little")
        offers_tls = bool(capabilities & CLIENT_SSL)
        if not tls.enabled:
            return offers_tls
        if not offers_tls:
            raise DatabaseStartupError(_no_tls_offered(tls, where))
        # SSLRequest: protocol 4.1 and TLS, max packet, utf8mb4, then the handshake on this socket.
        request = struct.pack("<IIB23s", 0x0200 | 0x8000 | CLIENT_SSL, 1 << 24, 45, b"")
        writer.write(len(request).to_bytes(3, "little") + b"\x01" + request)
        await writer.drain()
        try:
            await asyncio.wait_for(writer.start_tls(tls.ssl_context(), server_hostname=where.host), timeout)
        except ssl.SSLError as exc:
            raise DatabaseStartupError(_tls_refusal(tls, where, exc) or f"TLS with the database server at {where} "
                                       f"failed: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise DatabaseStartupError(f"the database server at {where} broke off the TLS handshake "
                                       f"({type(exc).__name__}): is it going down?", retriable=True) from None
        # With TLS 1.3 our side of the handshake ends before the server has judged our
        # certificate: a refusal is the first thing read. A server that accepted us waits for
        # our login and says nothing, so a moment of silence means it took the certificate.
        try:
            data = await asyncio.wait_for(reader.read(1), 0.5)
        except TimeoutError:
            return True
        except ssl.SSLError as exc:
            raise DatabaseStartupError(_client_certificate_refused(tls, where, exc.reason or str(exc))) from None
        except OSError:
            data = b""
        if not data:
            raise DatabaseStartupError(_client_certificate_refused(tls, where, "it closed the connection after "
                                                                               "the handshake"))
        return True
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except Exception:
            pass


async def _log_in(engine, tls: MySqlTls) -> str:
    from sqlalchemy import text

    async with engine.connect() as conn:
        cipher = (await conn.execute(text("SHOW SESSION STATUS LIKE 'Ssl_cipher'"))).all()
    cipher = cipher[0][1] if cipher else ""
    if tls.enabled and not cipher:            # the refusal of plaintext makes this impossible; checked anyway
        raise DatabaseStartupError("the database session is not encrypted although MYSQL_SSL_* asks for TLS")
    return cipher


async def preflight(engine, tls: MySqlTls, where: Target, *, wait_seconds: float, attempt_timeout: float = 10.0,
                    stopping: Callable[[], bool] = lambda: False) -> str:
    """Probe, then log in once through ``engine``. Waits, with a log line per attempt, while the
    server does not answer (up to ``wait_seconds``); raises :class:`DatabaseStartupError` at once
    when it answers and refuses, and when the wait is over. Returns the session's TLS cipher."""
    deadline = time.monotonic() + wait_seconds
    delay, attempt = 1.0, 0
    while True:
        attempt += 1
        try:
            offers_tls = await probe(tls, where, attempt_timeout)
            try:
                cipher = await asyncio.wait_for(_log_in(engine, tls), attempt_timeout)
            except DatabaseStartupError:
                raise
            except Exception as exc:
                raise explain(exc, tls, where, server_offers_tls=offers_tls) from None
            if attempt > 1:
                log.warning("the database answers at %s (attempt %d)", where, attempt)
            return cipher
        except DatabaseStartupError as exc:
            left = deadline - time.monotonic()
            if not exc.retriable or left <= 0 or stopping():
                raise
            log.warning("waiting for the database (%s): %s; next attempt in %.0f s, giving up in %.0f s",
                        where, exc, min(delay, left), left)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 10.0)
