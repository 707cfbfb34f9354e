"""Every GET route of a real worker's web server, ours and Faust's own, read with the viewer's token: none
answers with a whole idempotency token. The routes are read from the app itself, so a view added later
is read too (and this test fails until it knows how to fill the new view's parameters). The worker holds
tokens everywhere a view may show one: a waybill refused with its ``Idempotency-Key`` repeated back and
an SMS with its ``client_ref`` (dead letters, steps, error groups), and a duplicate waybill that the
reconcile timer found (a run's report and a case, with the waybills' keys and the steps' tokens in their
evidence). An operator reads a report and a case whole, each look written to the audit of unmasked views.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote

import pytest

from harness.console import call, served_worker
from harness.events import event, order_no, record
from harness.services import ROOT, ScratchDatabase, Worker, wait_for

TOKEN = "operator-token-for-routes"
READ_TOKEN = "viewer-token-for-routes"
TIMER = {"RECONCILE_EVERY_SECONDS": "1", "RECONCILE_LAG_SECONDS": "0", "RECONCILE_WINDOW_SECONDS": "600"}
# Our data views: a viewer's answer says it is masked. Faust's own (/router/, /table/, /) answer as Faust
# does (a table this app does not have: its 500), and carry no token either.
DATA_VIEWS = ("/compensation", "/orders", "/idem", "/groups", "/bulk", "/reconcile", "/overview", "/providers",
              "/skipped")
# The GET routes of the worker's web server, as the app registers them (Faust's own included).
ROUTES = ("import json; from app.main import app; web = app.web; web.init_server(); "
          "print(json.dumps(sorted({r.resource.canonical for r in web.web_app.router.routes() if r.method == 'GET'})))")


@dataclass
class Site:
    base: str
    worker: Worker
    db: object
    orders: tuple[str, ...]

    def tokens(self) -> list[str]:
        rows = self.db.query("SELECT idem_token FROM t_idem WHERE " + " OR ".join(["biz_key LIKE %s"] * len(self.orders)),
                             *(f"{order}:%" for order in self.orders))
        return sorted({row["idem_token"] for row in rows if row["idem_token"]})

    def values(self) -> dict[str, list[str]]:
        """What to put in each route's parameters: every thing of each kind the worker holds."""
        def ids(sql: str, *params) -> list[str]:
            return [str(next(iter(row.values()))) for row in self.db.query(sql, *params)]
        group = self.worker.env["APP_ID"]
        _, groups = call("GET", f"{self.base}/groups/?status=all", token=TOKEN)
        _, jobs = call("GET", f"{self.base}/bulk/", token=TOKEN)
        return {"row_id": ids("SELECT id FROM t_compensation WHERE consumer_group = %s", group),
                "order_no": list(self.orders),
                "biz_key": ids("SELECT biz_key FROM t_idem WHERE " + " OR ".join(["biz_key LIKE %s"] * len(self.orders)),
                               *(f"{order}:%" for order in self.orders)),
                "fingerprint": [g["fingerprint"] for g in groups["groups"]],
                "job_id": [str(job["id"]) for job in jobs["items"]],
                "run_id": ids("SELECT id FROM t_reconcile_run WHERE consumer_group = %s", group),
                "case_id": ids("SELECT id FROM t_reconcile_case WHERE consumer_group = %s", group),
                "action": ["record"], "command": ["pause"],
                "name": ["none"], "key": ["none"]}                     # Faust's tables: this app has none

    def audit(self) -> list[tuple[str, str]]:
        rows = self.db.query("SELECT actor, what FROM t_view_audit WHERE consumer_group = %s ORDER BY id",
                             self.worker.env["APP_ID"])
        return [(row["actor"], row["what"]) for row in rows]


@pytest.fixture(scope="module")
def routes_db(settings):
    """A database of the module's own: the reconcile reads every receipt of its window, whichever test
    wrote it, and the cases the site waits for must not be crowded out by other tests' findings."""
    db = ScratchDatabase(settings.database.url).create()
    yield db
    db.drop()


