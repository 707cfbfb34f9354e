"""The external effects' clients, registered by effect name (``steps.Effect.name``).

:class:`EffectClients` is the pipeline's ``EffectClient`` port: it hands each call to
the client registered under its effect's name and counts it. Every effect a pipeline
declares must have a client: one without is an error at start-up, not at the first
event that needs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import aiohttp

from app.observability.metrics import EFFECT_CALLS, EFFECT_SECONDS
from app.pipeline.errors import EffectBadReceipt, EffectNotDelivered, EffectUnavailable, PipelineError, RateLimited
from app.pipeline.model import EffectJob
from app.pipeline.ports import Receipt
from app.pipeline.steps import Contract, Effect, effects_used
from tables.schema import t_waybill_receipt

WAYBILL_NO_MAX = t_waybill_receipt.c.waybill_no.type.length


def http_session(connections: int, trace_configs: Sequence[aiohttp.TraceConfig] = ()) -> aiohttp.ClientSession:
    """An HTTP session for one caller of the services: ``connections`` kept-alive connections, as
    many as the caller lets calls be in flight (``EFFECT_CONCURRENCY``), so that a call waits for
    its caller's slot (before its lease is checked), never for a pooled connection inside its own
    timeout; and nothing a service call does not use: no cookie jar (a service that sets cookies
    gets none back; each request would otherwise filter the jar by its URL). ``trace_configs``: the
    tracing instrumentation's, when tracing is on (``app.observability.tracing``)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                 cookie_jar=aiohttp.DummyCookieJar(), trace_configs=list(trace_configs) or None)


def call_timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    """A call's time limits: ``total`` for all of it, ``connect`` for getting its connection (a free
    pooled one, or a new one: TCP and TLS). Running out of ``connect`` raises
    ``aiohttp.ConnectionTimeoutError`` before a byte of the request was written, which the clients
    report as not delivered; only the request that was sent can end with an unknown outcome."""
    return aiohttp.ClientTimeout(total=total, connect=min(connect, total))


@contextmanager
def transport_errors(at: str, timeout: aiohttp.ClientTimeout,
                     in_doubt: Callable[[str], PipelineError] = EffectUnavailable) -> Iterator[None]:
    """A call's connection and timeout troubles, read the same way by every client: no connection
    (refused, or none within ``timeout.connect``) means nothing was sent, so a retry is safe;
    no answer in time, or a connection lost after the request, is ``in_doubt`` (a client whose
    provider neither replays nor refuses a repeated call says so: the SMS). A
    :class:`PipelineError` the call raised itself goes through as it is."""
    try:
        yield
    except PipelineError:
        raise
    except aiohttp.ClientConnectorError as exc:
        raise _down(EffectNotDelivered(f"{at}: {exc}")) from None
    except aiohttp.ConnectionTimeoutError:      # before TimeoutError, which it is too
        raise _down(EffectNotDelivered(f"{at}: no connection within {timeout.connect:g}s; not sent")) from None
    except TimeoutError:
        raise _down(in_doubt(f"{at}: no answer within {timeout.total:g}s")) from None
    except aiohttp.ClientError as exc:
        raise _down(in_doubt(f"{at}: {exc.__class__.__name__}: {exc}")) from None


def _down(error: PipelineError) -> PipelineError:
    """``error`` marked as the provider's failure (what its breaker counts)."""
    error.provider_down = True
    return error


RETRY_AFTER_DEFAULT = 1.0      # a 429 without a Retry-After the client can read: a second
RETRY_AFTER_MAX = 60.0         # a longer one is the provider's outage, not a rate: the breaker's business


