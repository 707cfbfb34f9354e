"""The pipeline's spans, with the SDK's in-memory exporter: where a record's trace context comes from
(W3C headers, the CloudEvents extension in both modes), what a batch through the real processor
leaves (the record under its producer's span, T1, the call, T3, the dead letter's span and header),
and when tracing is on at all (the standard OTEL_* settings)."""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import replace

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.observability import spans as tracing
from app.observability.pipeline_spans import PipelineSpans
from app.observability.tracing import sampler
from app.pipeline.batch import BatchHandler, BatchPolicy, Identity
from app.pipeline.clock import Clock
from app.pipeline.errors import EffectUnavailable
from app.pipeline.processor import Processor, ProcessorPolicy
from app.pipeline.tokens import StepTokens
from app.settings.tracing import TracingSettings
from harness.events import event, order_no
from harness.memory_store import MemoryStore
from harness.pipeline import MemorySink, source
from harness.scenarios import Fault, MemoryEffects

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def sdk():
    """One SDK for the module (a process sets its tracer provider once), tracing on while it runs."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    tracing.enable()
    yield
    tracing.disable()


@pytest.fixture(autouse=True)
def spans():
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def context() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def ids(span_context) -> tuple[str, str]:
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


# -- where the context comes from ----------------------------------------------------------------------


def test_the_w3c_headers_are_the_records_context():
    _, _, parent = context()
    assert tracing.carrier([("traceparent", parent.encode()), ("tracestate", b"a=1")]) == \
        {"traceparent": parent, "tracestate": "a=1"}


def test_a_cloudevent_in_binary_mode_carries_it_in_ce_traceparent():
    _, _, parent = context()
    assert tracing.carrier([("ce_specversion", b"1.0"), ("ce_traceparent", parent.encode())]) == \
        {"traceparent": parent}


def test_a_structured_cloudevent_carries_it_as_an_attribute():
    _, _, parent = context()
    body = json.dumps({"specversion": "1.0", "traceparent": parent, "tracestate": "x=y"}).encode()
    found = tracing.carrier([("content-type", b"application/cloudevents+json; charset=utf-8")], body)
    assert found == {"traceparent": parent, "tracestate": "x=y"}


def test_the_w3c_header_comes_before_the_cloudevents_extension():
    _, _, own = context()
    _, _, extension = context()
    assert tracing.carrier([("ce_traceparent", extension.encode()), ("traceparent", own.encode())]) == \
        {"traceparent": own}


@pytest.mark.parametrize("headers", [
    [], [("traceparent", b"not a traceparent")], [("traceparent", None)],
    [("traceparent", b"00-00000000000000000000000000000000-0000000000000000-01")],
])
def test_a_record_without_a_valid_context_starts_no_trace_of_its_producer(headers):
    assert tracing.extract(headers) is None


def test_a_structured_body_that_is_not_json_is_no_context():
    assert tracing.carrier([("content-type", b"application/cloudevents+json")], b"{not json") == {}


# -- what a batch leaves -------------------------------------------------------------------------------


def handle(records, effects: MemoryEffects) -> MemorySink:
    store = MemoryStore()
    processor = Processor(store, effects, owner="trace/main/1", tokens=StepTokens(b"tracing"),
                          policy=ProcessorPolicy(lease_seconds=30, effect_concurrency=4), observer=PipelineSpans())
    sink = MemorySink()
    handler = BatchHandler(processor, store, sink, identity=Identity("trace-group", "trace"),
                           policy=BatchPolicy(backoff=(0,), max_event_bytes=1 << 20, infra_budget=5, max_lease_wait=1),
                           clock=Clock(sleep=_no_wait))
    asyncio.run(handler.handle(records))
    return sink


async def _no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


def with_context(doc: dict, parent: str):
    record = source(doc)
    return replace(record, headers=(("traceparent", parent.encode()), ("tracestate", b"vendor=shop")))


def test_a_record_continues_its_producers_trace_through_t1_the_call_and_t3(spans):
    order = order_no(prefix="SPAN")
    trace_id, producer, parent = context()
    records = [source(event(order, "ORDER_CREATED")), source(event(order, "ORDER_PAID")),
               with_context(event(order, "ORDER_CONFIRM"), parent)]
    handle(records, MemoryEffects(asyncio.sleep))

    finished = spans.get_finished_spans()
    [record] = [s for s in finished if s.parent is not None and ids(s.parent) == (trace_id, producer)]
    assert record.name == "process order-event" and record.kind is trace.SpanKind.CONSUMER
    assert record.attributes["order.no"] == order and record.attributes["outcome"] == "applied"
    assert record.attributes["messaging.consumer.group.name"] == "trace-group"
    [batch] = [s for s in finished if s.attributes.get("messaging.batch.message_count") == 3]
    assert [ids(link.context) for link in record.links] == [ids(batch.context)]
    assert (trace_id, producer) in [ids(link.context) for link in batch.links]

    children = {s.name: s for s in finished if s.parent is not None and s.parent.span_id == record.context.span_id}
    assert set(children) == {"T1", "effect waybill", "T3"}
    key = f"{order}:ORDER_CONFIRM:issue_waybill"
    assert key in children["T1"].attributes["idem.claimed"]
    assert children["effect waybill"].attributes["idem.key"] == key
    assert children["effect waybill"].attributes["idem.attempt"] == 1
    assert children["effect waybill"].attributes["outcome"] == "done"
    assert children["T3"].attributes["outcome"] == "done"
    # Without a producer's context, a record starts a trace of its own (still under its batch's links).
    created = [s for s in finished if s.name == "process order-event" and s.attributes.get("event.type") ==
               "ORDER_CREATED"]
    assert len(created) == 1 and created[0].parent is None


def test_a_dead_letter_names_its_span_and_keeps_the_records_own_context(spans):
    order = order_no(prefix="SPANDL")
    trace_id, producer, parent = context()
    effects = MemoryEffects(asyncio.sleep)
    effects.faults["waybill"] = [Fault(EffectUnavailable("down")), Fault(EffectUnavailable("down"))]
    records = [source(event(order, "ORDER_CREATED")), source(event(order, "ORDER_PAID")),
               with_context(event(order, "ORDER_CONFIRM"), parent)]
    sink = handle(records, effects)

    [letter] = sink.sent
    assert dict(letter.record.headers)["traceparent"] == parent.encode()      # the record's own, as it was
    finished = spans.get_finished_spans()
    [dead] = [s for s in finished if s.name == "dead-letter"]
    assert letter.trace == f"00-{trace_id}-{ids(dead.context)[1]}-01"
    assert ids(dead.parent)[0] == trace_id
    calls = [s for s in finished if s.name == "effect waybill"]
    assert sorted(s.attributes["idem.attempt"] for s in calls) == [1, 2]
    assert all(s.attributes["outcome"] == "effect_unavailable" and not s.status.is_ok for s in calls)
    [record] = [s for s in finished if s.parent is not None and ids(s.parent) == (trace_id, producer)]
    assert record.attributes["outcome"] == "dead_letter"


def test_no_attribute_holds_the_orders_personal_data(spans):
    order = order_no(prefix="SPANPD")
    created = event(order, "ORDER_CREATED")
    handle([source(created), source(event(order, "ORDER_PAID")), source(event(order, "ORDER_CONFIRM"))],
           MemoryEffects(asyncio.sleep))
    values = json.dumps([dict(s.attributes) for s in spans.get_finished_spans()], default=str)
    assert created["data"]["phone"] not in values and created["data"]["address"] not in values


def test_tracing_off_leaves_no_span(spans):
    tracing.disable()
    try:
        order = order_no(prefix="SPANOFF")
        handle([source(event(order, "ORDER_CREATED"))], MemoryEffects(asyncio.sleep))
    finally:
        tracing.enable()
    assert spans.get_finished_spans() == ()


# -- when it is on ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, on", [
    ({}, False),
    ({"endpoint": "http://collector:4318"}, True),
    ({"traces_endpoint": "http://collector:4318/v1/traces"}, True),
    ({"exporter": "otlp"}, True),
    ({"exporter": "console"}, True),
    ({"exporter": "none", "endpoint": "http://collector:4318"}, False),
    ({"sdk_disabled": True, "exporter": "otlp"}, False),
])
def test_tracing_is_on_only_with_an_exporter(values, on):
    assert TracingSettings(**values).enabled is on


def test_the_standard_samplers_by_name():
    assert "TraceIdRatioBased{0.01}" in sampler("parentbased_traceidratio", "0.01").get_description()
    assert sampler("always_off", None).get_description() == "AlwaysOffSampler"
    with pytest.raises(ValueError, match="between 0 and 1"):
        sampler("traceidratio", "2")
    with pytest.raises(ValueError, match="one of"):
        sampler("jaeger_remote", None)


def test_a_client_spans_url_shows_a_tokens_name_where_a_provider_puts_one_in_the_path():
    import yarl

    from app.adapters.effects.registry import token_paths
    from app.observability.tracing import url_filter

    shown = url_filter(token_paths())
    token = "0c101182bd0d5fb7b2075814d2c1e83e"
    assert shown(yarl.URL(f"http://gw:8900/v1/sms/{token}")) == "http://gw:8900/v1/sms/{client_ref}"
    assert shown(yarl.URL(f"https://gw/api/v1/sms/{token}?a=1")) == "https://gw/api/v1/sms/{client_ref}?a=1"
    assert shown(yarl.URL(f"http://c/express/v1/orders/{token}")) == "http://c/express/v1/orders/{out_order_no}"
    assert shown(yarl.URL("http://c/v1/waybills?from=1&to=2")) == "http://c/v1/waybills?from=1&to=2"
    assert shown(yarl.URL("http://c/v1/sms")) == "http://c/v1/sms"
