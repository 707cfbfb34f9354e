"""The worker, its compensator, the admin command and the CLI against a secure broker: SCRAM-SHA-512
over TLS and mTLS work end to end; a wrong password, a CA that did not sign the broker, PLAINTEXT
against a TLS listener and a missing client certificate each stop start-up with a line that says
which; the password shows up in no log line and no page of the worker.

One broker of this module's own (``harness.kafka_cluster``), started once: a throwaway CA,
a SASL_SSL listener (SCRAM-SHA-512/256, PLAIN) and an mTLS listener (``ssl.client.auth=required``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConnection
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.kafka_cluster import KafkaCluster, make_certificates
from harness.services import ROOT, Worker, free_port, wait_for

EXIT_CONFIG = 78          # a setting that cannot work (app.exits)
STARTUP_BOUND = 90.0      # a refusal must end start-up well before this
READ_TOKEN = "read-" + uuid.uuid4().hex
FAST = {"BATCH_WITHIN_SECONDS": "0.3", "COMPENSATOR_WITHIN_SECONDS": "0.3", "RETRY_BACKOFF_MS": "20,20,20",
        "BROKER_COMMIT_INTERVAL_SECONDS": "0.5"}


@pytest.fixture(scope="module")
def broker(request):
    cluster = KafkaCluster(ROOT / ".cache" / "kafka-security" / uuid.uuid4().hex[:8], nodes=1, secure=True)
    failed = request.session.testsfailed
    cluster.start()
    yield cluster
    cluster.stop()
    if request.session.testsfailed == failed:      # the broker's log is kept only when it may explain something
        shutil.rmtree(cluster.home, ignore_errors=True)


@pytest.fixture(scope="module")
def fakes():
    process = FakesProcess()
    yield process
    process.stop()


def connection(broker: KafkaCluster, listener: str) -> KafkaConnection:
    """The project's own connection object for a listener of the module's broker."""
    env = broker.env(listener)
    return KafkaConnection(bootstrap=broker.bootstrap(listener), security_protocol=env["KAFKA_SECURITY_PROTOCOL"],
                           sasl_mechanism=env.get("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
                           sasl_username=env.get("KAFKA_SASL_USERNAME"), sasl_password=env.get("KAFKA_SASL_PASSWORD"),
                           ssl_cafile=env.get("KAFKA_SSL_CAFILE"), ssl_certfile=env.get("KAFKA_SSL_CERTFILE"),
                           ssl_keyfile=env.get("KAFKA_SSL_KEYFILE"))


def environment(kafka: dict[str, str], **overrides: str) -> dict[str, str]:
    """This process's environment without any KAFKA_* of its own, then ``kafka`` and ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update({"PYTHONUNBUFFERED": "1", "WEB_PORT": str(free_port()), **kafka, **overrides})
    return {k: v for k, v in env.items() if v is not None}


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def faust_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run([str(Path(sys.executable).with_name("faust")), "-A", "app", *args], env)


