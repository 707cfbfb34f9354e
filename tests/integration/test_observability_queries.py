"""Every query of the Grafana dashboard and every alert rule's expression, run by a real Prometheus
against a real worker's /metrics.

Debian's ``prometheus`` (``make test-tools``) runs on a free port with a data directory of its own,
scraping one real ``faust -A app worker`` every second (job ``order-event-processor``, as in
deploy/prometheus/prometheus.yml) and loading deploy/prometheus/rules.yml. The worker is given
traffic that leaves a series behind every query: orders created, paid and confirmed (waybills,
SMS, batches), a CONFIRM the logistics API refuses with 500s (an external error, a dead letter
left ``open``), a second PAID that contradicts the first (``manual``), a pending ``t_idem``
row planted 20 minutes old (stuck), and a reconcile every second, in a database of this module's own.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from app.adapters.kafka.topics import topic_specs
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import (
    LOGS,
    ROOT,
    ScratchDatabase,
    Topics,
    Worker,
    create_topics,
    delete_topics,
    free_port,
    produce,
    wait_for,
    worker_env,
)

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "order-event-processor.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
# Grafana's variables, as Grafana would fill them in for a Prometheus scraped every 15 s.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# Rules are evaluated this far ahead of now: Prometheus finds each series' last sample within its
# 5-minute lookback, and the 1-minute steps of KafkaConsumerLagGrowing's [10m:1m] subquery then
# reach two points although the server has run for seconds.
RULES_AHEAD_SECONDS = 120


class Prometheus:
    """``prometheus`` on 127.0.0.1:<free port>, its config and data in a temporary directory."""

    def __init__(self, targets: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": "order-event-processor", "metrics_path": "/metrics",
                                      "static_configs": [{"targets": targets}]}]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: install Debian's prometheus package: make test-tools")
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"prometheus-{self.port}.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self._log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params) -> tuple[int, dict]:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")
        except OSError as exc:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited ({self.proc.returncode}); log {self.log_path}") from exc
            return 0, {}

    def query(self, expr: str, at: float | None = None) -> tuple[int, dict]:
        return self.get("/api/v1/query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def plant_stuck_row(db: ScratchDatabase) -> None:
    """A pending claim of a worker long gone, untouched for 20 minutes (STUCK_PENDING_SECONDS is 10)."""
    old = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=20)
    db.query("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
             "payload_hash, gmt_modified) VALUES (%s, CURDATE(), 'issue_waybill', 1, 1, 'gone-1/main/x', %s, "
             "'tok', 'h', %s)", f"{order_no(prefix='OBSSTUCK')}:ORDER_CONFIRM:issue_waybill", old, old)


@pytest.fixture(scope="module")
def scraped(settings):
    """A worker with traffic behind it, and a Prometheus that has scraped it."""
    db = ScratchDatabase(settings.database.url).create()
    pair = Topics(settings, partitions=2)
    specs = topic_specs(settings.model_copy(update={"order_event_partitions": 2, "dlq_partitions": 1}),
                        events=pair.events, dlq=pair.dlq)
    asyncio.run(create_topics(settings, specs))
    fakes = FakesProcess()
    failing, mismatch = order_no(prefix="OBSFAIL"), order_no(prefix="OBSMIS")
    fakes.configure({"waybill": {"fail_orders": [failing], "fail_status": 500}})
    plant_stuck_row(db)
    orders = [order_no(prefix="OBS") for _ in range(20)] + [failing]
    docs = [event(o, t) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    docs += [event(mismatch, "ORDER_CREATED"), event(mismatch, "ORDER_PAID"),
             event(mismatch, "ORDER_PAID", data={"amount_cents": 1})]
    env = worker_env(**{"MYSQL_URL": db.url, "WORKER_ID": "observability-w", **pair.env(),
                        **fakes.env(), "RETRY_BACKOFF_MS": "20,20,20",
                        "DLQ_RETRY_AFTER_SECONDS": "0", "COMPENSATION_BACKOFF_SECONDS": "3600",
                        "METRICS_REFRESH_SECONDS": "1", "RECONCILE_EVERY_SECONDS": "1"})
    worker = Worker(env, "observability").start()
    prometheus = None
    try:
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        statuses = lambda: {row["reason"]: row["status"] for row in db.query(  # noqa: E731
            "SELECT reason, status FROM t_compensation WHERE consumer_group = %s", pair.group)}
        # The compensator tries the CONFIRM once (still 500: open again, next retry in an hour);
        # the contradicting PAID goes to a person at once.
        wait_for(lambda: statuses() == {"effect_unavailable": 1, "payload_mismatch": 4}, timeout=90,
                 what="the dead letters worked once", workers=[worker])
        prometheus = Prometheus([f"127.0.0.1:{worker.web_port}"])
        wait_for(lambda: [t["health"] for t in prometheus.get("/api/v1/targets")[1]
                          .get("data", {}).get("activeTargets", [])] == ["up"],
                 timeout=30, what="a successful scrape of the worker", workers=[worker])
        yield prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        worker.stop()
        fakes.stop()
        asyncio.run(delete_topics(settings, [pair.events, pair.dlq]))
        db.drop()


def panel_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: a variable the test does not fill in: {expr}"
            found.append((f"{panel['title']} [{target['refId']}]", expr))
    return found


COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)")


UNLESS = re.compile(r"\bunless(\s+on\([^)]*\))?\s*\(")


def filters_of_unless(expr: str) -> list[tuple[int, int]]:
    """Where each ``unless [on(...)] ( ... )``'s parenthesised right-hand side is in ``expr``."""
    spans = []
    for match in UNLESS.finditer(expr):
        depth, at = 1, match.end()
        while depth and at < len(expr):
            depth += {"(": 1, ")": -1}.get(expr[at], 0)
            at += 1
        spans.append((match.end(), at))
    return spans


