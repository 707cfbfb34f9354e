"""A record's trace, followed through a real Jaeger: the producer's context in, every span of its
processing, its dead letter, the compensator's redrive and a person's retry linked back to it, and the
traceparent each provider received.

The records are written by kcat (librdkafka) with W3C ``traceparent``/``tracestate`` headers, as an
instrumented order service would; the worker exports over OTLP/HTTP to Jaeger v2 (its all-in-one
program, built from its Go module once and cached like the Kafka jars); the test asks Jaeger's query
API for the trace. The logistics fake fails the order's waybill until the test lets it through, so
that the record goes to the dead-letter queue first.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import urllib.request

import pytest

from app.adapters.kafka.topics import topic_specs
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.jaeger import Jaeger, tag_of
from harness.services import (
    ScratchDatabase,
    Topics,
    Worker,
    create_topics,
    delete_topics,
    produce,
    wait_for,
    worker_env,
)

SERVICE = "order-event-processor"
TOKEN = "tracing-test-operator-token"
CAP = 120            # caps on condition waits, never a timing goal


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory):
    server = Jaeger(tmp_path_factory.mktemp("jaeger")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def traced(settings, jaeger):
    """A worker exporting to Jaeger, its fakes, its topics and its own database."""
    db = ScratchDatabase(settings.database.url).create()
    pair = Topics(settings, partitions=2)
    specs = topic_specs(settings.model_copy(update={"order_event_partitions": 2, "dlq_partitions": 1}),
                        events=pair.events, dlq=pair.dlq)
    asyncio.run(create_topics(settings, specs))
    fakes = FakesProcess()
    env = worker_env(**{"MYSQL_URL": db.url, "WORKER_ID": "traced-w", **pair.env(), **fakes.env(),
                        **jaeger.worker_env(), "WEB_TOKEN": TOKEN, "RETRY_BACKOFF_MS": "20",
                        "DLQ_RETRY_AFTER_SECONDS": "1", "COMPENSATION_BACKOFF_SECONDS": "1",
                        "COMPENSATION_MAX_ATTEMPTS": "3"})
    worker = Worker(env, "traced").start()
    try:
        yield Setup(settings, db, pair, fakes, worker, jaeger)
    finally:
        worker.stop()
        fakes.stop()
        asyncio.run(delete_topics(settings, [pair.events, pair.dlq]))
        db.drop()


class Setup:
    def __init__(self, settings, db, pair, fakes, worker, jaeger) -> None:
        self.settings, self.db, self.pair, self.fakes, self.worker, self.jaeger = (
            settings, db, pair, fakes, worker, jaeger)

    def order_ready_to_confirm(self, prefix: str) -> str:
        """An order created and paid (records without trace context), its waybill failing for now."""
        order = order_no(prefix=prefix)
        self.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
        asyncio.run(produce(self.settings, self.pair.events,
                            [record(event(order, t)) for t in ("ORDER_CREATED", "ORDER_PAID")]))
        wait_for(lambda: self.db.scalar("SELECT status FROM t_order WHERE order_no = %s", order) is not None,
                 timeout=CAP, what=f"{order} created and paid", workers=[self.worker])
        return order

    def confirm_with_trace(self, order: str, traceparent: str, tracestate: str) -> None:
        """The CONFIRM written by another client (kcat), with the producer's trace context."""
        kcat = shutil.which("kcat") or shutil.which("kafkacat")
        assert kcat, "kcat is installed by make test-tools"
        key, value = record(event(order, "ORDER_CONFIRM"))
        subprocess.run([kcat, "-P", "-b", self.settings.kafka.broker.removeprefix("kafka://"),
                        "-t", self.pair.events, "-k", key.decode(), "-H", f"traceparent={traceparent}",
                        "-H", f"tracestate={tracestate}"], input=value, check=True, timeout=60)

    def compensation_row(self, order: str) -> dict | None:
        rows = self.db.query("SELECT id, status, reason FROM t_compensation WHERE order_no = %s ORDER BY id",
                             order)
        return rows[-1] if rows else None

    def let_through(self, order: str) -> None:
        self.fakes.configure({"waybill": {"fail_orders": []}})

    def waybill_calls(self, order: str) -> list[dict]:
        return [call for call in self.fakes.ledger()["calls"]
                if call["service"] == "waybill" and call["body"].get("order_no") == order]


