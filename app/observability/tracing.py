"""Tracing's wiring: the OpenTelemetry SDK, set up from the standard ``OTEL_*`` settings
(``app.settings.tracing``) when an exporter is configured, and nothing at all otherwise.

On: a tracer provider with the configured sampler and a batch span processor exporting over OTLP
(http/protobuf or grpc) or to the console; the pipeline's spans turned on (``app.observability.spans``,
made by the pipeline's observer ``app.observability.pipeline_spans``);
the effect clients' HTTP sessions get the aiohttp client instrumentation's trace config (each call a
client span, and ``traceparent``/``tracestate`` on every request to a provider). Spans are exported in
the background; :func:`shutdown` flushes them when the worker stops.

A span's ``url.full`` never holds an idempotency token: the paths a provider declares as carrying
one (``Provider.token_paths``: the SMS lookup's ``/v1/sms/{client_ref}``, the express courier's
``/express/v1/orders/{out_order_no}``) show the braces instead (:func:`url_filter`), and the
instrumentation's own ``redact_url`` drops credentials and known signature parameters. Whoever
reads traces must not be able to ask a provider what was done under a token.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    import yarl

from app.observability import spans
from app.settings.tracing import TracingSettings

log = logging.getLogger(__name__)

_provider = None


def configure(settings: TracingSettings, *, worker_id: str) -> bool:
    """Install the SDK if ``settings`` configure an exporter (once per process); whether tracing is on."""
    global _provider
    if not settings.enabled:
        return False
    if _provider is not None:
        return True
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": settings.service_name, "service.instance.id": worker_id})
    provider = TracerProvider(resource=resource, sampler=sampler(settings.sampler, settings.sampler_arg))
    provider.add_span_processor(BatchSpanProcessor(exporter(settings)))
    trace.set_tracer_provider(provider)
    _provider = provider
    spans.enable()
    log.info("tracing on: %s spans (%s) to %s, sampler %s%s", settings.exporter or "otlp", settings.protocol,
             "standard output" if settings.exporter == "console" else _where(settings), settings.sampler,
             f" ({settings.sampler_arg})" if settings.sampler_arg else "")
    return True


def sampler(name: str, arg: str | None):
    """The SDK's sampler named as ``OTEL_TRACES_SAMPLER`` names it."""
    from opentelemetry.sdk.trace import sampling

    ratio = 1.0 if arg in (None, "") else float(arg)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={arg!r}: a ratio is between 0 and 1")
    samplers = {
        "always_on": lambda: sampling.ALWAYS_ON,
        "always_off": lambda: sampling.ALWAYS_OFF,
        "traceidratio": lambda: sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda: sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": lambda: sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": lambda: sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }
    if name.lower() not in samplers:
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r}: one of {', '.join(samplers)}")
    return samplers[name.lower()]()


def exporter(settings: TracingSettings):
    if settings.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        return GrpcExporter(endpoint=settings.traces_endpoint or settings.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    endpoint = settings.traces_endpoint
    if endpoint is None and settings.endpoint is not None:
        endpoint = settings.endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint)


def _where(settings: TracingSettings) -> str:
    """Where spans go, without what a URL may carry beside the host (a token in its query)."""
    from urllib.parse import urlsplit

    url = settings.traces_endpoint or settings.endpoint
    if url is None:
        return "the SDK's default endpoint"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}"


def url_filter(token_paths: Iterable[str]) -> Callable[[yarl.URL], str]:
    """What a client span records of a request's URL: the path's token replaced by its name in braces
    where the path ends as one of ``token_paths`` does (``/v1/sms/{client_ref}``: any base path
    before it); no query parameter of ours carries a token, and the instrumentation's ``redact_url``
    drops credentials and known signature parameters from what is left."""
    patterns = []
    for template in token_paths:
        literal = re.split(r"(\{[^{}/]+\})", template)
        body = "".join("[^/]+" if part.startswith("{") else re.escape(part) for part in literal)
        patterns.append((re.compile(f"{body}$"), template))

    def shown(url: yarl.URL) -> str:
        path = url.raw_path
        for pattern, template in patterns:
            if found := pattern.search(path):
                path = path[:found.start()] + template
                break
        query = f"?{url.raw_query_string}" if url.raw_query_string else ""
        return f"{url.with_path(path, encoded=True)}{query}"
    return shown


def client_trace_configs(token_paths: Iterable[str] = (), *, tracer_provider=None) -> list[aiohttp.TraceConfig]:
    """The trace configs of an effect client's HTTP session: the aiohttp client instrumentation's when
    tracing is on (a span per request, ``traceparent`` injected, the paths' tokens never recorded:
    :func:`url_filter`), none otherwise. ``tracer_provider``: another than :func:`configure`'s (a test's)."""
    provider = tracer_provider or _provider
    if provider is None:
        return []
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config
    return [create_trace_config(url_filter=url_filter(token_paths), tracer_provider=provider), _unsampled_carrier()]


def _unsampled_carrier() -> aiohttp.TraceConfig:
    """A call of an unsampled trace skips the instrumentation (``app.observability.spans.effect_span``):
    this puts its ``traceparent`` (flags 00) on the request all the same, so that the provider does not
    start a trace of its own."""
    from opentelemetry import propagate
    from opentelemetry.instrumentation.utils import is_http_instrumentation_enabled

    async def on_request_start(session, context, params: aiohttp.TraceRequestStartParams) -> None:
        if not is_http_instrumentation_enabled():
            propagate.inject(params.headers)

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_request_start)
    return config


def shutdown() -> None:
    """Export what is left (bounded by the SDK's export timeout) and stop tracing."""
    global _provider
    if _provider is None:
        return
    try:
        _provider.shutdown()
    except Exception:                      # a collector gone away must not stop the worker's stop
        log.warning("tracing: the last spans could not be exported", exc_info=True)
    _provider = None
    spans.disable()
