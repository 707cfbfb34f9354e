"""Per-person tokens: ``WEB_TOKENS_FILE``, so that the audit names who acted and a leaver's token is
revoked alone.

The file holds one token per line, ``name role sha256-hex``::

    # who      role      SHA-256 of the token (hex)
    alice      operator  9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    vera       viewer    60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752

A name is 1-64 letters, digits or ``_.@+-``; a role ``operator`` or ``viewer``; ``#`` starts a
comment. Only the token's SHA-256 is kept: tokens are long random strings (``faust -A app
web-token NAME ROLE`` makes one, :func:`new_line`), never a password a person chose, so a hash
without salt or stretching is as good as the token is long. Two lines with the same hash are
refused (whose would it be?); one person may hold two lines (a token being replaced).

The file is read again when it changes (its modification time, size or inode, looked at on each
request that brings a token): a line removed revokes that token at the next request, no restart.
A file that cannot be read at start-up stops the worker (exit 78, ``app.web.views``); one broken
later refuses every per-person token, with the reason in the log, until it is fixed (the shared
tokens still work): a broken file must never keep a revoked token alive. The web views ask it who
a token is (``app.web.http``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from app.render import ACTOR
from app.settings import Settings

log = logging.getLogger(__name__)

ROLES = ("operator", "viewer")
DIGEST = re.compile(r"[0-9a-f]{64}")
TOKEN_BYTES = 32                 # 256 random bits: 43 characters, URL-safe


class TokensFileError(ValueError):
    """``WEB_TOKENS_FILE`` cannot be read, or a line of it is not ``name role sha256-hex``."""


@dataclass(frozen=True, slots=True)
class Person:
    name: str
    role: str                    # operator or viewer
    digest: str                  # the token's SHA-256, hex


def digest(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


def parse(text: str) -> tuple[Person, ...]:
    """The people of a tokens file's ``text``; :class:`TokensFileError` naming the first bad line
    (by number, never repeating its content: a token pasted by mistake must not reach a log)."""
    people: list[Person] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 3:
            raise TokensFileError(f"line {number}: {len(fields)} fields; a line is 'name role sha256-hex'")
        name, role, hashed = fields[0], fields[1], fields[2].lower()
        if not ACTOR.fullmatch(name):
            raise TokensFileError(f"line {number}: a name is 1-64 letters, digits or _.@+-")
        if role not in ROLES:
            raise TokensFileError(f"line {number}: the role is operator or viewer")
        if not DIGEST.fullmatch(hashed):
            raise TokensFileError(f"line {number}: the third field is the token's SHA-256 in 64 hex digits, "
                                  "never the token itself")
        if hashed in seen:
            raise TokensFileError(f"line {number}: the same token hash as line {seen[hashed]}")
        seen[hashed] = number
        people.append(Person(name, role, hashed))
    return tuple(people)


class TokensFile:
    """One tokens file, read again whenever it changes."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._stamp: tuple | None = None
        self._people: tuple[Person, ...] = ()
        self._error: str | None = None

    def people(self) -> tuple[Person, ...]:
        """Who holds a token now; :class:`TokensFileError` while the file cannot be read."""
        try:
            info = os.stat(self.path)
            stamp: tuple = (info.st_mtime_ns, info.st_size, info.st_ino)
        except OSError as exc:
            stamp = ("unreadable", exc.errno)
        if stamp != self._stamp:
            self._stamp = stamp
            self._read()
        if self._error is not None:
            raise TokensFileError(self._error)
        return self._people

    def names(self) -> frozenset[str]:
        return frozenset(person.name for person in self.people())

    def _read(self) -> None:
        try:
            self._people, self._error = parse(self.path.read_text(encoding="utf-8")), None
        except (OSError, UnicodeDecodeError, TokensFileError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._people, self._error = (), f"WEB_TOKENS_FILE {self.path}: {why}"
            log.error("%s: every per-person token is refused until it is fixed", self._error)
            return
        roles = [person.role for person in self._people]
        log.info("WEB_TOKENS_FILE %s read: %d operator and %d viewer tokens", self.path, roles.count("operator"),
                 roles.count("viewer"))


_files: dict[str, TokensFile] = {}


def tokens_file(settings: Settings) -> TokensFile | None:
    """The deployment's tokens file (one reader per path and process), or None without one."""
    path = settings.web.tokens_file
    if path is None:
        return None
    if path not in _files:
        _files[path] = TokensFile(path)
    return _files[path]


def new_line(name: str, role: str) -> tuple[str, str]:
    """A new random token for ``name`` as ``role``, and its line for the tokens file."""
    if not ACTOR.fullmatch(name):
        raise ValueError("a name is 1-64 letters, digits or _.@+-")
    if role not in ROLES:
        raise ValueError("the role is operator or viewer")
    token = secrets.token_urlsafe(TOKEN_BYTES)
    return token, f"{name} {role} {digest(token.encode())}"
