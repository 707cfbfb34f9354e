"""How every database connection of the project is secured: TLS, server verification, client certificates.

One :class:`MySqlTls` is built from the settings (``Settings.mysql_tls``, the only reader of the
``MYSQL_SSL_*`` settings); :func:`app.adapters.mysql.engine.ssl_context` turns it into the ``ssl.SSLContext`` that the
worker's engine, the CLI, Alembic, the benchmarks and the tests' own connections hand their driver.

Both drivers (aiomysql and PyMySQL) quietly carry on *without* TLS when given a context and a
server that does not offer TLS (``if ssl and server_capabilities & CLIENT.SSL``), login included;
so does any client talking to a man in the middle who strips the flag from the server's
greeting. :func:`install_plaintext_refusal` makes both refuse instead, before they send
anything; every context this module hands out installs it.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Callable, Literal

Mode = Literal["disabled", "required", "verify"]
MODES: tuple[str, ...] = ("disabled", "required", "verify")
CLIENT_SSL = 0x0800                 # capability flag of the server's greeting: it offers TLS
CR_SSL_CONNECTION_ERROR = 2026      # the MySQL client's own code for "SSL is required but ..."


class DatabaseConfigError(ValueError):
    """The MYSQL_SSL_* settings contradict each other or name files that cannot be used."""


def _no_passphrase() -> str:
    raise DatabaseConfigError("MYSQL_SSL_KEY is an encrypted private key: give it unencrypted "
                              "(openssl pkey -in KEY -out KEY.plain)")


@dataclass(frozen=True)
class MySqlTls:
    mode: Mode = "disabled"
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    verify_identity: bool = True

    @classmethod
    def of(cls, mode: str | None, ca: str | None, cert: str | None, key: str | None,
           verify_identity: bool) -> "MySqlTls":
        """From the settings: an unset mode is ``verify`` when a CA or a client certificate is given."""
        ca, cert, key = (value or None for value in (ca, cert, key))
        if mode is None:
            mode = "verify" if ca or cert or key else "disabled"
        tls = cls(mode=mode.lower(), ca=ca, cert=cert, key=key, verify_identity=verify_identity)
        tls.check()
        return tls

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    def check(self) -> None:
        """Refuse settings that cannot work, naming the settings (never their values)."""
        if self.mode not in MODES:
            raise DatabaseConfigError(f"MYSQL_SSL_MODE must be one of {', '.join(MODES)}")
        if (self.cert is None) != (self.key is None):
            raise DatabaseConfigError("MYSQL_SSL_CERT and MYSQL_SSL_KEY go together (a client certificate and "
                                      "its private key, for mTLS): set both or neither")
        if self.mode == "disabled" and (self.ca or self.cert):
            raise DatabaseConfigError("MYSQL_SSL_MODE=disabled, but MYSQL_SSL_CA, MYSQL_SSL_CERT or MYSQL_SSL_KEY "
                                      "is set: unset them, or set MYSQL_SSL_MODE to verify (or leave it unset)")
        if self.mode == "required" and self.ca:
            raise DatabaseConfigError("MYSQL_SSL_MODE=required encrypts without checking the server's certificate, "
                                      "so MYSQL_SSL_CA would be ignored: set MYSQL_SSL_MODE=verify (or leave it unset)")
        for name, path in (("MYSQL_SSL_CA", self.ca), ("MYSQL_SSL_CERT", self.cert), ("MYSQL_SSL_KEY", self.key)):
            if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise DatabaseConfigError(f"{name} names no readable file")
        if self.enabled:
            self._context()         # PEM files that do not load are refused with the settings

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
        if self.mode == "required":
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            try:
                context = ssl.create_default_context(cafile=self.ca)
            except ssl.SSLError as exc:
                raise DatabaseConfigError(f"MYSQL_SSL_CA could not be loaded ({exc.reason or exc}): it must be a "
                                          "PEM file of CA certificates") from None
            context.check_hostname = self.verify_identity
        if self.cert:
            try:
                context.load_cert_chain(self.cert, self.key, password=_no_passphrase)
            except ssl.SSLError as exc:
                raise DatabaseConfigError(f"MYSQL_SSL_CERT and MYSQL_SSL_KEY could not be loaded ({exc.reason or exc}):"
                                          " they must be PEM files, the key unencrypted and matching the certificate") \
                    from None
        return context

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
