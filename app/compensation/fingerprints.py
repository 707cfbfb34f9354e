"""Error groups: which dead letters share one cause.

After an outage thousands of dead letters say the same thing with different order numbers,
event ids and timings. A letter's fingerprint is 16 hex digits of the SHA-256 of what stays
the same across one outage:

* the reason (``effect_unavailable``; without the detail a record chose: ``unsupported_version:2`` and
  ``unsupported_version:x9`` are one ``unsupported_version``, the version stays in the letter),
* the effect the message names (``waybill``, ``sms``: the effect's name; every client starts its messages
  with ``<effect> for <order>:``),
* the service's HTTP status (``answered 503``, ``refused with 422``) or the error class
  (``ClientConnectorError``, ``TimeoutError``), read outside quoted values (a record's or a
  service's text cannot name them),
* the message with every value that differs between the letters of one outage replaced by
  a placeholder: order numbers, UUIDs, event ids, hex, IP:port, durations, quoted values and
  numbers. A letter whose message quotes a record's bytes as an excerpt (``key_mismatch``,
  ``header_not_utf8``) is grouped by its reason alone: no pattern can tell its record's text apart.

The ledger's message is all it has (the pipeline's errors carry their service's status and
class only in their text), so the parts are read back from it. The compensator's wording
around an error (``gave up after 3 redrives: effect_unavailable: ...``, or a redrive's
``effect_unavailable: ...``) is taken off first:
a letter dead-lettered by the batch and one given up by the compensator, for one cause, are
one group. Pure: the ledger computes it on every write of a reason or message, a migration
for the rows written before.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from app.pipeline.reasons import kind_of

# Wording the compensator and the batch put around an error's own text (compensation.judge_redrive,
# letters.same_request): not part of the cause.
WRAPPERS = (re.compile(r"^not retriable: "), re.compile(r"^gave up after \d+ redrives: "),
            re.compile(r"^same request as \S+, which ended: "))
EFFECT = re.compile(r"(?:^|: )([A-Za-z][A-Za-z0-9_-]{0,31}) for \S+?:")
STATUS = re.compile(r"\b(?:answered|refused with|status|HTTP) ?:? ?([1-5][0-9]{2})\b")
ERROR_CLASS = re.compile(r"\b([A-Z][A-Za-z0-9]*(?:Error|Exception|Timeout|Refused|Reset))\b")

# A value quoted in a message (repr of a str or bytes): data, never the cause's structure. The effect,
# status and error class are read outside such values, so a record or a service cannot choose them.
QUOTED = re.compile(r"b?'(?:[^'\\]|\\.)*'|b?\"(?:[^\"\\]|\\.)*\"")

# Most specific first: an order number holds digits a later rule would take apart.
NORMALISE = (
    (re.compile(r"\bORD-[0-9]{8}-[A-Za-z0-9]+\b"), "<order>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?:evt|event|ev)[-_:][A-Za-z0-9_-]+\b", re.IGNORECASE), "<event>"),
    (re.compile(r"\b[A-Za-z0-9._-]+\[[0-9]+\]@[0-9]+\b"), "<record>"),
    (re.compile(r"\b(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?::[0-9]{1,5})?\b|\[[0-9a-fA-F:]+\](?::[0-9]{1,5})?"), "<addr>"),
    (re.compile(r"\b[A-Za-z0-9.-]+:[0-9]{2,5}\b"), "<host:port>"),
    # 0x..., or a word of hex digits with a digit and a letter in it (not an English word like "added")
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]+\b"), "<hex>"),
    (QUOTED, "<value>"),
    (re.compile(r"\b[0-9]+(?:\.[0-9]+)?\s?(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b"), "<duration>"),
    (re.compile(r"[-+]?\b[0-9]+(?:\.[0-9]+)?\b"), "<n>"),
)
SPACES = re.compile(r"\s+")
UNKNOWN = "-"
# Reasons whose message quotes a record's bytes as an excerpt (app.pipeline.excerpts: readable, quotes
# not escaped), which no pattern can delimit: their letters are one group each, whatever the message.
OPAQUE = frozenset({"key_mismatch", "header_not_utf8"})


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """What a dead letter's fingerprint is made of."""

    reason: str
    effect: str            # UNKNOWN when the message names none
    detail: str            # the service's status or the error class; UNKNOWN when it says neither
    message: str           # normalised

    @property
    def fingerprint(self) -> str:
        key = "\x1f".join((self.reason, self.effect, self.detail, self.message))
        return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def unwrap(reason: str, message: str) -> str:
    """The error's own text: without the wording around it, nor the reason it starts with (a
    redrive's message is ``<reason>: <error>``)."""
    for wrapper in WRAPPERS:
        message = wrapper.sub("", message, count=1)
    return message[len(reason) + 2:] if message.startswith(f"{reason}: ") else message


def normalise(message: str) -> str:
    for pattern, placeholder in NORMALISE:
        message = pattern.sub(placeholder, message)
    return SPACES.sub(" ", message).strip()


def shape(reason: str, message: str | None) -> ErrorShape:
    """The parts of a dead letter's cause, read from its reason (without a detail the record chose:
    ``unsupported_version:<v>`` is ``unsupported_version``) and its message."""
    kind = kind_of(reason)
    if kind in OPAQUE:
        return ErrorShape(kind, UNKNOWN, UNKNOWN, "")
    text = unwrap(reason, message or "")
    bare = QUOTED.sub("<value>", text)
    effect = EFFECT.search(bare)
    status = STATUS.search(bare)
    error_class = ERROR_CLASS.search(bare)
    detail = status.group(1) if status else error_class.group(1) if error_class else UNKNOWN
    return ErrorShape(kind, effect.group(1).lower() if effect else UNKNOWN, detail, normalise(text)[:512])


def fingerprint(reason: str, message: str | None) -> str:
    """16 hex digits, the same for the dead letters of one cause (see the module docstring)."""
    return shape(reason, message).fingerprint
