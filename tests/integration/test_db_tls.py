"""TLS to the database, against a MariaDB of this module's own that requires it
(``harness.mariadb_tls``: ``require_secure_transport=ON``, an account ``REQUIRE X509``,
certificates from throwaway CAs made at test time).

Migrations, a real worker and the CLI work over TLS and mTLS; each way it cannot work stops a
worker's start-up at once (exit 78) with one line that names the setting to fix: no TLS settings
for a server that requires TLS, a CA that did not sign the server's certificate, a client
certificate the account requires and we do not send, one the server does not trust, a server
without TLS (the shared one), a certificate for another host name (and MYSQL_SSL_VERIFY_IDENTITY
=false lets it pass). Neither driver falls back to plaintext when the server offers no TLS.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pymysql
import pytest

from app.adapters.mysql.engine import create_engine, ssl_context
from app.settings import Settings
from harness.events import event, order_no, record
from harness.mariadb_tls import DATABASE, PASSWORDS, MariaDbTls, make_certificates
from harness.services import ROOT, Worker, caught_up, connect, produce, wait_for, worker_env

EXIT_CONFIG = 78          # a setting that cannot work (app.exits)
STARTUP_BOUND = 90.0      # a refusal must end start-up well before this
FAST = {"BATCH_WITHIN_SECONDS": "0.3", "BROKER_COMMIT_INTERVAL_SECONDS": "0.5", "RETRY_BACKOFF_MS": "20,20,20"}
ANSWERS = "the database answers at"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("db-tls-certs"))


@pytest.fixture(scope="module")
def server(certs):
    db = MariaDbTls(certs)
    try:
        yield db.start()
    finally:
        db.stop()          # killed and waited for, whatever the tests did


def environment(**settings: str) -> dict[str, str]:
    """This process's environment without any MYSQL_* of its own, then ``settings``."""
    env = {k: v for k, v in worker_env().items() if not k.startswith("MYSQL_")}
    env.update({k.upper(): v for k, v in settings.items()})
    return env