def rate_limited(at: str, headers: Mapping[str, str]) -> RateLimited:
    """The provider's 429: "not yet", for the seconds its ``Retry-After`` says (a number of seconds,
    or an HTTP date), a second when it says nothing readable, at most a minute."""
    said = headers.get("Retry-After", "").strip()
    wait: float | None = None
    if said:
        try:
            wait = float(said)
        except ValueError:
            try:
                wait = (parsedate_to_datetime(said) - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                wait = None
    if wait is None or wait != wait:     # unreadable, or NaN
        wait = RETRY_AFTER_DEFAULT
    wait = min(max(wait, 0.0), RETRY_AFTER_MAX)
    return RateLimited(f"{at}: answered 429 (rate limited), Retry-After {said or 'not given'}; not done, "
                       f"called again in {wait:g}s", wait_seconds=wait)


def waybill_number(at: str, said: str, value: Any, *, answer: str = "") -> str:
    """The waybill number a provider answered (``said``: how, e.g. ``200`` or ``code 0``), checked
    to fit the receipt: missing is a glitch worth a retry (the same token asks again and gets the
    same waybill); not a string, or longer than the receipt holds, is a bad receipt. ``answer``:
    an excerpt of the answer, for the message when the number is missing."""
    if value is None or value == "":
        raise EffectUnavailable(f"{at}: {said} without a waybill_no" + (f": {answer}" if answer else ""))
    if not isinstance(value, str):
        raise EffectBadReceipt(f"{at}: {said} with a waybill_no that is not a string: {value!r:.100}")
    if len(value) > WAYBILL_NO_MAX:
        raise EffectBadReceipt(f"{at}: {said} with a waybill_no of {len(value)} characters, longer than "
                               f"the {WAYBILL_NO_MAX} the receipt holds: {value[:80]!r}...")
    return value


class Client(Protocol):
    async def call(self, job: EffectJob) -> Receipt:
        """Make the call of ``job`` with its token; raise a :class:`PipelineError` that says
        whether the outcome is known and whether a retry may help."""
        ...


class MissingEffectClient(RuntimeError):
    """A declared effect has no client registered under its name."""


class LookupOutsideContract(RuntimeError):
    """A client whose contract is ``lookup`` cannot look anything up."""


class EffectClients:
    def __init__(self, clients: Mapping[str, Client], *, required: Iterable[Effect] | None = None) -> None:
        self.check(clients, required=required)
        self.clients = dict(clients)
        # The deployed providers' contracts (a client says its own: an SMS gateway without its
        # lookup is ``none``); a client that says none is taken as ``none``.
        self.contracts: dict[str, Contract] = {
            name: getattr(client, "contract", Contract.NONE) for name, client in self.clients.items()}
        # Every client that can look a call up (a lookup(job) method and lookup_settle_seconds), whatever
        # its contract: how long after a call its provider can be asked about it.
        self.askable = {name: float(client.lookup_settle_seconds) for name, client in self.clients.items()
                        if callable(getattr(client, "lookup", None))
                        and isinstance(getattr(client, "lookup_settle_seconds", None), (int, float))}
        asking = sorted(name for name, contract in self.contracts.items() if contract.verifiable)
        unable = [name for name in asking if name not in self.askable]
        if unable:
            raise LookupOutsideContract(
                f"the client(s) of {', '.join(unable)} declare the contract lookup but have no lookup (a "
                "lookup(job) method and lookup_settle_seconds): give them one, or declare the contract the "
                "provider has (app/adapters/effects/<provider>.py)")
        # The effects whose calls in doubt are asked about: how long after a call their provider can be asked.
        self.verifiable = {name: float(self.clients[name].lookup_settle_seconds) for name in asking}
        # How long each provider keeps a key (seconds; the registry tells each client its provider's, as the
        # deployment has it: ``keys_kept_for``); a client that says nothing, or None, keeps them for ever.
        self.horizons = {name: float(kept) for name, client in self.clients.items()
                         if isinstance(kept := getattr(client, "keys_kept_for", None), (int, float))
                         and kept != float("inf")}

    @staticmethod
    def check(names: Iterable[str], *, required: Iterable[Effect] | None = None) -> None:
        """:class:`MissingEffectClient` unless every declared effect has a client in ``names``."""
        names = set(names)
        needed = {effect.name for effect in (required if required is not None else effects_used().values())}
        missing = sorted(needed - names)
        if missing:
            raise MissingEffectClient(
                f"no client registered for the effect(s) {', '.join(missing)}: every effect a pipeline declares "
                f"(app/pipeline/steps.py) needs a provider (app/adapters/effects/registry.py); registered: "
                f"{', '.join(sorted(names)) or 'none'}")

    async def call(self, job: EffectJob) -> Receipt:
        name = job.effect.name
        started = time.perf_counter()
        try:
            receipt = await self.clients[name].call(job)
        except PipelineError as exc:
            EFFECT_CALLS.labels(name, exc.reason).inc()
            raise
        finally:
            EFFECT_SECONDS.labels(name).observe(time.perf_counter() - started)
        EFFECT_CALLS.labels(name, "ok").inc()
        return receipt

    async def lookup(self, job: EffectJob) -> Receipt | None:
        name = job.effect.name
        started = time.perf_counter()
        try:
            found = await self.clients[name].lookup(job)
        except PipelineError as exc:
            EFFECT_CALLS.labels(f"{name}_lookup", exc.reason).inc()
            raise
        finally:
            EFFECT_SECONDS.labels(f"{name}_lookup").observe(time.perf_counter() - started)
        EFFECT_CALLS.labels(f"{name}_lookup", "found" if found is not None else "not_found").inc()
        return found
