"""What a viewer (``WEB_READ_TOKEN``, the CLI without ``--unmasked``) sees of personal data.

The shapes, the same everywhere:

* a phone number, or any long number, keeps its last 4 digits: ``+8613800000000`` -> ``***0000``;
  one of fewer than 8 digits shows as ``***`` alone;
* an address keeps its first 3 characters: ``1 Test Road`` -> ``1 T***``; one of 6 characters or
  fewer shows as ``***`` alone;
* an e-mail address keeps the first character of its name: ``jane@example.com`` -> ``j***@***``;
* an idempotency token (a step's ``idem_token``, the SMS ``client_ref``) keeps its last 4
  characters: ``***9f3a``. Whoever holds a whole token can ask the service what was done under
  it (the SMS lookup answers with the message and its phone number).

Which strings are which:

* a field whose name says phone (``phone``, ``mobile``, ``tel``, ``msisdn``, ``*phone*``),
  address (``*address*``, ``addr``, ``street``), e-mail (``*email*``, ``*e-mail*``) or token
  (``idem_token``, ``client_ref``, ``idempotency_key``), at any depth of an answer or of a
  record's JSON;
* every other string (messages, errors, notes, header values, the keys of a record's JSON):
  every phone number, address, e-mail address and token met in a field of the same answer, or
  belonging to an order the answer names (its ``t_order`` row, read for the viewer's answer
  even when the answer does not show it), replaced wherever it appears, in whatever encoding
  (``app.personal.decoded``: plain, Python's repr of bytes or text, JSON's ``\\u`` escapes,
  percent-encoding, HTML entities, quoted-printable, full-width digits, escaped twice), an
  address also by its parts (between commas, after a Chinese street number) and by its start
  where a text ends in it (a column's limit or an excerpt's ``…`` cut it there)
  (``app.personal.known``); and
  every phone number, long number, e-mail address, token and street address found by its shape
  (``app.personal.shapes``). Order numbers (``ORD-YYYYMMDD-...``), ISO dates and times, UUIDs,
  IP addresses and hashes stay readable. Identifiers (``VERBATIM``) get only the known values
  replaced: a pattern must never change the name of a thing a viewer looks up. In a record's
  JSON only the event's ``event_id``, ``order_no``, ``type`` and ``occurred_at`` are
  identifiers: its data is free text whatever a field is called (a cancel's ``reason`` is what
  the customer wrote).

Street addresses by shape are found conservatively, since a pattern that also takes words a
viewer needs would make the views useless: in English, a house number, at most four words and
a street word (``12 Main Street``, ``221B Baker St.``, with ``Flat 4`` after it), where the
street words that are also plain English (``Way``, ``Place``, ``Drive``) count only
capitalised; in Chinese, a road and its number (``建国路88号``) or a city or province and its
district (``北京市朝阳区``), with the Chinese characters around them (``华贸中心3座1203室``).
An address in another form (``Flat 4, Block B`` alone, a village name) is found only when it
is a known value: the order's own, or a field of the answer.

Bytes that are not UTF-8 (shown base64 to an operator) are withheld. A record value is masked
field by field when it is JSON; one that is not UTF-8 JSON, or that the dead letter carries only
the start of (``truncated``), is withheld: ``{"withheld": <why>, "bytes": n}``.

Pure: no I/O (the caller reads the orders' contacts). A masked answer is built on the server;
the whole value never leaves it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from app.personal.finder import Finder, mask_text
from app.personal.shapes import mask_address, mask_email, mask_phone, mask_token
from app.render import readable

__all__ = ["VERBATIM", "WITHHELD_BYTES", "Masker", "mask_address", "mask_answer", "mask_email", "mask_letter",
           "mask_phone", "mask_text", "mask_token", "order_numbers"]

NAMES = {"phone": re.compile(r".*(phone|mobile).*|tel|msisdn", re.IGNORECASE),
         "address": re.compile(r".*address.*|addr|street", re.IGNORECASE),
         "email": re.compile(r".*e-?mail.*", re.IGNORECASE),
         "token": re.compile(r"idem_token|client_ref|idempotency[_-]?key", re.IGNORECASE)}
MASKS = {"phone": mask_phone, "address": mask_address, "email": mask_email, "token": mask_token}
# Identifiers and names of things: shown whole (a known value inside one is still replaced).
VERBATIM = frozenset({"order_no", "biz_key", "event_id", "type", "status", "reason", "step", "action",
                      "from_status", "to_status", "actor", "role", "src_topic", "consumer_group",
                      "payload_hash", "fingerprint", "owner", "worker_id", "waybill_no", "occurred_at", "path",
                      "record_key_sha256", "record_value_sha256"})
# In a record's JSON only the event contract's identifiers: its ``data`` is free text whatever a
# field is called (an ORDER_CANCEL's ``data.reason`` is what the customer said).
RECORD_VERBATIM = frozenset({"event_id", "order_no", "type", "occurred_at"})
WITHHELD_BYTES = "(bytes that are not UTF-8: withheld from a viewer)"
ORDER_NUMBER = re.compile(r"ORD-[0-9]{8}-[A-Za-z0-9]{1,40}")
MAX_ORDERS = 200          # the longest list a view answers


def kind_of(name: str | None) -> str | None:
    """What a field named ``name`` holds: ``phone``, ``address``, ``email``, ``token``, or None."""
    if name is None:
        return None
    return next((kind for kind, names in NAMES.items() if names.fullmatch(name)), None)


class Masker:
    """Masks one answer: first :meth:`collect` every phone, address, e-mail address and token in
    it (and in the records it carries, and its orders' contacts), then :meth:`mask` replaces
    them wherever they appear."""

    def __init__(self, contacts: Iterable[Mapping[str, Any]] = ()) -> None:
        self.known: dict[str, str] = {}          # value -> its kind
        self._finder: Finder | None = None
        for contact in contacts:
            self.collect(contact)

    def collect(self, doc: Any) -> Masker:
        if isinstance(doc, dict):
            for name, value in doc.items():
                kind = kind_of(str(name))
                if isinstance(value, str) and len(value.strip()) >= 4 and kind is not None:
                    self.known[value.strip()] = kind
                    self._finder = None
                else:
                    self.collect(value)
        elif isinstance(doc, (list, tuple)):
            for value in doc:
                self.collect(value)
        return self

    @property
    def finder(self) -> Finder:
        if self._finder is None:
            self._finder = Finder(self.known)
        return self._finder

    def mask(self, doc: Any, name: str | None = None, *, verbatim: frozenset[str] = VERBATIM) -> Any:
        """A masked copy of ``doc`` (dicts, lists, strings; anything else as it is); the fields
        named in ``verbatim`` are identifiers, which get only the known values replaced."""
        if isinstance(doc, dict):
            return {self.finder.mask(key) if isinstance(key, str) else key: self.mask(value, str(key), verbatim=verbatim)
                    for key, value in doc.items()}
        if isinstance(doc, (list, tuple)):
            return [self.mask(value, name, verbatim=verbatim) for value in doc]
        if isinstance(doc, (bytes, bytearray)):        # as an answer shows bytes: text, or base64 (withheld)
            return self.mask(readable(bytes(doc)), verbatim=verbatim)
        kind = kind_of(name)
        if isinstance(doc, int) and not isinstance(doc, bool) and kind == "phone":
            return mask_phone(str(doc))          # a phone number sent as a JSON number
        if not isinstance(doc, str):
            return doc
        if name == "base64":          # bytes that are not text: nothing in them can be found, so none is shown
            return WITHHELD_BYTES
        if kind is not None:
            return MASKS[kind](doc)
        return self.finder.mask(doc, shapes=name not in verbatim)

    def value(self, value: bytes | None, *, truncated: bool) -> dict | None:
        """A record's value for a viewer: its JSON masked field by field, or withheld."""
        if value is None:
            return None
        parsed = parse(value)
        if truncated:
            return withheld(value, "the dead letter carries only the start of this value")
        if parsed is None:
            return withheld(value, "the value is not UTF-8 JSON")
        return {"text": json.dumps(self.mask(parsed, verbatim=RECORD_VERBATIM), ensure_ascii=False), "bytes": len(value), "masked": True}


def parse(value: bytes | None) -> Any:
    """The JSON in ``value``, or None when it is not UTF-8 JSON."""
    if value is None:
        return None
    try:
        return json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def withheld(value: bytes, why: str) -> dict:
    return {"withheld": f"{why}; personal data in it cannot be masked, so a viewer does not see it "
                        "(an operator does)", "bytes": len(value), "masked": True}


def order_numbers(*docs: Any) -> list[str]:
    """The order numbers ``docs`` name anywhere (fields, keys, messages, a record's bytes, cut
    short or not): whose contacts a viewer's answer must know to mask them. At most ``MAX_ORDERS``."""
    found: set[str] = set()

    def walk(doc: Any) -> None:
        if len(found) >= MAX_ORDERS:
            return
        if isinstance(doc, dict):
            for key, value in doc.items():
                walk(key)
                walk(value)
        elif isinstance(doc, (list, tuple)):
            for value in doc:
                walk(value)
        elif isinstance(doc, (bytes, bytearray)):
            walk(bytes(doc).decode("utf-8", "replace"))
        elif isinstance(doc, str) and "ORD-" in doc:
            found.update(ORDER_NUMBER.findall(doc))

    for doc in docs:
        walk(doc)
    return sorted(found)[:MAX_ORDERS]


def mask_letter(detail: dict, value: bytes | None, contacts: Iterable[Mapping[str, Any]] = ()) -> dict:
    """A dead letter's detail (``record`` with its value as :func:`app.render.readable`) for a
    viewer; ``value`` is the record's raw value, ``contacts`` the phone and address of the
    orders it names (:func:`order_numbers`)."""
    masker = Masker(contacts)
    masker.collect(detail)
    masker.collect(parse(value))
    record = dict(detail.get("record") or {})
    record.pop("value", None)
    masked = masker.mask({**detail, "record": record})
    masked["record"]["value"] = masker.value(value, truncated=bool(detail.get("truncated")))
    masked["masked"] = True
    return masked


def mask_answer(answer: dict, contacts: Iterable[Mapping[str, Any]] = ()) -> dict:
    """Any other answer (an order's timeline, a list, a ``t_idem`` row) for a viewer;
    ``contacts`` as for :func:`mask_letter`."""
    masked = Masker(contacts).collect(answer).mask(answer)
    masked["masked"] = True
    return masked