def with_bool_comparisons(expr: str) -> str:
    """``expr`` with every comparison outside label matchers made ``bool`` (``a > 3`` -> ``a > bool 3``),
    so that it returns its series, at 0 or 1, whether or not it fires; ``absent(x)`` becomes ``x``
    (absent has a series only when x has none). A comparison on the right of ``unless`` stays a filter:
    made ``bool``, it would keep every series there, at 0 too, and ``unless`` would drop them all."""
    expr = " ".join(expr.split())
    if expr.startswith("absent(") and expr.endswith(")"):
        expr = expr[len("absent("):-1]
    kept = filters_of_unless(expr)
    out, depth, at = [], 0, 0
    for part in re.split(r"([{}])", expr):
        start, at = at, at + len(part)
        if part == "{":
            depth += 1
        elif part == "}":
            depth -= 1
        elif depth == 0:
            part = COMPARISON.sub(lambda m, start=start: m.group(0) if any(a <= start + m.start() < b for a, b in kept)
                                  else f"{m.group(1)} bool", part)
        out.append(part)
    return "".join(out)


def rule_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule["alert"], with_bool_comparisons(rule["expr"])) for group in groups for rule in group["rules"]]


def test_bool_form_keeps_label_matchers_and_unwraps_absent():
    assert with_bool_comparisons('up{job="x"} == 0') == 'up{job="x"} == bool 0'
    assert with_bool_comparisons('a{r!="ok"} > b and on() c >= 3') == 'a{r!="ok"} > bool b and on() c >= bool 3'
    assert with_bool_comparisons('absent(up{job="x"} == 1)') == 'up{job="x"} == bool 1'
    assert (with_bool_comparisons('sum(a unless on(t, p) (max by (t, p) (b) == 1)) > 3 unless on() (max(c) == 1)')
            == 'sum(a unless on(t, p) (max by (t, p) (b) == 1)) > bool 3 unless on() (max(c) == 1)')


def results(prometheus: Prometheus, queries: list[tuple[str, str]], at=None) -> dict[str, tuple[int, dict]]:
    return {name: prometheus.query(expr, at() if at else None) for name, expr in queries}


def wait_for_series(prometheus: Prometheus, queries: list[tuple[str, str]], at=None) -> None:
    """Every query parses at once (a 400 fails the test right away), and each returns at least one
    series within the bound (the worker's gauges refresh every second, Prometheus scrapes every second)."""
    deadline = time.monotonic() + 45
    while True:
        answers = results(prometheus, queries, at)
        refused = {name: answer for name, (status, answer) in answers.items() if status != 200}
        assert refused == {}, f"queries Prometheus refused: {refused}"
        empty = sorted(name for name, (_, answer) in answers.items() if not answer["data"]["result"])
        if not empty:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"queries without a series: {[(n, dict(queries)[n]) for n in empty]}")
        time.sleep(0.5)


def test_every_dashboard_query_parses_and_returns_series(scraped):
    """Each panel target's ``expr`` of the committed dashboard, with $__rate_interval as 1m (and
    $__interval, $__range filled in), evaluated now by /api/v1/query."""
    queries = panel_queries()
    assert len(queries) >= 14
    wait_for_series(scraped, queries)


def test_every_alert_expression_parses_and_returns_series(scraped):
    """Each rule's ``expr`` of rules.yml with every comparison made ``bool`` and ``absent(x)``
    evaluated as ``x`` (``with_bool_comparisons``), so a rule that does not fire still returns its
    series; evaluated by /api/v1/query at now + 120 s (RULES_AHEAD_SECONDS). Prometheus has also
    loaded rules.yml and evaluated every rule without an error."""
    queries = rule_expressions()
    assert len(queries) >= 20          # every rule of rules.yml (a rule added is checked here without an edit)
    wait_for_series(scraped, queries, at=lambda: time.time() + RULES_AHEAD_SECONDS)

    def rules_health():
        groups = scraped.get("/api/v1/rules")[1].get("data", {}).get("groups", [])
        rules = [rule for group in groups for rule in group["rules"]]
        return len(rules) == len(queries) and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules) and rules

    rules = wait_for(rules_health, timeout=30, what="every rule evaluated once")
    assert {rule["name"]: rule["health"] for rule in rules} == {name: "ok" for name, _ in queries}
