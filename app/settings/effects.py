"""External effects: the services the pipeline calls (logistics, SMS), how long a call may take and
how many run at once, the claims (leases) and heartbeats that keep two workers from calling
for the same step, and the secret every step's idempotency token is derived from.

Each effect has settings of its own, nested under its name: ``EFFECTS__<EFFECT>__<SETTING>``
(``EFFECTS__WAYBILL__URL``, ``EFFECTS__SMS__LOOKUP``; :class:`EffectSettings`), read for any
effect name, so that a new effect needs no field here. Today's names stay as aliases
(``LOGISTICS_URL`` is ``EFFECTS__WAYBILL__URL``, ...: :data:`ALIASES`); the nested name wins
when both are set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from app.settings._base import Group, SettingsError, setting

# EFFECTS__<EFFECT>__<SETTING>: an effect's name is a lower-case identifier (``steps.Effect.name``).
NESTED = re.compile(r"^effects__([a-z][a-z0-9_]*?)__([a-z_]+)$")


class EffectSettings(Group):
    """One effect's settings, ``EFFECTS__<EFFECT>__<SETTING>``: which provider serves it and how to
    reach it. A setting left unset takes its alias (:data:`ALIASES`), else the default below."""

    TITLE = "One effect (EFFECTS__<EFFECT>__...)"

    provider: str | None = setting("EFFECTS__<EFFECT>__PROVIDER", None, shown="the effect's first provider",
        description="The provider module that serves the effect (`app/adapters/effects/`): `waybill` or "
                    "`express` for the waybill, `sms` for the SMS. Every process of a deployment must name the same "
                    "one: tokens sent to one provider mean nothing to another.")
    url: str | None = setting("EFFECTS__<EFFECT>__URL", None, shown="`http://127.0.0.1:8900`",
        description="The provider's base URL (aliases: `LOGISTICS_URL` for the waybill, `SMS_URL` for the SMS).")
    timeout_seconds: float | None = setting("EFFECTS__<EFFECT>__TIMEOUT_SECONDS", None, gt=0,
        shown="`EFFECT_TIMEOUT_SECONDS`",
        description="The longest one call of this effect may take (a lookup that follows a refused duplicate "
                    "included); at most `EFFECT_TIMEOUT_SECONDS`, which the lease is sized by.")
    lookup: bool | None = setting("EFFECTS__<EFFECT>__LOOKUP", None, shown="true for the SMS",
        description="The deployed provider answers its lookup (for a provider whose contract is `lookup`: "
                    "without it, a call in doubt goes to a person; alias `SMS_LOOKUP`).")
    lookup_settle_seconds: float | None = setting("EFFECTS__<EFFECT>__LOOKUP_SETTLE_SECONDS", None, ge=0,
        shown="30", description="How long after a call in doubt the provider is asked (alias "
                                "`SMS_LOOKUP_SETTLE_SECONDS`).")
    keys_kept_for_seconds: float | None = setting("EFFECTS__<EFFECT>__KEYS_KEPT_FOR_SECONDS", None, gt=0,
        shown="the provider's: 86400 (`waybill`), 259200 (`express`), 604800 (`sms`)",
        description="How long the deployed provider keeps an idempotency key (answers a repeated key or reference "
                    "as the first call's, or finds the call by it): set it from the provider's documentation or "
                    "contract, at most what it promises. A step whose first call that may have reached the provider "
                    "is older than this is never called again blindly: its provider's lookup decides (a receipt if "
                    "it finds the call, a person if not), or, without one, a person (`key_horizon_passed`). "
                    "`forever` only for a provider that truly keeps keys for ever ([A provider's key "
                    "horizon](exactly-once.md#a-providers-key-horizon)).")
    calls_per_second: float | None = setting("EFFECTS__<EFFECT>__CALLS_PER_SECOND", None, ge=0, shown="none",
        description="The provider's rate limit for this deployment's account, for the whole consumer group: each "
                    "worker calls at most its share (this rate over the live workers, counted from their "
                    "heartbeats). Set it a little under what the provider grants: a call over the limit is answered "
                    "429, waited for (its `Retry-After`, every call of the effect), never dead-lettered for it. "
                    "0 or unset: no limit but the provider's 429s.")
    concurrency: int | None = setting("EFFECTS__<EFFECT>__CONCURRENCY", None, ge=0, shown="`EFFECT_CONCURRENCY`",
        description="Calls of this effect in flight at once in one worker, under `EFFECT_CONCURRENCY` for all "
                    "effects (a provider that allows so many connections per account). 0 or unset: "
                    "`EFFECT_CONCURRENCY`.")
    key_id: str | None = setting("EFFECTS__<EFFECT>__KEY_ID", None, shown="none",
        description="The account (merchant, app key) a signing provider knows this deployment by.")
    secret: SecretStr | None = setting("EFFECTS__<EFFECT>__SECRET", None, shown="none",
        description="The secret a signing provider shares with this deployment (its requests are signed with "
                    "HMAC-SHA256 under it); kept like a password, never logged or shown. A provider that signs "
                    "refuses to start without it.")

    @field_validator("keys_kept_for_seconds", mode="before")
    @classmethod
    def _forever(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "forever":
            return float("inf")
        return value

    @field_validator("secret")
    @classmethod
    def _no_blank_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        stripped = value.get_secret_value().strip()
        return SecretStr(stripped) if stripped else None


# Today's names of some effects' settings: (effect, setting) -> the flat field that holds it.
ALIASES: Mapping[tuple[str, str], str] = {
    ("waybill", "url"): "logistics_url",
    ("sms", "url"): "sms_url",
    ("sms", "lookup"): "sms_lookup",
    ("sms", "lookup_settle_seconds"): "sms_lookup_settle_seconds",
}
DEFAULT_URL = "http://127.0.0.1:8900"
DEFAULT_SETTLE_SECONDS = 30.0


class EffectsSettings(Group):
    TITLE = "External effects"

    logistics_url: str = setting("LOGISTICS_URL", DEFAULT_URL,
        description='Logistics API base URL (alias of `EFFECTS__WAYBILL__URL`).')

    sms_url: str = setting("SMS_URL", DEFAULT_URL,
        description='SMS gateway base URL (alias of `EFFECTS__SMS__URL`).')

    sms_lookup: bool = setting("SMS_LOOKUP", True,
        description='The gateway answers `GET /v1/sms/{client_ref}`: an SMS whose outcome is unknown is verified '
                    'instead of failed for a person (alias of `EFFECTS__SMS__LOOKUP`).')

    sms_lookup_settle_seconds: float = setting("SMS_LOOKUP_SETTLE_SECONDS", DEFAULT_SETTLE_SECONDS, ge=0,
        description='How long after such a call the gateway is asked (a request still on its way must have landed); '
                    "counted from the call's recorded end, or, when its worker died before recording it, from the end"
                    " of its claim's lease (a claim may call until its lease is nearly over). Alias of "
                    "`EFFECTS__SMS__LOOKUP_SETTLE_SECONDS`.")

    per_effect: dict[str, EffectSettings] = Field(
        default_factory=dict, json_schema_extra={"env": "EFFECTS__<EFFECT>__<SETTING>", "shown": "none"},
        description="Each effect's own settings, by effect name ([One effect](#one-effect)).")

    timeout_seconds: float = setting("EFFECT_TIMEOUT_SECONDS", 3.0, gt=0,
        description='The longest one external call may take, its connection included.')

    connect_timeout_seconds: float = setting("EFFECT_CONNECT_TIMEOUT_SECONDS", 1.0, gt=0,
        description='The longest a call waits for its connection (a free one of its pool, or a new one: TCP and TLS),'
                    ' within `EFFECT_TIMEOUT_SECONDS` (at most half of it is used). A call that got none sent '
                    'nothing: it is retried as not delivered, never looked up or left to a person as "maybe sent" '
                    '([An SMS whose outcome is unknown](compensation-and-console.md#an-sms-whose-outcome-is-unknown)).')

    concurrency: int = setting("EFFECT_CONCURRENCY", 128, ge=1,
        description="External calls in flight per worker for the order agent's batches, all batches in flight "
                    'together; the compensator (its drain, its agent, bulk jobs) has as many of its own, on a pool of'
                    ' its own (64 before this release: the lease check now counts both batches in flight, and 64 '
                    'would need `LEASE_SECONDS` 98).')

    breaker_hold_records: int = setting("BREAKER_HOLD_RECORDS", 10_000, ge=0,
        description="Records a worker holds, before their first try, while their effect's provider breaker is open "
                    '([A dead provider costs nothing to the rest](exactly-once.md#provider-limits)): they '
                    'wait in their orders for the breaker to close, up to their batch\'s deadline, and go on then '
                    "(dead-lettered `provider_unavailable` if it is still open). Not counted in the records in flight,"
                    " so the other orders keep flowing; but the commit waits for them, so a kill -9 replays up to "
                    'this many more. Past it, records meet the breaker at once (dead-lettered). `0`: none held.')

    lease_seconds: float = setting("LEASE_SECONDS", 60.0, gt=0,
        description='How long a claim on a pending effect is exclusive; must cover the calls in flight, checked at '
                    'start-up: at least `ceil(BATCHES_IN_FLIGHT x BATCH_SIZE / EFFECT_CONCURRENCY) x '
                    'EFFECT_TIMEOUT_SECONDS + LEASE_MARGIN_SECONDS` (the batches in flight share one limit of calls, '
                    "so the later batch's last call may wait for all the others), twice the calls with `SMS_LOOKUP` "
                    "on (a lookup, then a send: 50 s with the defaults); and the same for the compensator's drain "
                    'round, dead-letter batch and bulk chunk together (`COMPENSATION_DRAIN_BATCH_SIZE` + '
                    '`COMPENSATOR_BATCH_SIZE` + `BULK_CHUNK_SIZE`: 14 s with the defaults).')

    lease_margin_seconds: float = setting("LEASE_MARGIN_SECONDS", 2.0, ge=0,
        description='A call starts only if its claim has `EFFECT_TIMEOUT_SECONDS` plus this much lease left (checked '
                    'before the lookup and again before the send); otherwise the key is claimed again.')

    worker_heartbeat_seconds: float = setting("WORKER_HEARTBEAT_SECONDS", 2.0, gt=0,
        description='How often every worker writes its heartbeat (`t_worker`), on database connections of its own: a '
                    'beat starts this often whether the ones before it have landed or not (one stuck on a hung '
                    'connection costs nothing; on a slow database they land late instead of not at all), each '
                    "bounded by `WORKER_DEAD_AFTER_SECONDS` ([A dead worker's claims]"
                    "(compensation-and-console.md#a-dead-workers-claims)).")

    worker_dead_after_seconds: float = setting("WORKER_DEAD_AFTER_SECONDS", 15.0, gt=0,
        description='A worker whose last heartbeat is older than this is taken for dead: the claims it held (`t_idem`'
                    " steps, ledger rows) end at once for other workers, not at their lease's end; and a worker "
                    'starts no call that could outlast it from its own last heartbeat. At least 2 x '
                    '`WORKER_HEARTBEAT_SECONDS` + `EFFECT_TIMEOUT_SECONDS` + `LEASE_MARGIN_SECONDS` + 1 (checked at '
                    'start-up: room for a whole call between two heartbeats, one of them slow).')

    token_secret: SecretStr | None = setting("IDEM_TOKEN_SECRET", None, shown='**required**',
        description="The deployment's secret: every step's idempotency token (the logistics `Idempotency-Key`, the "
                    "SMS `client_ref`) is an HMAC of the step's key under it ([Idempotency "
                    'tokens](compensation-and-console.md#idempotency-tokens)). The same value for every process of a deployment, another one for'
                    ' every other deployment; kept like a password (never logged or shown). Without it no process '
                    'starts (exit 78, a line that says how to make one); `make run`, `make test` and the benchmarks '
                    'set their own.')

    def effect(self, name: str) -> ResolvedEffect:
        """Effect ``name``'s settings: its nested ones, else their aliases, else the defaults."""
        nested = self.per_effect.get(name) or EffectSettings()

        def pick(key: str, default: Any) -> Any:
            value = getattr(nested, key)
            if value is not None:
                return value
            alias = ALIASES.get((name, key))
            return getattr(self, alias) if alias is not None else default

        timeout = min(pick("timeout_seconds", self.timeout_seconds), self.timeout_seconds)
        return ResolvedEffect(
            name=name, provider=nested.provider, url=pick("url", DEFAULT_URL), timeout_seconds=timeout,
            connect_timeout_seconds=min(self.connect_timeout_seconds, timeout / 2),
            lookup=bool(pick("lookup", False)),
            lookup_settle_seconds=float(pick("lookup_settle_seconds", DEFAULT_SETTLE_SECONDS)),
            key_id=nested.key_id, secret=nested.secret, keys_kept_for_seconds=nested.keys_kept_for_seconds,
            calls_per_second=float(nested.calls_per_second or 0.0),
            concurrency=min(nested.concurrency or self.concurrency, self.concurrency))

    def lookups(self) -> list[str]:
        """The effects whose lookup is on (a call in doubt may take two calls: a lookup, then the send)."""
        names = {effect for effect, _ in ALIASES} | set(self.per_effect)
        return sorted(name for name in names if self.effect(name).lookup)

    @property
    def connect_timeout(self) -> float:
        """EFFECT_CONNECT_TIMEOUT_SECONDS, at most half of the call's: the rest is the request's."""
        return min(self.connect_timeout_seconds, self.timeout_seconds / 2)

    def token_key(self) -> bytes:
        """The key of every step's idempotency token (``app.pipeline.tokens.StepTokens``): IDEM_TOKEN_SECRET.

        Raises :class:`SettingsError` when it is unset: random tokens, or tokens under a
        secret everybody knows, would send a second waybill and a second SMS for every step
        a failover or a restore made the store forget."""
        if self.token_secret is None:
            raise SettingsError(
                "IDEM_TOKEN_SECRET is not set: every step's idempotency token is derived from it, so that a "
                "replay after the database lost rows (a failover, a restore from backup) asks the services "
                "the same question. Set it to a long random value (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'), the same for every process of this deployment, another "
                "one for each other deployment, and keep it like a password.")
        return self.token_secret.get_secret_value().encode("utf-8")

    @field_validator("per_effect", mode="before")
    @classmethod
    def _effect_names(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            for name in value:
                if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)):
                    raise ValueError(f"EFFECTS__{str(name).upper()}__...: {name!r} is not an effect's name "
                                     "(a lower-case identifier, as app/pipeline/steps.py declares it)")
        return value

    @model_validator(mode="after")
    def _check(self) -> EffectsSettings:
        # A worker that beats must still be able to call: between two heartbeats (and one that is
        # slow) there must be room for a whole call before its heartbeat is too old.
        needed = 2 * self.worker_heartbeat_seconds + self.timeout_seconds + self.lease_margin_seconds + 1
        if self.worker_dead_after_seconds < needed:
            raise ValueError(
                f"WORKER_DEAD_AFTER_SECONDS={self.worker_dead_after_seconds:g} leaves no room for a call: it must be at "
                f"least 2 x WORKER_HEARTBEAT_SECONDS={self.worker_heartbeat_seconds:g} + EFFECT_TIMEOUT_SECONDS="
                f"{self.timeout_seconds:g} + LEASE_MARGIN_SECONDS={self.lease_margin_seconds:g} + 1: {needed:g} s")
        # Surrounding spaces (a copy and paste, a YAML value) are no part of a secret; "" is none.
        if self.token_secret is not None:
            value = self.token_secret.get_secret_value().strip()
            self.token_secret = SecretStr(value) if value else None
        return self


class ResolvedEffect(Group):
    """What one effect's provider is built with (:meth:`EffectsSettings.effect`)."""

    name: str
    provider: str | None
    url: str
    timeout_seconds: float
    connect_timeout_seconds: float
    lookup: bool
    lookup_settle_seconds: float
    key_id: str | None
    secret: SecretStr | None
    calls_per_second: float = 0.0
    concurrency: int = 0
    keys_kept_for_seconds: float | None = None      # None: the provider's declaration; inf: for ever


def nested_environment(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``EFFECTS__<EFFECT>__<SETTING>`` variables (names lower-cased) by effect, then setting."""
    found: dict[str, dict[str, str]] = {}
    for name, value in environ.items():
        match = NESTED.match(name)
        if match:
            found.setdefault(match.group(1), {})[match.group(2)] = value
    return found
