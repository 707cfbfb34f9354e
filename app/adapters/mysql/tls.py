"""How every database connection of the project is secured: TLS, server verification, client certificates.

One :class:`MySqlTls` is built from the settings (``MySqlTls.from_settings(settings.database)``, the only
reader of the ``MYSQL_SSL_*`` settings; the rules are the settings', :mod:`app.settings.database`); :func:`app.adapters.mysql.engine.ssl_context` turns it into the ``ssl.SSLContext`` that the
worker's engine, the CLI, Alembic, the benchmarks and the tests' own connections hand their driver.

Both drivers (aiomysql and PyMySQL) quietly carry on *without* TLS when given a context and a
server that does not offer TLS (``if ssl and server_capabilities & CLIENT.SSL``), login included;
so does any client talking to a man in the middle who strips the flag from the server's
greeting. :func:`install_plaintext_refusal` makes both refuse instead, before they send
anything; every context this module hands out installs it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.settings.database import TLS_MODES, DatabaseSettings, check_tls, tls_context

Mode = Literal["disabled", "required", "verify"]
MODES = TLS_MODES
CLIENT_SSL = 0x0800                 # capability flag of the server's greeting: it offers TLS
CR_SSL_CONNECTION_ERROR = 2026      # the MySQL client's own code for "SSL is required but ..."


class DatabaseConfigError(ValueError):
    """The MYSQL_SSL_* settings contradict each other or name files that cannot be used."""


@dataclass(frozen=True)
class MySqlTls:
    mode: Mode = "disabled"
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    verify_identity: bool = True

    @classmethod
    def of(cls, mode: str | None, ca: str | None, cert: str | None, key: str | None,
           verify_identity: bool) -> MySqlTls:
        """From the settings: an unset mode is ``verify`` when a CA or a client certificate is given."""
        ca, cert, key = (value or None for value in (ca, cert, key))
        if mode is None:
            mode = "verify" if ca or cert or key else "disabled"
        tls = cls(mode=mode.lower(), ca=ca, cert=cert, key=key, verify_identity=verify_identity)
        tls.check()
        return tls

    @classmethod
    def from_settings(cls, database: DatabaseSettings) -> MySqlTls:
        """How every database connection is secured (the only reader of the MYSQL_SSL_* settings)."""
        return cls.of(database.ssl_mode, ca=database.ssl_ca, cert=database.ssl_cert, key=database.ssl_key,
                      verify_identity=database.ssl_verify_identity)

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    def check(self) -> None:
        """Refuse settings that cannot work, naming the settings (never their values)."""
        try:
            check_tls(self.mode, self.ca, self.cert, self.key, self.verify_identity)
        except ValueError as exc:
            raise DatabaseConfigError(str(exc)) from None

    def describe(self) -> str:
        """For the start-up log line (paths, never a key's contents)."""
        if not self.enabled:
            return "without TLS (MYSQL_SSL_MODE=disabled)"
        if self.mode == "required":
            parts = ["TLS, server certificate NOT checked (MYSQL_SSL_MODE=required)"]
        else:
            parts = [f"TLS, server certificate checked against {f'CA {self.ca}' if self.ca else 'the system CAs'}",
                     "host name checked" if self.verify_identity else "host name NOT checked"]
        if self.cert:
            parts.append(f"client certificate {self.cert}")
        return ", ".join(parts)

    def _context(self) -> ssl.SSLContext:
        try:
            return tls_context(self.mode, self.ca, self.cert, self.key, self.verify_identity)
        except ValueError as exc:
            raise DatabaseConfigError(str(exc)) from None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context every driver gets (None without TLS); installs the refusal of plaintext."""
        if not self.enabled:
            return None
        install_plaintext_refusal()
        return self._context()


# -- no silent fallback to plaintext ---------------------------------------------------------------

def _plaintext_refused() -> Exception:
    import pymysql

    return pymysql.err.OperationalError(
        CR_SSL_CONNECTION_ERROR, "SSL connection error: TLS is required (MYSQL_SSL_*) but the server does not "
                                 "offer it; nothing was sent")


def install_plaintext_refusal() -> None:
    """Make aiomysql and PyMySQL refuse a server that offers no TLS when they were given a context,
    before they send the login (left to themselves, both send it in plaintext)."""
    import aiomysql.connection
    import pymysql.connections

    for cls, wanted in ((aiomysql.connection.Connection, "_ssl_context"), (pymysql.connections.Connection, "ssl")):
        original = cls._request_authentication
        if getattr(original, "refuses_plaintext", False):
            continue

        def make(original: Callable, wanted: str) -> Callable:
            # aiomysql's is a coroutine function: this returns its coroutine, or raises before
            # making one; the greeting (server_capabilities) has been read by then in both.
            def request_authentication(self, *args, **kwargs):
                if getattr(self, wanted, None) and not self.server_capabilities & CLIENT_SSL:
                    raise _plaintext_refused()
                return original(self, *args, **kwargs)
            request_authentication.refuses_plaintext = True
            return request_authentication

        cls._request_authentication = make(original, wanted)
