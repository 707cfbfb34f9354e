"""Idempotency tokens derived from the step, not invented by the retrier.

A step's token (the logistics ``Idempotency-Key``, the SMS ``client_ref``) is the
HMAC-SHA256 of its ``t_idem`` key under the deployment's secret (``IDEM_TOKEN_SECRET``),
hex, cut to :data:`TOKEN_CHARS` characters (128 bits: the shape the random tokens had,
within the key-length limits of the usual providers). The same step therefore asks the
same question whatever the store forgot: a ``t_idem`` row lost in a failover or a
restore from backup gets the same token on the replay, the logistics API answers with
the waybill it issued already, and the SMS gateway's lookup finds the message sent.

The secret keeps two deployments apart: a staging and a production deployment that share
a provider account, or two teams that share a gateway, must never derive the same key
for different requests. A row keeps the token it was claimed with; a changed secret only
changes the tokens of steps not claimed yet (and so defeats the replay protection of the
rows the store may have lost before the change).
"""

from __future__ import annotations

import hashlib
import hmac

TOKEN_CHARS = 32


class StepTokens:
    """``tokens(key)``: the token of the step whose ``t_idem`` key is ``key``."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ValueError("an empty secret derives tokens anybody can compute")
        self._secret = secret

    def __call__(self, key: str) -> str:
        return hmac.new(self._secret, key.encode("utf-8"), hashlib.sha256).hexdigest()[:TOKEN_CHARS]

    def __repr__(self) -> str:         # never the secret
        return "StepTokens(<secret>)"
