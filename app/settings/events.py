"""Events: how records carry the events (the envelope and where each field is), the upstream names
of the types this processor handles, the schema versions it reads, and what it does with the types
it does not handle (skipped, and the types other teams publish that look like handled ones).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator, model_validator

from app.settings._base import Group, setting

# The types this processor handles (``app.pipeline.events.EventType``; a unit test keeps them equal).
HANDLED = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM", "ORDER_CANCEL")
SOURCE = re.compile(r"(key|timestamp|value)|(header|field|ce):.+")

_SOURCES = {"event_id": "EVENT_ID_FROM", "type": "EVENT_TYPE_FROM", "order_no": "EVENT_ORDER_NO_FROM",
            "occurred_at": "EVENT_TIME_FROM", "data": "EVENT_DATA_FROM", "schema_version": "EVENT_VERSION_FROM"}


class EventsSettings(Group):
    TITLE = "Events"

    envelope: Literal["auto", "native", "cloudevents", "outbox"] = setting("EVENT_ENVELOPE", "auto",
        description='How records carry events: `native` (this project\'s JSON), `cloudevents` (binary mode: `ce_*` '
                    'headers and the data as the value; structured mode: `application/cloudevents+json`), `outbox` '
                    '(a Debezium outbox EventRouter: key = the order number, `id` header = the event id, '
                    '`eventType` header = the type, value = the payload); `auto`: CloudEvents when the record says '
                    'so (a `ce_specversion` header, that content type, or a `specversion` attribute), native '
                    'otherwise ([Envelopes](exactly-once.md#envelopes)).')

    id_from: str = setting("EVENT_ID_FROM", "",
        description='Where the event id is, when not where the envelope puts it: `header:<name>`, `field:<name>` (of '
                    'the body), `ce:<attribute>`, `key`, `value` or `timestamp`; empty: the envelope\'s place.')

    type_from: str = setting("EVENT_TYPE_FROM", "",
        description='Where the event type is (the same forms as `EVENT_ID_FROM`).')

    order_no_from: str = setting("EVENT_ORDER_NO_FROM", "",
        description='Where the order number is (the record\'s key must equal it).')

    time_from: str = setting("EVENT_TIME_FROM", "",
        description='Where the time the event occurred is (RFC 3339; `timestamp`: the record\'s timestamp).')

    data_from: str = setting("EVENT_DATA_FROM", "",
        description='Where the event\'s data object is (`value`: the whole body, as the outbox\'s payload).')

    version_from: str = setting("EVENT_VERSION_FROM", "",
        description='Where the schema version is (absent on a record: version 1).')

    type_names: str = setting("EVENT_TYPES", "",
        description='Upstream type names of the types this processor handles, `name=ORDER_CREATED,...` (its own '
                    'names are always read too), e.g. `com.shop.order.created=ORDER_CREATED`.')

    versions: str = setting("EVENT_SCHEMA_VERSIONS", "1",
        description='The schema versions this processor reads, comma-separated (a schema URI counts by its last '
                    'segment, `.../v2` is `2`); another is dead-lettered `unsupported_version:<v>`.')

    unhandled: Literal["skip", "dead_letter"] = setting("UNHANDLED_EVENT_TYPES", "skip",
        description='A type this processor does not handle: `skip` (finished as it is, counted in '
                    '`order_events_skipped_total`, listed by type on `/skipped/`, logged once a minute per type) or '
                    '`dead_letter` (`unknown_type`, for a person). Either way a type that looks like a handled one '
                    'is dead-lettered `lookalike_type` (unless `FOREIGN_EVENT_TYPES` names it).')

    foreign: str = setting("FOREIGN_EVENT_TYPES", "",
        description='Types other teams publish on this topic that this processor skips knowingly, exact names, '
                    'comma-separated (`ORDER_SHIPPED,ORDER_CANCEL_REQUESTED`). A type that looks like a handled one '
                    '(`ORDER_CANCEL_REQUESTED` contains `ORDER_CANCEL`) is dead-lettered `lookalike_type` unless '
                    'named here; a type named here is counted under its own name in `order_events_skipped_total` '
                    '(any other as `other`) and is never a new skipped type (the alert `NewEventTypeSkipped`) '
                    '([Types not handled](exactly-once.md#types-not-handled)).')

    new_skipped_type_seconds: float = setting("NEW_SKIPPED_TYPE_SECONDS", 604800.0, gt=0,
        description='How long a type this consumer group skipped for the first time counts as new: '
                    '`order_skipped_types_new` counts it, and the alert `NewEventTypeSkipped` fires, for that long '
                    'after its first record (7 days: a weekend and a holiday). Naming it in `FOREIGN_EVENT_TYPES` '
                    'ends it at once.')

    @field_validator("id_from", "type_from", "order_no_from", "time_from", "data_from", "version_from")
    @classmethod
    def _a_source(cls, value: str) -> str:
        value = value.strip()
        if value and SOURCE.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not a source: key, timestamp, value, header:<name>, field:<name> or "
                             "ce:<attribute>")
        return value

    @field_validator("type_names")
    @classmethod
    def _type_names(cls, value: str) -> str:
        type_names(value)
        return value

    @field_validator("versions")
    @classmethod
    def _versions(cls, value: str) -> str:
        if not any(v.strip() for v in value.split(",")):
            raise ValueError("name at least one version")
        return value

    @model_validator(mode="after")
    def _foreign_types_are_not_read(self) -> EventsSettings:
        read = set(HANDLED) | set(type_names(self.type_names))
        both = sorted(read & foreign_types(self.foreign))
        if both:
            raise ValueError(f"FOREIGN_EVENT_TYPES names {', '.join(both)}, which this processor reads "
                             "(a handled type, or an upstream name in EVENT_TYPES): it cannot also skip it")
        return self

    def sources(self) -> dict[str, str]:
        """The fields whose place differs from the envelope's: native name -> source."""
        fields = {"event_id": self.id_from, "type": self.type_from, "order_no": self.order_no_from,
                  "occurred_at": self.time_from, "data": self.data_from, "schema_version": self.version_from}
        return {k: v for k, v in fields.items() if v}


def foreign_types(text: str) -> set[str]:
    """``FOREIGN_EVENT_TYPES`` as a set of names."""
    return set(filter(None, (name.strip() for name in text.split(","))))


def type_names(text: str) -> dict[str, str]:
    """``EVENT_TYPES`` as upstream name -> handled type."""
    names: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        upstream, sep, ours = (s.strip() for s in pair.partition("="))
        if not sep or not upstream or ours not in HANDLED:
            raise ValueError(f"{pair!r} is not <upstream name>=<one of {', '.join(HANDLED)}>")
        names[upstream] = ours
    return names