@pytest.fixture(scope="module")
def site(settings, routes_db):
    scratch_db = routes_db
    duplicated, refused, cancelled = order_no(prefix="RTDUP"), order_no(prefix="RTREF"), order_no(prefix="RTSMS")
    docs = [event(o, t) for o in (duplicated, refused) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    docs += [event(cancelled, "ORDER_CREATED"), event(cancelled, "ORDER_CANCEL")]
    faults = {"waybill": {"ignore_idempotency_key": True, "reset_next": 1, "echo_orders": [refused]},
              "sms": {"echo_orders": [cancelled]}}
    with served_worker(settings, scratch_db, "routes", [record(d) for d in docs], fakes=faults, WEB_TOKEN=TOKEN,
                       WEB_READ_TOKEN=READ_TOKEN, RETRY_BACKOFF_MS="20,20,20", DLQ_RETRY_AFTER_SECONDS="0",
                       COMPENSATION_BACKOFF_SECONDS="3600", **TIMER) as served:
        s = Site(served.base, served.worker, scratch_db, (duplicated, refused, cancelled))

        def ready():
            try:
                _, cases = call("GET", f"{s.base}/reconcile/cases/", token=TOKEN)
                _, runs = call("GET", f"{s.base}/reconcile/runs/", token=TOKEN)
            except OSError:                  # not serving yet
                return False
            letters = scratch_db.query("SELECT order_no FROM t_compensation WHERE consumer_group = %s",
                                       s.worker.env["APP_ID"])
            return ({c["order_no"] for c in cases["items"]} >= {duplicated} and any(r["findings"] for r in runs["runs"])
                    and {row["order_no"] for row in letters} >= {refused, cancelled})
        wait_for(ready, timeout=120, what="a reconcile case and the dead letters", workers=[s.worker])
        job = {"action": "resolve", "filter": {"order_no": refused}}       # a bulk job, for /bulk/{job_id}
        _, dry = call("POST", f"{s.base}/bulk/dry-run", token=TOKEN, body=json.dumps(job).encode())
        status, made = call("POST", f"{s.base}/bulk/", token=TOKEN,
                            body=json.dumps({**job, "expected_count": dry["count"]}).encode())
        assert status == 201, made
        yield s


def routes(worker: Worker) -> list[str]:
    done = subprocess.run([sys.executable, "-c", ROUTES], cwd=ROOT, env=worker.env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def paths(route: str, values: dict[str, list[str]]) -> list[str]:
    """``route`` with each of its parameters filled with every value the site holds of it."""
    found = [route]
    for name in [part[1:-1] for part in route.split("/") if part.startswith("{")]:
        assert name in values, f"a new view {route}: tell this test what to put in {{{name}}}"
        assert values[name], f"the site holds no {name} for {route}"
        found = [p.replace(f"{{{name}}}", quote(v, safe="")) for p in found for v in values[name]]
    return found


def test_a_viewer_gets_no_whole_token_from_any_route(site):
    tokens = site.tokens()
    assert len(tokens) >= 3                           # the waybills' and the SMS's, each on some view below
    values = site.values()
    asked = []
    for route in routes(site.worker):
        for path in paths(route, values):
            status, raw = get(site.base + path, READ_TOKEN)
            asked.append((path, status))
            text = raw.decode("utf-8", "replace")
            assert [t for t in tokens if t in text or t[:16] in text] == [], (path, text[:2000])
            if route.startswith(DATA_VIEWS):
                assert status in (200, 403, 404), (path, status, raw[:300])
                assert status != 200 or json.loads(text)["masked"] is True, path
    reports = [path for path, status in asked if path.startswith("/reconcile/runs/") and status == 200]
    assert len(reports) >= 2 and any(p.startswith("/reconcile/cases/") and s == 200 for p, s in asked)
    # The tokens were there to be shown: an operator reads the run that found the duplicate whole.
    runs = [call("GET", f"{site.base}/reconcile/runs/{run}/", token=TOKEN)[1] for run in values["run_id"]]
    whole = json.dumps([run for run in runs if run["findings"]])
    assert any(token in whole for token in tokens)


def test_an_operators_read_of_a_report_or_a_case_is_audited(site):
    values = site.values()
    before = len(site.audit())
    run, case = values["run_id"][0], values["case_id"][0]
    status, report = call("GET", f"{site.base}/reconcile/runs/{run}/", token=TOKEN, headers={"X-Actor": "alice"})
    assert status == 200 and report["masked"] is False
    status, found = call("GET", f"{site.base}/reconcile/cases/{case}", token=TOKEN, headers={"X-Actor": "alice"})
    assert status == 200 and found["masked"] is False
    assert call("GET", f"{site.base}/reconcile/runs/{run}/", token=READ_TOKEN)[0] == 200       # masked: not audited
    assert site.audit()[before:] == [("web:alice", "reconcile_run"), ("web:alice", "reconcile_case")]


def get(url: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
