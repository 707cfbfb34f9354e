"""Every setting of the processor, read once from the environment, grouped by concern.

Nothing else in the project reads ``os.environ``: components receive the values they need from a
:class:`Settings` instance, one group each (``settings.kafka.broker``, ``settings.database.url``,
...). Every field keeps the environment variable it always had (``KAFKA_BROKER``, ``MYSQL_URL``,
...: declared on the field with :func:`app.settings._base.setting`), read case-insensitively.

The root holds the process's identity (``APP_ID``, ``WORKER_ID``: every concern uses it), the
groups, and the rules and derived values that span groups (the lease must cover the calls of
the batches, the drain and the bulk chunk; the longest batch must stay under the rebalance
timeout). The settings build nothing of the adapters: those build themselves from their group
(``KafkaConnection.from_settings(settings.kafka)``, ``MySqlTls.from_settings(settings.database)``).

Keyword arguments and :meth:`Settings.model_copy` updates may also name a setting by its flat
name, the environment variable in lower case (``Settings(order_event_partitions=2)``): it lands
in its group; a name that is no setting is refused, never ignored.

The configuration reference (docs/configuration.md) is rendered from the fields'
descriptions by ``python -m app.settings.reference``.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.exits import EXIT_CONFIG
from app.settings._base import Group, SettingsError, env_name, setting
from app.settings.batches import BatchesSettings
from app.settings.bulk import BulkSettings
from app.settings.compensation import CompensationSettings
from app.settings.database import DatabaseSettings
from app.settings.effects import NESTED, EffectSettings, EffectsSettings, nested_environment
from app.settings.events import EventsSettings
from app.settings.kafka import KafkaSettings
from app.settings.operations import ROW_BYTES, OperationsSettings
from app.settings.reconcile import ReconcileSettings
from app.settings.tracing import TracingSettings
from app.settings.web import WebSettings

__all__ = ["ROW_BYTES", "BatchesSettings", "BulkSettings", "CompensationSettings", "DatabaseSettings",
           "EffectSettings", "EffectsSettings", "EventsSettings", "KafkaSettings", "OperationsSettings", "ReconcileSettings", "Settings", "SettingsError", "TracingSettings",
           "WebSettings",
           "env_names", "explain", "get_settings", "get_settings_or_exit"]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class _Environment(PydanticBaseSettingsSource):
    """Each field's environment variable (any case), into its group; values as strings, parsed by the fields."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError      # __call__ reads every field at once

    def __call__(self) -> dict[str, Any]:
        environ = {name.lower(): value for name, value in os.environ.items()}
        found: dict[str, Any] = {}
        for (group, name), env in env_names().items():
            if env.lower() in environ:
                if group is None:
                    found[name] = environ[env.lower()]
                else:
                    found.setdefault(group, {})[name] = environ[env.lower()]
        nested = nested_environment(environ)            # EFFECTS__<EFFECT>__<SETTING>
        if nested:
            found.setdefault("effects", {})["per_effect"] = nested
        return found