def new_context() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def spans_named(spans: list[dict], name: str) -> list[dict]:
    return [span for span in spans if span["operationName"] == name]


def parent_of(span: dict) -> str | None:
    refs = [ref for ref in span.get("references", ()) if ref["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def links_of(span: dict) -> list[tuple[str, str]]:
    """The span's links, as Jaeger gives them back (FOLLOWS_FROM references, or CHILD_OF ones past the
    first: the parent is the first CHILD_OF)."""
    refs = span.get("references", ())
    parent = parent_of(span)
    return [(ref["traceID"], ref["spanID"]) for ref in refs
            if ref["refType"] == "FOLLOWS_FROM" or (ref["refType"] == "CHILD_OF" and ref["spanID"] != parent)]


def test_a_record_is_followed_from_its_producer_through_its_dead_letter_and_redrive(traced):
    order = traced.order_ready_to_confirm("TRACE")
    trace_id, producer_span, traceparent = new_context()
    traced.confirm_with_trace(order, traceparent, "vendor=order-service")
    wait_for(lambda: traced.compensation_row(order) is not None, timeout=CAP, what="the CONFIRM dead-lettered",
             workers=[traced.worker])
    traced.let_through(order)
    wait_for(lambda: traced.compensation_row(order)["status"] == 3, timeout=CAP,
             what="the dead letter redriven and resolved", workers=[traced.worker])

    key = f"{order}:ORDER_CONFIRM:issue_waybill"

    def processing_exported():
        spans = traced.jaeger.trace(trace_id)
        return spans if spans_named(spans, "dead-letter") and spans_named(spans, "T3") else None

    spans = wait_for(processing_exported, timeout=CAP, what="the record's spans in Jaeger")
    by_id = {span["spanID"]: span for span in spans}

    # The record's processing continues the producer's trace: its parent is the producer's span.
    records = [s for s in spans_named(spans, f"process {traced.pair.events}") if parent_of(s) == producer_span]
    assert len(records) == 1, [s["operationName"] for s in spans]
    processing = records[0]
    assert tag_of(processing, "messaging.system") == "kafka"
    assert tag_of(processing, "messaging.destination.name") == traced.pair.events
    assert tag_of(processing, "messaging.consumer.group.name") == traced.pair.group
    assert tag_of(processing, "order.no") == order
    assert tag_of(processing, "outcome") == "dead_letter"
    # ... linked to its batch's span, which links the record's producer context back.
    [(batch_trace, batch_span)] = links_of(processing)
    batch = traced.jaeger.trace(batch_trace)
    [batch_root] = [s for s in batch if s["spanID"] == batch_span]
    assert tag_of(batch_root, "messaging.batch.message_count") >= 1
    assert (trace_id, producer_span) in links_of(batch_root)

    # T1, the effect's calls and T3 are children of the record's span, with key, attempt and outcome.
    children = [s for s in spans if parent_of(s) == processing["spanID"]]
    names = [s["operationName"] for s in children]
    assert "T1" in names and "T3" in names and "effect waybill" in names and "dead-letter" in names, names
    t1 = [s for s in children if s["operationName"] == "T1"]
    assert all(tag_of(s, "idem.key") == f"{order}:ORDER_CONFIRM:mark_confirmed" or
               key in (tag_of(s, "idem.claimed") or "") for s in t1)
    calls = [s for s in children if s["operationName"] == "effect waybill"]
    assert len(calls) == 2                          # the first try and the one retry in the batch
    assert [tag_of(s, "idem.attempt") for s in sorted(calls, key=lambda s: s["startTime"])] == [1, 2]
    assert all(tag_of(s, "idem.key") == key and tag_of(s, "outcome") == "effect_unavailable" for s in calls)
    assert all(tag_of(s, "error") is True for s in calls)
    t3 = [s for s in children if s["operationName"] == "T3"]
    assert {tag_of(s, "outcome") for s in t3} == {"effect_unavailable"}
    [letter] = [s for s in children if s["operationName"] == "dead-letter"]
    assert tag_of(letter, "error.type") == "effect_unavailable" and tag_of(letter, "retriable") is True

    # Each call's HTTP span (the aiohttp instrumentation) is the effect span's child, and its
    # traceparent is what the provider received.
    http = [s for s in spans if parent_of(s) in {c["spanID"] for c in calls}]
    assert len(http) == len(calls)
    received = [call.get("traceparent") for call in traced.waybill_calls(order)]
    sent = {f"00-{trace_id}-{s['spanID']}-01" for s in http}
    assert sent <= set(received), (sent, received)

    # No personal data in any span: the order's phone and address are not in an attribute.
    created = event(order, "ORDER_CREATED")["data"]
    texts = json.dumps([s.get("tags") for s in spans])
    assert created["phone"] not in texts and created["address"] not in texts

    # The dead letter kept the producer's context, and names the span that dead-lettered it.
    letter_headers = dlq_headers(traced, order)
    assert letter_headers["traceparent"] == traceparent
    assert letter_headers["tracestate"] == "vendor=order-service"
    assert letter_headers["dlq.traceparent"] == f"00-{trace_id}-{letter['spanID']}-01"

    # The compensator's redrive: a span of its own trace, linked to the context the letter kept, with
    # its own T1, call and T3 (the call made the waybill; its traceparent reached the provider too).
    redrives = wait_for(lambda: traced.jaeger.find(SERVICE, "redrive dead letter", {"order.no": order}) or None,
                        timeout=CAP, what="the redrive's span in Jaeger")
    ended = [s for s in redrives if tag_of(s, "outcome") == "compensated"]
    assert len(ended) == 1, [tag_of(s, "outcome") for s in redrives]
    redrive = ended[0]
    assert (trace_id, producer_span) in links_of(redrive)
    assert tag_of(redrive, "idem.key") == f"{order}:ORDER_CONFIRM:mark_confirmed"
    redrive_spans = wait_for(lambda: (lambda got: got if spans_named(got, "T3") else None)(
        traced.jaeger.trace(redrive["traceID"])), timeout=CAP, what="the redrive's T3 in Jaeger")
    [call] = [s for s in redrive_spans if s["operationName"] == "effect waybill"
              and parent_of(s) == redrive["spanID"]]
    assert tag_of(call, "outcome") == "done" and tag_of(call, "idem.attempt") == 3
    [call_http] = [s for s in redrive_spans if parent_of(s) == call["spanID"]]
    # (a trace the SDK began may carry the W3C "random" flag beside "sampled": 03)
    assert f"00-{redrive['traceID']}-{call_http['spanID']}" in [p[:-3] for p in received_now(traced, order) if p]
    assert by_id  # the record's own trace was read whole above


def test_a_persons_retry_is_a_span_linked_to_the_dead_letters_context(traced):
    order = traced.order_ready_to_confirm("TRACEP")
    trace_id, producer_span, traceparent = new_context()
    traced.confirm_with_trace(order, traceparent, "vendor=order-service")
    # The compensator gives up after COMPENSATION_MAX_ATTEMPTS redrives: the letter waits for a person.
    wait_for(lambda: (traced.compensation_row(order) or {}).get("status") == 4, timeout=CAP,
             what="the CONFIRM dead-lettered and given up", workers=[traced.worker])
    traced.let_through(order)
    row = traced.compensation_row(order)
    request = urllib.request.Request(
        f"http://127.0.0.1:{traced.worker.web_port}/compensation/{row['id']}/retry", method="POST",
        data=json.dumps({"note": "the provider took the order back"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        answer = json.loads(resp.read())
    assert answer.get("status") == "compensated", answer

    retries = wait_for(lambda: traced.jaeger.find(SERVICE, "retry dead letter", {"order.no": order}) or None,
                       timeout=CAP, what="the person's retry in Jaeger")
    [retry] = retries
    assert (trace_id, producer_span) in links_of(retry)
    assert tag_of(retry, "outcome") == "compensated"
    got = wait_for(lambda: (lambda spans: spans if spans_named(spans, "T3") else None)(
        traced.jaeger.trace(retry["traceID"])), timeout=CAP, what="the retry's T3 in Jaeger")
    assert {s["operationName"] for s in got if parent_of(s) == retry["spanID"]} >= {"T1", "effect waybill", "T3"}


def dlq_headers(traced: Setup, order: str) -> dict[str, str]:
    """The headers of the order's letter on the dead-letter topic, read by kcat."""
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    out = subprocess.run([kcat, "-C", "-b", traced.settings.kafka.broker.removeprefix("kafka://"),
                          "-t", traced.pair.dlq, "-e", "-q", "-J"], capture_output=True, check=True, timeout=60)
    for line in out.stdout.decode().splitlines():
        doc = json.loads(line)
        if doc.get("key") == order:
            headers = doc.get("headers") or []
            return dict(zip(headers[::2], headers[1::2]))
    raise AssertionError(f"no dead letter of {order} on {traced.pair.dlq}")


def received_now(traced: Setup, order: str) -> list[str | None]:
    return [call.get("traceparent") for call in traced.waybill_calls(order)]


def test_a_record_its_producer_did_not_sample_leaves_no_span_but_carries_its_context_on(traced):
    unsampled = traced.order_ready_to_confirm("TRACEU")
    traced.let_through(unsampled)
    trace_id, _, _ = new_context()
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-00"             # the producer did not sample it
    traced.confirm_with_trace(unsampled, traceparent, "vendor=order-service")
    wait_for(lambda: traced.waybill_calls(unsampled), timeout=CAP, what="the unsampled record's call",
             workers=[traced.worker])
    [received] = [call.get("traceparent") for call in traced.waybill_calls(unsampled)]
    assert received is not None and received.startswith(f"00-{trace_id}-") and received.endswith("-00")

    # A sampled record after it: once its spans are in Jaeger, the unsampled one's would be too.
    marker = traced.order_ready_to_confirm("TRACEM")
    traced.let_through(marker)
    marker_trace, _, marker_parent = new_context()
    traced.confirm_with_trace(marker, marker_parent, "vendor=order-service")
    wait_for(lambda: spans_named(traced.jaeger.trace(marker_trace), "T3"), timeout=CAP,
             what="the sampled record's spans in Jaeger")
    assert traced.jaeger.trace(trace_id) == []


def test_a_bulk_jobs_chunk_is_a_span_linked_to_each_letters_context(traced):
    orders = [order_no(prefix="TRACEB") for _ in range(2)]
    traced.fakes.configure({"waybill": {"fail_orders": orders, "fail_status": 503}})
    asyncio.run(produce(traced.settings, traced.pair.events,
                        [record(event(o, t)) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID")]))
    contexts = {}
    for order in orders:
        trace_id, producer_span, traceparent = new_context()
        contexts[order] = (trace_id, producer_span)
        traced.confirm_with_trace(order, traceparent, "vendor=order-service")
    wait_for(lambda: all((traced.compensation_row(o) or {}).get("status") == 4 for o in orders), timeout=CAP,
             what="both CONFIRMs dead-lettered and given up", workers=[traced.worker])
    traced.let_through(orders[0])
    job = post(traced, "/bulk/", {"action": "retry", "filter": {"status": "manual", "reason": "effect_unavailable"},
                                  "expected_count": count(traced), "note": "the provider is back", "actor": "ops"})
    wait_for(lambda: get(traced, f"/bulk/{job['id']}")["status"] == "done", timeout=CAP,
             what="the bulk job done", workers=[traced.worker])
    assert all(traced.compensation_row(o)["status"] == 3 for o in orders)

    def chunk_with_both():
        for chunk in traced.jaeger.find(SERVICE, "bulk job chunk", {"bulk.job_id": str(job["id"])}):
            if set(contexts.values()) <= set(links_of(chunk)):
                return chunk
        return None

    chunk = wait_for(chunk_with_both, timeout=CAP, what="the chunk's span, linked to both letters' contexts")
    assert tag_of(chunk, "bulk.action") == "retry"
    spans = wait_for(lambda: (lambda got: got if len(spans_named(got, "retry dead letter")) >= 2 else None)(
        traced.jaeger.trace(chunk["traceID"])), timeout=CAP, what="the chunk's rows in Jaeger")
    rows = [s for s in spans_named(spans, "retry dead letter") if parent_of(s) == chunk["spanID"]]
    assert {tag_of(s, "order.no") for s in rows} >= set(orders)
    for row in rows:
        if tag_of(row, "order.no") in contexts:
            assert contexts[tag_of(row, "order.no")] in links_of(row)
            assert tag_of(row, "outcome") == "compensated"


def count(traced: Setup) -> int:
    return post(traced, "/bulk/dry-run", {"action": "retry",
                                          "filter": {"status": "manual", "reason": "effect_unavailable"}})["count"]


def post(traced: Setup, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{traced.worker.web_port}{path}", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def get(traced: Setup, path: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{traced.worker.web_port}{path}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())
