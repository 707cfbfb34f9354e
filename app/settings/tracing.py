"""Tracing: OpenTelemetry's own settings (the ``OTEL_*`` variables every SDK reads), the ones a worker
looks at to decide whether to trace at all and how to export.

Tracing is off unless an exporter is configured: ``OTEL_TRACES_EXPORTER=otlp`` (or ``console``), or an
OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). The SDK reads
the others itself, as the OpenTelemetry specification names them: ``OTEL_EXPORTER_OTLP_HEADERS`` (often
a credential: never read into these settings, never shown), ``OTEL_EXPORTER_OTLP_TIMEOUT``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` (the batch span processor), ``OTEL_SPAN_*_LIMIT``,
``OTEL_PROPAGATORS``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from app.settings._base import Group, setting


class TracingSettings(Group):
    TITLE = "Tracing"

    sdk_disabled: bool = setting("OTEL_SDK_DISABLED", False,
        description='`true`: no tracing, whatever else is set.')

    exporter: Literal["otlp", "console", "none"] | None = setting("OTEL_TRACES_EXPORTER", None, shown="unset",
        description='`otlp` (to an OpenTelemetry collector, Jaeger, Tempo...), `console` (spans as JSON on standard '
                    'output) or `none`; unset: `otlp` when an OTLP endpoint is set, else no tracing.')

    endpoint: str | None = setting("OTEL_EXPORTER_OTLP_ENDPOINT", None,
        description='The OTLP receiver, e.g. `http://localhost:4318` (http/protobuf; `/v1/traces` is added) or '
                    '`http://localhost:4317` (grpc).')

    traces_endpoint: str | None = setting("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None,
        description='The OTLP receiver of traces, whole (e.g. `http://localhost:4318/v1/traces`); before '
                    '`OTEL_EXPORTER_OTLP_ENDPOINT`.')

    protocol: Literal["http/protobuf", "grpc"] = setting("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf",
        description='How spans are sent to the OTLP receiver.')

    sampler: str = setting("OTEL_TRACES_SAMPLER", "parentbased_always_on",
        description="Which traces are kept, by the SDK's standard samplers: `parentbased_always_on` (a record's "
                    "trace is kept as its producer sampled it; a record without one starts a kept trace), "
                    '`parentbased_traceidratio` with `OTEL_TRACES_SAMPLER_ARG=0.01` (1 % of new traces), '
                    '`always_on`, `always_off`, `traceidratio`.')

    sampler_arg: str | None = setting("OTEL_TRACES_SAMPLER_ARG", None,
        description='The ratio of the `*traceidratio` samplers, 0 to 1.')

    service_name: str = setting("OTEL_SERVICE_NAME", "order-event-processor", min_length=1,
        description='The service the spans are of (`service.name`).')

    @field_validator("exporter", mode="before")
    @classmethod
    def _lower(cls, value):
        return value.strip().lower() if isinstance(value, str) else value

    @property
    def enabled(self) -> bool:
        """Whether this worker traces: an exporter is configured and the SDK is not disabled."""
        if self.sdk_disabled or self.exporter == "none":
            return False
        return self.exporter is not None or bool(self.endpoint or self.traces_endpoint)