def migrate(env: dict[str, str]) -> subprocess.CompletedProcess:
    # ``-m`` from the checkout: this checkout's app and migrations, whatever else is installed.
    return subprocess.run([sys.executable, "-m", "app.admin", "migrate"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def migrated(server):
    done = migrate(environment(mysql_url=server.url(), **server.tls_env(ca="ca")))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture
def workers():
    """Start workers; every one is killed and reaped after the test."""
    started: list[Worker] = []

    def start(name: str, env: dict[str, str]) -> Worker:
        worker = Worker(env, f"db-tls-{name}").start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.alive:
            worker.kill()
        if worker.proc is not None:
            worker.wait_exit(30)


def throwaway_topics(suffix: str) -> dict[str, str]:
    """Names of topics nobody creates: a worker refused at start-up never reads them."""
    return {"APP_ID": f"db-tls-{suffix}", "ORDER_EVENT_TOPIC": f"db-tls-{suffix}", "DLQ_TOPIC": f"db-tls-dlq-{suffix}"}


def test_migrations_run_over_tls_and_without_it_the_server_refuses(server, migrated):
    tables = {row["Tables_in_idem_tls"] for row in server.query(f"SHOW TABLES FROM `{DATABASE}`")}
    assert {"alembic_version", "t_idem", "t_order", "t_compensation"} <= tables
    assert "Running upgrade" in migrated.stderr          # it did run here, over TCP, so over TLS

    plain = migrate(environment(mysql_url=server.url()))
    said = plain.stdout + plain.stderr
    assert plain.returncode != 0
    assert "cannot use the database: the database server at 127.0.0.1" in plain.stderr, said[-3000:]
    assert "require_secure_transport=ON" in plain.stderr and "set MYSQL_SSL_CA" in plain.stderr
    assert "Traceback" not in said and PASSWORDS["app"] not in said


def test_a_worker_processes_events_over_mtls_end_to_end_and_the_cli_reads_over_tls(server, migrated, topics,
                                                                                   workers):
    pair = topics(partitions=2)
    env = environment(mysql_url=server.url("mtls"), worker_id="db-tls-e2e", **pair.env(), **FAST,
                      **server.tls_env(ca="ca", cert="client", key="client.key"))
    worker = workers("e2e", env)
    orders = [order_no(prefix="TLS") for _ in range(20)]
    asyncio.run(produce(Settings(), pair.events,
                        [record(event(o, t)) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID")]))

    paid = f"SELECT COUNT(*) AS n FROM `{DATABASE}`.t_order WHERE status = 2 AND order_no IN %s"
    wait_for(lambda: server.query(paid, orders)[0]["n"] == len(orders), timeout=120,
             what="every order paid in the TLS database", workers=[worker])
    wait_for(lambda: caught_up(Settings(), pair.events, pair.group, 2), timeout=60, what="everything committed",
             workers=[worker])
    done = f"SELECT COUNT(*) AS n FROM `{DATABASE}`.t_idem WHERE status = 2 AND biz_key LIKE %s"
    assert server.query(done, "%TLS%")[0]["n"] == 2 * len(orders)
    logs = worker.logs()
    assert f"{ANSWERS} 127.0.0.1:{server.port} over TLS (" in logs
    assert "client certificate" in logs and "TCP keepalive not set" not in logs
    assert PASSWORDS["mtls"] not in logs

    # The CLI goes through the runtime's engine: TLS with the CA alone for the account without X509.
    cli = subprocess.run([str(Path(sys.executable).with_name("faust")), "-A", "app", "dlq", "list"], cwd=ROOT,
                         env=environment(mysql_url=server.url(), **pair.env(), **server.tls_env(ca="ca")),
                         capture_output=True, text=True, timeout=180)
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert "compensation queue" in cli.stdout
    assert worker.stop() == 0



def test_a_command_the_database_refuses_says_which_setting_without_a_traceback(server, migrated):
    for command in (["dlq", "list"], ["recovery", "status"], ["budget", "--current"]):
        cli = subprocess.run([str(Path(sys.executable).with_name("faust")), "-A", "app", *command], cwd=ROOT,
                             env=environment(mysql_url=server.url()), capture_output=True, text=True, timeout=180)
        said = cli.stdout + cli.stderr
        assert cli.returncode != 0 and "Traceback" not in said, (command, said[-3000:])
        assert "cannot use the database: the database server at 127.0.0.1" in cli.stderr, (command, said[-3000:])
        assert "set MYSQL_SSL_CA" in cli.stderr and PASSWORDS["app"] not in said


REFUSALS = {
    # case: (account, certificates (names in the certificate folder), words the start-up line must have)
    "no_tls_settings": ("app", {}, ["refused user 'app' (error 1045", "require_secure_transport=ON",
                                    "set MYSQL_SSL_CA"]),
    "wrong_ca": ("app", {"ca": "other-ca"}, ["is not signed by a CA we trust", "Set MYSQL_SSL_CA"]),
    "client_certificate_missing": ("mtls", {"ca": "ca"}, ["refused user 'mtls' (error 1045", "REQUIRE X509",
                                                          "MYSQL_SSL_CERT and MYSQL_SSL_KEY are unset"]),
    "client_certificate_refused": ("mtls", {"ca": "ca", "cert": "other-client", "key": "other-client.key"},
                                   ["refused our TLS client certificate", "MYSQL_SSL_CERT is not signed"]),
}


def assert_refused_at_start_up(worker: Worker, words: list[str], secret: str | None = None) -> None:
    started = time.monotonic()
    code = worker.wait_exit(STARTUP_BOUND)
    logs = worker.logs()
    assert code == EXIT_CONFIG, f"exit {code} after {time.monotonic() - started:.1f}s; log {worker.log_path}"
    [line] = [line for line in logs.splitlines() if "cannot start:" in line]
    missing = [w for w in words if w not in line]
    assert not missing, f"{missing} not in the start-up line: {line}"
    assert "waiting for the database" not in logs            # a refusal is not waited out
    assert secret is None or secret not in logs


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_connection_stops_the_worker_at_start_up_saying_which_setting(server, workers, case):
    account, certificates, words = REFUSALS[case]
    env = environment(mysql_url=server.url(account), worker_id=f"db-tls-{case}", **throwaway_topics(case),
                      **server.tls_env(**certificates))
    assert_refused_at_start_up(workers(case, env), words, secret=PASSWORDS[account])


def test_a_server_without_tls_is_refused_when_tls_is_asked_for(server, scratch_db, workers):
    """The shared MariaDB has TLS off: asked for TLS, the worker does not talk to it in plaintext."""
    env = environment(mysql_url=scratch_db.url, worker_id="db-tls-no-server-tls", **throwaway_topics("no-tls"),
                      **server.tls_env(ca="ca"))
    assert_refused_at_start_up(workers("server-without-tls", env), ["does not offer TLS, which MYSQL_SSL_* asks for"])


def test_a_certificate_for_another_host_fails_unless_the_host_name_check_is_off(server, migrated, topics, workers):
    pair = topics(partitions=1)
    server.serve_certificate("elsewhere")         # DNS:db.example.net only; MYSQL_URL says 127.0.0.1
    try:
        base = dict(mysql_url=server.url(), **pair.env(), **server.tls_env(ca="ca"))
        checked = workers("host-checked", environment(worker_id="db-tls-host-checked", **base))
        assert_refused_at_start_up(checked, ["does not name the host '127.0.0.1' of MYSQL_URL",
                                             "MYSQL_SSL_VERIFY_IDENTITY=false"])

        unchecked = workers("host-unchecked", environment(worker_id="db-tls-host-unchecked",
                                                          mysql_ssl_verify_identity="false", **base))
        unchecked.wait_log(f"{ANSWERS} 127.0.0.1:{server.port} over TLS (", timeout=STARTUP_BOUND)
        assert "host name NOT checked" in unchecked.logs()
        # Stopped once it works, not while its group is joining: uvloop may crash a worker stopped in
        # that second (docs, The event loop; SIGSEGV in 3 of 27 runs of this test that did).
        unchecked.wait_log("Worker ready", timeout=STARTUP_BOUND)
        assert unchecked.stop() == 0
    finally:
        server.serve_certificate("server")


def test_a_server_that_does_not_answer_is_waited_for_then_the_worker_starts_anyway(server, workers):
    """Not a refusal: the check waits up to INFRA_RETRY_BUDGET_SECONDS, a line per attempt, then
    leaves the database to the batches' own outage handling (which stops a worker, exit 70, once a
    batch has waited out its budget)."""
    env = environment(mysql_url=f"mysql+aiomysql://app:{PASSWORDS['app']}@127.0.0.1:1/{DATABASE}",
                      worker_id="db-tls-unanswered", infra_retry_budget_seconds="3", **throwaway_topics("unanswered"),
                      **server.tls_env(ca="ca"))
    worker = workers("unanswered", env)
    worker.wait_log("starting anyway: batches wait for the database", timeout=STARTUP_BOUND)
    logs = worker.logs()
    assert logs.count("waiting for the database (127.0.0.1:1)") >= 2 and "cannot start" not in logs
    assert worker.alive


def test_no_driver_falls_back_to_plaintext_when_the_server_offers_no_tls(server, scratch_db):
    """Left to themselves, aiomysql and PyMySQL log in without TLS when the server does not offer it."""
    settings = Settings(mysql_url=scratch_db.url, mysql_ssl_ca=str(server.certs / "ca.pem"))

    async def through_the_engine() -> None:
        engine = create_engine(settings, pool_size=1, max_overflow=0)
        try:
            async with engine.connect():
                pass
        finally:
            await engine.dispose()

    with pytest.raises(Exception) as aio:
        asyncio.run(through_the_engine())
    assert getattr(aio.value, "orig", None) is not None and aio.value.orig.args[0] == 2026, repr(aio.value)
    with pytest.raises(pymysql.err.OperationalError) as sync:
        connect(scratch_db.url, tls=ssl_context(settings))
    assert sync.value.args[0] == 2026 and "does not offer it" in sync.value.args[1]
