"""Signed requests and enveloped answers, as most providers in this trade want them.

:class:`HmacSigner` signs a request with HMAC-SHA256 under a secret the provider shares with the
deployment, over the fields the provider names (the method, the path, a timestamp, a nonce, the
SHA-256 of the body), joined by newlines, and puts the key id, the timestamp, the nonce and the
signature in the headers the provider names. :class:`Envelope` reads answers of the shape
``{"code": 0, "message": "...", "data": {...}}`` and sorts their codes into what the pipeline
does with them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson
from pydantic import SecretStr

SIGNED_FIELDS = ("method", "path", "timestamp", "nonce", "body_sha256")


class CredentialsRefused(RuntimeError):
    """The provider refused the deployment's signature or account: its settings are wrong."""


class SigningNotConfigured(ValueError):
    """A provider that signs its requests has no key id or no secret."""


@dataclass(frozen=True, slots=True)
class HmacSigner:
    key_id: str
    secret: SecretStr = field(repr=False)
    fields: Sequence[str] = SIGNED_FIELDS
    key_header: str = "X-Key-Id"
    timestamp_header: str = "X-Timestamp"
    nonce_header: str = "X-Nonce"
    signature_header: str = "X-Signature"
    clock: Callable[[], float] = field(default=time.time, repr=False)

    @classmethod
    def from_settings(cls, effect: str, key_id: str | None, secret: SecretStr | None, **headers: Any) -> HmacSigner:
        """The signer of ``effect``'s provider; :class:`SigningNotConfigured` naming the settings to set."""
        missing = [name for name, value in (("KEY_ID", key_id), ("SECRET", secret)) if not value]
        if missing:
            raise SigningNotConfigured(
                f"the provider of {effect} signs its requests: set "
                + " and ".join(f"EFFECTS__{effect.upper()}__{name}" for name in missing)
                + " (the account and the secret the provider gave this deployment)")
        assert key_id is not None and secret is not None
        return cls(key_id, secret, **headers)

    def string_to_sign(self, values: Mapping[str, str]) -> bytes:
        return "\n".join(values[name] for name in self.fields).encode()

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        timestamp, nonce = str(int(self.clock())), secrets.token_hex(16)
        values = {"method": method.upper(), "path": path, "timestamp": timestamp, "nonce": nonce,
                  "body_sha256": hashlib.sha256(body).hexdigest(), "key_id": self.key_id}
        signature = hmac.new(self.secret.get_secret_value().encode(), self.string_to_sign(values),
                             hashlib.sha256).hexdigest()
        return {self.key_header: self.key_id, self.timestamp_header: timestamp, self.nonce_header: nonce,
                self.signature_header: signature}


class Verdict(Enum):
    OK = "ok"
    DUPLICATE = "duplicate"          # the reference was seen before: look the first up
    NOT_FOUND = "not_found"          # a lookup found nothing under the reference
    RETRY_LATER = "retry_later"      # the provider asks to be called again (busy, rate limited)
    UNAUTHORISED = "unauthorised"    # the signature or the account was refused: the settings are wrong
    REFUSED = "refused"              # a business refusal: for a person


@dataclass(frozen=True, slots=True)
class Reply:
    code: Any
    message: str
    data: Any
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Envelope:
    """The provider's answer shape and what its codes mean. A code it does not list is a refusal."""

    ok: Collection[Any] = (0,)
    duplicate: Collection[Any] = ()
    not_found: Collection[Any] = ()
    retry_later: Collection[Any] = ()
    unauthorised: Collection[Any] = ()
    code_field: str = "code"
    message_field: str = "message"
    data_field: str = "data"

    def read(self, body: bytes) -> Reply | None:
        """The answer's code, message and data; None when ``body`` is no envelope (a proxy's page)."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict) or self.code_field not in doc:
            return None
        code = doc[self.code_field]
        message = doc.get(self.message_field)
        return Reply(code, message if isinstance(message, str) else "", doc.get(self.data_field), self.verdict(code))

    def verdict(self, code: Any) -> Verdict:
        for verdict, codes in ((Verdict.OK, self.ok), (Verdict.DUPLICATE, self.duplicate),
                               (Verdict.NOT_FOUND, self.not_found), (Verdict.RETRY_LATER, self.retry_later),
                               (Verdict.UNAUTHORISED, self.unauthorised)):
            if code in codes:
                return verdict
        return Verdict.REFUSED