class Settings(BaseSettings):
    """Typed configuration: the identity, one group per concern, and the rules that span groups."""

    model_config = SettingsConfigDict(env_file=None, case_sensitive=False, extra="forbid")

    app_id: str = setting("APP_ID", "order-event-processor", min_length=1, max_length=255,
        description='Faust app id = Kafka consumer group (at most 255 characters).')

    worker_id: str = setting("WORKER_ID", default_factory=_default_worker_id, min_length=1, max_length=64, shown='`<hostname>-<pid>`',
        description='Names this process in `t_idem.owner` and dead-letter headers (at most 64 characters).')

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    effects: EffectsSettings = Field(default_factory=EffectsSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    batches: BatchesSettings = Field(default_factory=BatchesSettings)
    compensation: CompensationSettings = Field(default_factory=CompensationSettings)
    bulk: BulkSettings = Field(default_factory=BulkSettings)
    operations: OperationsSettings = Field(default_factory=OperationsSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Environment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _flat_names_into_groups(cls, data: Any) -> Any:
        """``order_event_partitions=2`` (a keyword argument) is ``kafka.partitions``; unknown names stay
        for ``extra="forbid"`` to refuse."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        flat = _flat_names()
        for key in [key for key in data if key.lower() in flat]:
            group, name = flat[key.lower()]
            values = data.get(group, {})
            values = dict(values.__dict__ if isinstance(values, Group) else values)
            values[name] = data.pop(key)
            data[group] = values
        for key in [key for key in data if NESTED.match(key.lower())]:      # effects__waybill__url=...
            match = NESTED.match(key.lower())
            assert match is not None
            values = data.get("effects", {})
            values = dict(values.__dict__ if isinstance(values, Group) else values)
            per_effect = {name: dict(v.__dict__ if isinstance(v, Group) else v)
                          for name, v in values.get("per_effect", {}).items()}
            per_effect.setdefault(match.group(1), {})[match.group(2)] = data.pop(key)
            values["per_effect"] = per_effect
            data["effects"] = values
        return data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Settings:
        """A copy (not validated, like pydantic's) with ``update``, whose keys are root fields (a group, an
        identity field) or flat names (``order_event_partitions``): each lands in its group. Any other
        key raises ValueError. Every group is copied, so that changing the copy's leaves this one alone."""
        flat = _flat_names()
        own: dict[str, Any] = {}
        into: dict[str, dict[str, Any]] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in (update or {}).items():
            if key in type(self).model_fields:
                own[key] = value
            elif key in flat:
                into.setdefault(flat[key][0], {})[flat[key][1]] = value
            elif (match := NESTED.match(key)) is not None:
                nested.setdefault(match.group(1), {})[match.group(2)] = value
            else:
                raise ValueError(f"{key!r} is no setting (a group, APP_ID/WORKER_ID, or a variable in lower case)")
        for group in GROUPS:
            base = own.get(group, getattr(self, group))
            own[group] = base.model_copy(update=into.get(group), deep=deep)
        if nested:      # validated, one effect at a time: its own fields only
            per_effect = dict(own["effects"].per_effect)
            for name, values in nested.items():
                before = per_effect[name].model_dump() if name in per_effect else {}
                per_effect[name] = EffectSettings.model_validate({**before, **values})
            own["effects"] = own["effects"].model_copy(update={"per_effect": per_effect})
        return super().model_copy(update=own, deep=deep)

    # -- rules and values that span groups --------------------------------------------------

    @property
    def drain_batch_size(self) -> int:
        """COMPENSATION_DRAIN_BATCH_SIZE, at most BATCH_SIZE (the lease is checked for a batch of that)."""
        return min(self.compensation.drain_batch_size, self.batches.size)

    def longest_batch_seconds(self) -> float:
        """The longest one batch may take, every wait counted:

        * phase 1's calls all start inside the lease of its T1, so they end by then
          (``LEASE_SECONDS``); phase 2 retries until ``BATCH_DEADLINE_SECONDS`` and may then
          still wait for a lookup and a send in flight (2 x ``EFFECT_TIMEOUT_SECONDS``);
        * the dead letters: their ledger rows, then the send (``DLQ_SEND_TIMEOUT_SECONDS``);
        * an unreachable database is waited out for ``INFRA_RETRY_BUDGET_SECONDS`` from its
          first failure, which a statement may take a transaction's timeout to see, and a
          transaction begun at the end of the budget may take one more.
        """
        work = max(self.effects.lease_seconds, self.batches.deadline_seconds + 2 * self.effects.timeout_seconds)
        return (work + self.batches.dlq_send_timeout_seconds + self.database.infra_retry_budget_seconds
                + 2 * self.database.transaction_timeout_seconds)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        self._check_lease()
        self._check_timeouts()
        return self

    def _check_lease(self) -> None:
        """Every call of the batches in flight must fit in one lease. A call starts only with its
        timeout plus the margin of lease left (a call that would not fit is not made; the key is
        claimed again instead), so settings that make that the rule rather than the exception are
        refused here.

        * The order agent works ``BATCHES_IN_FLIGHT`` batches at once (with ``FETCH_BATCHES``), each
          of up to ``BATCH_SIZE`` calls, through one limiter of ``EFFECT_CONCURRENCY`` calls: the
          last call of the later batch may wait for every call of the other before it starts.
        * The compensator's processor has a limiter of its own, shared by a drain round
          (``COMPENSATION_DRAIN_BATCH_SIZE``), a batch of the dead-letter agent
          (``COMPENSATOR_BATCH_SIZE``) and a chunk of a bulk job (``BULK_CHUNK_SIZE``).

        Each call may take ``EFFECT_TIMEOUT_SECONDS``; a call whose outcome is unknown, or any SMS in
        a recovery window, is looked up first (``SMS_LOOKUP``), then sent: two calls."""
        effects, batch = self.effects, self.batches
        lookups = effects.lookups()
        calls = 2 if lookups else 1
        batches = batch.in_flight if batch.fetch else 1
        compensator, chunk = self.compensation.batch_size, min(self.bulk.chunk_size, batch.size)
        for in_flight, what in (
                (batches * batch.size,
                 f"{batches} batch{'es' if batches > 1 else ''} of BATCH_SIZE={batch.size} calls"
                 + (f" (BATCHES_IN_FLIGHT={batches})" if batches > 1 else "")),
                (self.drain_batch_size + compensator + chunk,
                 f"the compensator's drain round, dead-letter batch and bulk chunk (COMPENSATION_DRAIN_BATCH_SIZE="
                 f"{self.drain_batch_size} + COMPENSATOR_BATCH_SIZE={compensator} + BULK_CHUNK_SIZE="
                 f"{chunk} calls)")):
            rounds = math.ceil(in_flight / effects.concurrency)
            needed = rounds * calls * effects.timeout_seconds + effects.lease_margin_seconds
            if effects.lease_seconds < needed:
                raise ValueError(
                    f"LEASE_SECONDS={effects.lease_seconds:g} cannot cover the calls in flight: {what}, "
                    f"EFFECT_CONCURRENCY={effects.concurrency} at a time, take up to {rounds} x "
                    f"{'2 (a lookup, then the send: the lookup of ' + ', '.join(lookups) + ' is on) x ' if calls == 2 else ''}"
                    f"EFFECT_TIMEOUT_SECONDS={effects.timeout_seconds:g}, plus LEASE_MARGIN_SECONDS="
                    f"{effects.lease_margin_seconds:g}: {needed:g} s. Raise LEASE_SECONDS to at least "
                    f"{math.ceil(needed)}, or raise EFFECT_CONCURRENCY, or lower BATCH_SIZE, BATCHES_IN_FLIGHT "
                    "or EFFECT_TIMEOUT_SECONDS.")

    def _check_timeouts(self) -> None:
        longest = self.longest_batch_seconds()
        kafka = self.kafka
        if longest >= kafka.rebalance_timeout_seconds:
            raise ValueError(
                f"a batch may take up to {longest:g} s: max(LEASE_SECONDS={self.effects.lease_seconds:g}, "
                f"BATCH_DEADLINE_SECONDS={self.batches.deadline_seconds:g} + 2 x EFFECT_TIMEOUT_SECONDS="
                f"{self.effects.timeout_seconds:g}) + DLQ_SEND_TIMEOUT_SECONDS="
                f"{self.batches.dlq_send_timeout_seconds:g} + INFRA_RETRY_BUDGET_SECONDS="
                f"{self.database.infra_retry_budget_seconds:g} + 2 x DB_TRANSACTION_TIMEOUT_SECONDS="
                f"{self.database.transaction_timeout_seconds:g}; it must stay under "
                f"BROKER_REBALANCE_TIMEOUT_SECONDS={kafka.rebalance_timeout_seconds:g}: a rebalance waits "
                "for the batch in flight, and a member that does not rejoin in time is evicted and its batch "
                "done again by another. Raise BROKER_REBALANCE_TIMEOUT_SECONDS or lower one of the others.")
        if kafka.revoke_grace_seconds >= kafka.rebalance_timeout_seconds:
            raise ValueError(
                f"KAFKA_REVOKE_GRACE_SECONDS={kafka.revoke_grace_seconds:g} must stay under "
                f"BROKER_REBALANCE_TIMEOUT_SECONDS={kafka.rebalance_timeout_seconds:g}: a member still waiting for "
                "its records when the group gives up on it is evicted")
        if self.batches.deadline_seconds >= kafka.session_timeout_seconds:
            raise ValueError(
                f"BATCH_DEADLINE_SECONDS={self.batches.deadline_seconds:g} must stay under "
                f"BROKER_SESSION_TIMEOUT_SECONDS={kafka.session_timeout_seconds:g}")


GROUPS: dict[str, type[Group]] = {name: field.annotation for name, field in Settings.model_fields.items()
                                  if isinstance(field.annotation, type) and issubclass(field.annotation, Group)}


@lru_cache(maxsize=1)
def env_names() -> dict[tuple[str | None, str], str]:
    """(group or None for the root, field) -> its environment variable, for every setting (the
    effects' nested settings, ``EFFECTS__<EFFECT>__<SETTING>``, are read by pattern: not here)."""
    names: dict[tuple[str | None, str], str] = {}
    for name, field in Settings.model_fields.items():
        if name in GROUPS:
            for inner, inner_field in GROUPS[name].model_fields.items():
                if "<" not in env_name(inner_field):
                    names[(name, inner)] = env_name(inner_field)
        else:
            names[(None, name)] = env_name(field)
    return names


@lru_cache(maxsize=1)
def _flat_names() -> dict[str, tuple[str, str]]:
    """The flat name of every grouped setting (its variable in lower case) -> (group, field)."""
    return {env.lower(): (group, name) for (group, name), env in env_names().items() if group is not None}


def explain(exc: ValidationError) -> str:
    """One line per problem, naming the environment variable; never the values given."""
    names = env_names()
    flat = _flat_names()
    lines = []
    for error in exc.errors(include_input=False, include_url=False, include_context=False):
        loc = [str(part) for part in error["loc"]]
        if loc[:2] == ["effects", "per_effect"]:
            where = "EFFECTS__" + "__".join(part.upper() for part in loc[2:4])
        elif len(loc) >= 2 and (loc[0], loc[1]) in names:
            where = names[(loc[0], loc[1])]                 # a field of a group
        elif len(loc) == 1 and loc[0] in GROUPS:
            where = ""                                      # a group's rule: its message names the variables
        elif len(loc) == 1 and (None, loc[0]) in names:
            where = names[(None, loc[0])]
        elif loc and loc[-1].lower() in flat:
            where = loc[-1].upper()
        else:
            where = ".".join(loc).upper()
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use.

    Raises :class:`SettingsError` with the problems and none of the values."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(f"the settings cannot work: {explain(exc)}") from None


def get_settings_or_exit() -> Settings:
    """For entry points: the settings, or one line on stderr and exit 78 (EX_CONFIG)."""
    try:
        return get_settings()
    except SettingsError as exc:
        print(f"order-event-processor: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
