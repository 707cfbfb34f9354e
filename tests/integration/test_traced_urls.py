"""No idempotency token in a trace: the HTTP client's spans of calls whose path carries one (the SMS
gateway's lookup by ``client_ref``, the express courier's lookup by ``out_order_no``), made by the real
clients to the fakes over real HTTP with the tracing instrumentation the worker uses, record the path
with the parameter's name in braces; the provider still got the token. Whoever reads traces could
otherwise ask the gateway what was sent under it, phone number included."""

from __future__ import annotations

import json
from datetime import date

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.adapters.effects import express, http_session, sms
from app.adapters.effects.registry import token_paths
from app.observability.tracing import client_trace_configs
from app.pipeline.model import EffectJob
from app.pipeline.states import OrderStatus
from app.pipeline.steps import ISSUE_WAYBILL, SEND_SMS
from app.pipeline.tokens import StepTokens
from demo.fakes.registry import worker_settings
from harness.events import order_no
from harness.fakes import fakes_in_process


def job(effect, order: str, token: str) -> EffectJob:
    request = ({"phone": "+8613800000000", "text": f"{order} cancelled"} if effect is SEND_SMS else
               {"order_no": order, "address": "1 Test Road"})
    return EffectJob(0, order, f"{order}:X:{effect.name}", date.today(), effect.name, effect, token, 1, request,
                     OrderStatus.CANCELLED)


async def test_a_client_span_shows_the_tokens_name_never_the_token(settings):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tokens = StepTokens(b"a secret for this test")
    sent, couriered = order_no(prefix="TRSMS"), order_no(prefix="TREXP")
    sms_token, express_token = tokens(f"{sent}:ORDER_CANCEL:send_cancel_sms"), tokens(f"{couriered}:ORDER_CONFIRM:x")
    async with fakes_in_process() as (fakes, url):
        s = settings.model_copy(update={**{k.lower(): v for k, v in worker_settings(url).items()}, "sms_lookup": True})
        async with http_session(2, client_trace_configs(token_paths(), tracer_provider=provider)) as session:
            gateway = sms.build(session, s.effects.effect("sms"))
            courier = express.build(session, s.effects.effect("waybill"))
            await gateway.call(job(SEND_SMS, sent, sms_token))
            assert (await gateway.lookup(job(SEND_SMS, sent, sms_token))) is not None
            first = await courier.call(job(ISSUE_WAYBILL, couriered, express_token))
            again = await courier.call(job(ISSUE_WAYBILL, couriered, express_token))   # a duplicate: looked up
            assert again == first
        asked = [(c["service"], c.get("client_ref") or c.get("key")) for c in fakes.ledger.calls]
    assert ("sms_lookup", sms_token) in asked and ("express_lookup", express_token) in asked   # the token got there
    spans = exporter.get_finished_spans()
    urls = sorted({str(span.attributes.get("url.full") or span.attributes.get("http.url")) for span in spans})
    assert f"{url}/v1/sms/{{client_ref}}" in urls and f"{url}/express/v1/orders/{{out_order_no}}" in urls, urls
    shown = json.dumps([{"name": span.name, "attributes": dict(span.attributes or {}),
                         "events": [dict(e.attributes or {}) for e in span.events]} for span in spans])
    assert sms_token not in shown and express_token not in shown, shown
    provider.shutdown()