def get(port: int, path: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {READ_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@pytest.mark.parametrize("listener", ["sasl", "mtls"])
def test_worker_compensator_admin_and_cli_work_over_a_secure_listener(broker, fakes, scratch_db, listener):
    suffix = uuid.uuid4().hex[:8]
    topics = {"ORDER_EVENT_TOPIC": f"sec-event-{suffix}", "DLQ_TOPIC": f"sec-dlq-{suffix}",
              "APP_ID": f"sec-group-{suffix}", "ORDER_EVENT_PARTITIONS": "2", "DLQ_PARTITIONS": "1"}
    env = environment(broker.env(listener), MYSQL_URL=scratch_db.url, WORKER_ID=f"sec-{listener}-{suffix}",
                      **fakes.env(), WEB_READ_TOKEN=READ_TOKEN, **topics, **FAST)
    conn = connection(broker, listener)

    created = run([sys.executable, "-m", "app.admin", "create-topics"], env)
    assert created.returncode == 0, created.stderr[-3000:]
    assert f"created {topics['ORDER_EVENT_TOPIC']}" in created.stdout, created.stdout

    worker = Worker(env, f"kafka-security-{listener}").start()
    try:
        order = order_no(prefix="SEC")
        records = [record(event(order, "ORDER_CREATED")), record(event(order, "ORDER_PAID")), (b"k", b"\xff\xfe")]
        asyncio.run(kafka_ops.produce(conn, topics["ORDER_EVENT_TOPIC"], records))

        # The order-event agent did the order's steps ...
        wait_for(lambda: scratch_db.scalar("SELECT status FROM t_order WHERE order_no = %s", order) == 2,
                 timeout=120, what="the order paid", workers=[worker])
        # ... and dead-lettered the unreadable record: a ledger row, a record on the dead-letter
        # topic, which the compensator agent (another consumer of the worker) read and committed.
        row = wait_for(lambda: scratch_db.query("SELECT id, reason FROM t_compensation WHERE src_topic = %s",
                                                topics["ORDER_EVENT_TOPIC"]),
                       timeout=120, what="the dead letter in the ledger", workers=[worker])
        assert [r["reason"] for r in row] == ["not_utf8"]
        row_id = row[0]["id"]

        def compensator_committed() -> bool:
            ends = asyncio.run(kafka_ops.end_offsets(conn, topics["DLQ_TOPIC"], 1))
            return ends == {0: 1} and asyncio.run(kafka_ops.committed_offsets(
                conn, topics["APP_ID"], topics["DLQ_TOPIC"], 1)) == ends

        wait_for(compensator_committed, timeout=120, what="the compensator's commit on the dead-letter topic",
                 workers=[worker])

        shown = faust_cli(env, "dlq", "show", str(row_id))
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert topics["ORDER_EVENT_TOPIC"] in shown.stdout and "not_utf8" in shown.stdout

        pages = {path: get(worker.web_port, path) for path in (
            "/", "/health", "/healthz", "/readyz", "/metrics", "/console/", "/compensation/",
            f"/compensation/{row_id}", f"/orders/{order}", "/idem/stuck/", "/router/", "/table/", "/graph/",
            "/stats/", "/assignment/", "/performance/")}
        for path in ("/health", "/metrics", "/compensation/", f"/orders/{order}"):
            assert pages[path][0] == 200, (path, pages[path])
        assert order in pages[f"/orders/{order}"][1]
        assert worker.alive
        if listener == "sasl":
            secret = broker.password
            assert secret not in worker.logs(), f"the SASL password is in {worker.log_path}"
            leaking = [path for path, (_, body) in pages.items() if secret in body]
            assert not leaking, f"the SASL password is on {leaking}"
            for output in (created, shown):
                assert secret not in output.stdout + output.stderr
    finally:
        worker.stop()
        asyncio.run(kafka_ops.delete_topics(conn, [topics["ORDER_EVENT_TOPIC"], topics["DLQ_TOPIC"]]))


def refusals(broker: KafkaCluster) -> dict[str, tuple[dict[str, str | None], str]]:
    """What each wrong setting is, and the words its start-up line must have."""
    other_ca = make_certificates(broker.home / "another-ca") / "ca.pem"
    sasl = broker.env("sasl")
    return {
        "wrong_password": ({**sasl, "KAFKA_SASL_PASSWORD": "not-the-" + broker.password[:6]},
                           "refused our SASL login"),
        "unknown_ca": ({**sasl, "KAFKA_SSL_CAFILE": str(other_ca)}, "not signed by a CA we trust"),
        "plaintext_against_tls": ({"KAFKA_BROKER": sasl["KAFKA_BROKER"], "KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"},
                                  "is a TLS listener"),
        "mtls_without_certificate": ({**broker.env("mtls"), "KAFKA_SSL_CERTFILE": None, "KAFKA_SSL_KEYFILE": None},
                                     "refused our TLS client certificate"),
    }


@pytest.mark.parametrize("case", ["wrong_password", "unknown_ca", "plaintext_against_tls", "mtls_without_certificate"])
def test_a_refused_connection_stops_worker_and_admin_at_start_up_saying_why(broker, scratch_db, case):
    kafka, words = refusals(broker)[case]
    suffix = uuid.uuid4().hex[:8]
    env = environment(kafka, MYSQL_URL=scratch_db.url, WORKER_ID=f"sec-refused-{suffix}",
                      APP_ID=f"sec-refused-{suffix}", ORDER_EVENT_TOPIC=f"sec-refused-{suffix}",
                      DLQ_TOPIC=f"sec-refused-dlq-{suffix}", KAFKA_STARTUP_WAIT_SECONDS="5")

    started = time.monotonic()
    worker = Worker(env, f"kafka-security-{case}").start()
    try:
        code = worker.wait_exit(STARTUP_BOUND)
    finally:
        worker.kill()
    took = time.monotonic() - started
    assert code == EXIT_CONFIG, f"exit {code} after {took:.1f}s; log {worker.log_path}"
    assert words in worker.logs(), f"{words!r} not in {worker.log_path}"

    admin = run([sys.executable, "-m", "app.admin", "create-topics"], env, timeout=STARTUP_BOUND)
    assert admin.returncode == EXIT_CONFIG, admin.stdout[-2000:] + admin.stderr[-2000:]
    assert words in admin.stderr, admin.stderr[-2000:]
    for secret in {broker.password, kafka.get("KAFKA_SASL_PASSWORD")} - {None}:
        assert secret not in worker.logs() and secret not in admin.stdout + admin.stderr
