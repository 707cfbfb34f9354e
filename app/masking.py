"""What a viewer (``WEB_READ_TOKEN``, the CLI without ``--unmasked``) sees of personal data.

The shapes, the same everywhere:

* a phone number keeps its last 4 digits: ``+8613800000000`` -> ``***0000``; one of fewer than
  8 digits shows as ``***`` alone;
* an address keeps its first 3 characters: ``1 Test Road`` -> ``1 T***``; one of 6 characters or
  fewer shows as ``***`` alone.

Which strings are which:

* a field whose name says phone (``phone``, ``mobile``, ``tel``, ``msisdn``, ``*phone*``) or
  address (``*address*``, ``addr``, ``street``), at any depth of an answer or of a record's JSON;
* in free text (messages, errors, notes, header values, any other string field): every run of 7
  or more digits (with spaces, dots, dashes, brackets or slashes between them) is a phone number,
  and every phone or address met in a field of the same answer is replaced wherever it appears.
  Order numbers (``ORD-YYYYMMDD-...``) and ISO dates and times are left alone; identifiers
  (``VERBATIM``) get only the second rule;
* bytes that are not UTF-8 (shown base64 to an operator) are withheld;
* a record value is masked field by field when it is JSON; one that is not UTF-8 JSON, or that the
  dead letter carries only the start of (``truncated``), is withheld: ``{"withheld": <why>,
  "bytes": n}``, since an address in it cannot be found.

Pure: no I/O. A masked answer is built on the server; the whole value never leaves it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MASK = "***"
PHONE_NAMES = re.compile(r".*(phone|mobile).*|tel|msisdn", re.IGNORECASE)
ADDRESS_NAMES = re.compile(r".*address.*|addr|street", re.IGNORECASE)
# Identifiers and names of things: shown whole (a known phone or address inside one is still replaced).
VERBATIM = frozenset({"order_no", "biz_key", "event_id", "type", "status", "reason", "step", "action",
                      "from_status", "to_status", "actor", "role", "src_topic", "consumer_group", "idem_token",
                      "payload_hash", "fingerprint", "owner", "worker_id", "waybill_no", "occurred_at", "path",
                      "record_key_sha256", "record_value_sha256"})
WITHHELD_BYTES = "(bytes that are not UTF-8: withheld from a viewer)"
# Scanned left to right: an order number or an ISO date/time is consumed whole before its
# digits could pass for a phone number.
_TEXT = re.compile(
    r"(?P<keep>ORD-[0-9]{8}-[A-Za-z0-9]+"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)?)"
    r"|(?P<phone>(?<![\w+])\+?[0-9](?:[ ().\-/]{0,2}[0-9]){6,}(?!\w))")


def mask_phone(phone: str) -> str:
    digits = re.sub(r"[^0-9]", "", phone)
    return MASK + digits[-4:] if len(digits) >= 8 else MASK


def mask_address(address: str) -> str:
    address = address.strip()
    return address[:3] + MASK if len(address) > 6 else MASK


def mask_text(text: str, known: dict[str, str] | None = None) -> str:
    """Free text with every phone-shaped run of digits masked, and every ``known`` value
    (whole phone or address -> its masked form) replaced."""
    for whole, masked in (known or {}).items():
        text = text.replace(whole, masked)
    return _TEXT.sub(lambda m: m.group("keep") or mask_phone(m.group("phone")), text)


class Masker:
    """Masks one answer: first :meth:`collect` every phone and address in it (and in the
    records it carries), then :meth:`mask` replaces them wherever they appear."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}

    def collect(self, doc: Any) -> Masker:
        if isinstance(doc, dict):
            for name, value in doc.items():
                if isinstance(value, str) and len(value.strip()) >= 4:
                    if PHONE_NAMES.fullmatch(str(name)):
                        self.known[value] = mask_phone(value)
                    elif ADDRESS_NAMES.fullmatch(str(name)):
                        self.known[value] = mask_address(value)
                else:
                    self.collect(value)
        elif isinstance(doc, (list, tuple)):
            for value in doc:
                self.collect(value)
        return self

    def mask(self, doc: Any, name: str | None = None) -> Any:
        """A masked copy of ``doc`` (dicts, lists, strings; anything else as it is)."""
        if isinstance(doc, dict):
            return {key: self.mask(value, str(key)) for key, value in doc.items()}
        if isinstance(doc, (list, tuple)):
            return [self.mask(value, name) for value in doc]
        if isinstance(doc, int) and not isinstance(doc, bool) and name is not None and PHONE_NAMES.fullmatch(name):
            return mask_phone(str(doc))          # a phone number sent as a JSON number
        if not isinstance(doc, str):
            return doc
        if name == "base64":          # bytes that are not text: nothing in them can be found, so none is shown
            return WITHHELD_BYTES
        if name is not None and PHONE_NAMES.fullmatch(name):
            return mask_phone(doc)
        if name is not None and ADDRESS_NAMES.fullmatch(name):
            return mask_address(doc)
        if name in VERBATIM:
            return self._replace_known(doc)
        return mask_text(doc, self.known)

    def _replace_known(self, text: str) -> str:
        for whole, masked in self.known.items():
            text = text.replace(whole, masked)
        return text

    def value(self, value: bytes | None, *, truncated: bool) -> dict | None:
        """A record's value for a viewer: its JSON masked field by field, or withheld."""
        if value is None:
            return None
        parsed = parse(value)
        if truncated:
            return withheld(value, "the dead letter carries only the start of this value")
        if parsed is None:
            return withheld(value, "the value is not UTF-8 JSON")
        return {"text": json.dumps(self.mask(parsed), ensure_ascii=False), "bytes": len(value), "masked": True}


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


def mask_letter(detail: dict, value: bytes | None) -> dict:
    """A dead letter's detail (``record`` with its value as :func:`app.render.readable`) for a
    viewer; ``value`` is the record's raw value."""
    masker = Masker()
    masker.collect(detail)
    masker.collect(parse(value))
    record = dict(detail.get("record") or {})
    record.pop("value", None)
    masked = masker.mask({**detail, "record": record})
    masked["record"]["value"] = masker.value(value, truncated=bool(detail.get("truncated")))
    masked["masked"] = True
    return masked


def mask_answer(answer: dict) -> dict:
    """Any other answer (an order's timeline, a list, a ``t_idem`` row) for a viewer."""
    masked = Masker().collect(answer).mask(answer)
    masked["masked"] = True
    return masked
