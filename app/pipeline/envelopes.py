"""How a record carries an event: the envelopes upstreams publish, read into the native fields.

Three envelopes, each a default place for every field the processor needs, any of which a setting
may move (``EVENT_ID_FROM``, ...):

==============  =========================  ============================  =======================
field           native                     CloudEvents (binary/struct.)  Debezium outbox
==============  =========================  ============================  =======================
event id        ``field:event_id``         ``ce:id``                     ``header:id``
type            ``field:type``             ``ce:type``                   ``header:eventType``
order number    ``field:order_no``         ``ce:subject``                ``key``
time            ``field:occurred_at``      ``ce:time``                   ``timestamp``
data            ``field:data``             ``ce:data``                   ``value``
version         ``field:schema_version``   ``ce:dataschema``             ``field:schema_version``
==============  =========================  ============================  =======================

A source is ``key`` (the record's key), ``timestamp`` (the record's, as RFC 3339 UTC),
``header:<name>``, ``value`` (the body: the native document, the outbox payload, the CloudEvent's
data), ``field:<name>`` (a top-level field of the body) or ``ce:<attribute>`` (the ``ce_<attribute>``
header in binary mode, the document's attribute in structured mode; ``ce:data`` is the data).

The reader only finds the fields; :func:`app.pipeline.events.decode` checks them the same way for
every envelope, so the dedup keys, payload hashes and dead letters do not depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

from app.pipeline.errors import MalformedEvent

FIELDS = ("event_id", "type", "order_no", "occurred_at", "data", "schema_version")
CE_JSON = "application/cloudevents+json"


class Envelope(StrEnum):
    AUTO = "auto"                  # CloudEvents when the record says so, native otherwise
    NATIVE = "native"
    CLOUDEVENTS = "cloudevents"
    OUTBOX = "outbox"


DEFAULTS: dict[Envelope, dict[str, str]] = {
    Envelope.NATIVE: {"event_id": "field:event_id", "type": "field:type", "order_no": "field:order_no",
                      "occurred_at": "field:occurred_at", "data": "field:data",
                      "schema_version": "field:schema_version"},
    Envelope.CLOUDEVENTS: {"event_id": "ce:id", "type": "ce:type", "order_no": "ce:subject",
                           "occurred_at": "ce:time", "data": "ce:data", "schema_version": "ce:dataschema"},
    Envelope.OUTBOX: {"event_id": "header:id", "type": "header:eventType", "order_no": "key",
                      "occurred_at": "timestamp", "data": "value", "schema_version": "field:schema_version"},
}


def check_source(text: str) -> str:
    """``text`` if it is a source this module reads, else ValueError saying what is."""
    kind, _, name = text.partition(":")
    if (kind in ("key", "timestamp", "value") and not name) or (kind in ("header", "field", "ce") and name):
        return text
    raise ValueError(f"{text!r} is not a source: key, timestamp, value, header:<name>, field:<name> or ce:<attribute>")


@dataclass(frozen=True, slots=True)
class Reading:
    """How this processor reads records: the envelope, where each field comes from (only what differs
    from the envelope's defaults), the upstream names of the types it handles, the schema versions it
    reads, whether a type it does not handle is skipped (counted) or dead-lettered, and the types other
    teams publish that it skips knowingly (``FOREIGN_EVENT_TYPES``: skipped even when they look like a
    handled one, and counted under their own name)."""

    envelope: Envelope = Envelope.AUTO
    sources: Mapping[str, str] = field(default_factory=dict)
    type_names: Mapping[str, str] = field(default_factory=dict)     # upstream name -> ORDER_*
    versions: frozenset[str] = frozenset({"1"})
    skip_unhandled: bool = True
    foreign: frozenset[str] = frozenset()

    def native_only(self) -> bool:
        """Every record is read as the native envelope, from its default places (the fast path)."""
        return self.envelope is Envelope.NATIVE and not self.sources

    def envelope_of(self, headers: Sequence[tuple[str, bytes | None]], doc: Any) -> Envelope:
        if self.envelope is not Envelope.AUTO:
            return self.envelope
        for name, value in headers:
            low = name.lower()
            if low == "ce_specversion" or (low == "content-type" and value is not None
                                           and value.lower().startswith(CE_JSON.encode())):
                return Envelope.CLOUDEVENTS
        if isinstance(doc, dict) and "specversion" in doc and "event_id" not in doc:
            return Envelope.CLOUDEVENTS
        return Envelope.NATIVE

    def read(self, key: bytes | None, doc: Any, headers: Sequence[tuple[str, bytes | None]],
             timestamp_ms: int | None) -> tuple[dict[str, Any], dict[str, str], str | None]:
        """The native document this record stands for (fields found, absent ones left out), for each
        field the source it came from (for the errors' messages), and the body's own ``type`` when the
        type was read from elsewhere (a ``ce_type`` header): what the decoder checks the two against."""
        envelope = self.envelope_of(headers, doc)
        places = {**DEFAULTS[envelope], **self.sources}
        structured = isinstance(doc, dict) and not _has_header(headers, "ce_specversion")
        if envelope is Envelope.OUTBOX and isinstance(doc, str):
            doc = _json(doc, "the outbox payload (a JSON string)")       # a payload column sent as a string
        body = doc
        if envelope is Envelope.CLOUDEVENTS and structured:
            if "data_base64" in doc:
                raise MalformedEvent("a structured CloudEvent with data_base64: this processor reads JSON data",
                                     reason="bad_field:data")
            body = doc.get("data")
        found: dict[str, Any] = {}
        for name in FIELDS:
            value = _take(places[name], key, doc, body, headers, timestamp_ms, structured)
            if value is not None:
                found[name] = value
        own = body.get("type") if places["type"] != "field:type" and isinstance(body, dict) else None
        return found, places, own if type(own) is str else None


def reading_of(envelope: str, sources: Mapping[str, str], type_names: Mapping[str, str], versions: str,
               unhandled: str, foreign: str = "") -> Reading:
    """The reading the settings describe (``EVENT_ENVELOPE``, ``EVENT_*_FROM``, ``EVENT_TYPES``,
    ``EVENT_SCHEMA_VERSIONS``, ``UNHANDLED_EVENT_TYPES``, ``FOREIGN_EVENT_TYPES``)."""
    return Reading(envelope=Envelope(envelope), sources={k: check_source(v) for k, v in sources.items()},
                   type_names=dict(type_names),
                   versions=frozenset(v for v in (version_of(p) for p in versions.split(",")) if v),
                   skip_unhandled=unhandled == "skip",
                   foreign=frozenset(filter(None, (name.strip() for name in foreign.split(",")))))


def version_of(raw: Any) -> str:
    """The version an event names: an int or a string, or a schema URI whose last segment is the
    version (``https://schemas.example/order-created/v2`` is ``2``); a leading ``v`` is dropped."""
    text = str(raw).strip() if isinstance(raw, (int, str)) and not isinstance(raw, bool) else ""
    if "/" in text:
        text = text.rstrip("/").rsplit("/", 1)[-1]
    if text[:1] in ("v", "V"):
        text = text[1:]
    return text


def _take(source: str, key: bytes | None, doc: Any, body: Any, headers: Sequence[tuple[str, bytes | None]],
          timestamp_ms: int | None, structured: bool) -> Any:
    kind, _, name = source.partition(":")
    if kind == "key":
        return None if key is None else _text(key, "the record's key")
    if kind == "timestamp":
        return None if timestamp_ms is None else (
            datetime.fromtimestamp(timestamp_ms / 1000, UTC).isoformat(timespec="milliseconds"))
    if kind == "value":
        return body
    if kind == "field":
        return body.get(name) if isinstance(body, dict) else None
    if kind == "header":
        return _header(headers, name)
    # ce:<attribute>
    if name == "data":
        return body
    if structured:
        return doc.get(name) if isinstance(doc, dict) else None
    return _header(headers, "ce_" + name)


def _has_header(headers: Sequence[tuple[str, bytes | None]], name: str) -> bool:
    return any(h.lower() == name for h, _ in headers)


def _header(headers: Sequence[tuple[str, bytes | None]], name: str) -> str | None:
    """The last header ``name`` (case-insensitive, as HTTP and CloudEvents treat them), as text."""
    value = None
    low = name.lower()
    for h, v in headers:
        if h.lower() == low:
            value = v
    return None if value is None else _text(value, f"header {name}")


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedEvent(f"{what} is not UTF-8", reason="not_utf8") from None


def _json(text: str, what: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise MalformedEvent(f"{what} is not JSON: {exc}", reason="not_json") from None
