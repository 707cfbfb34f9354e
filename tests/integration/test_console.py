"""The compensation queue as people use it, on a real worker: the JSON views, their
security, the console in a real headless Chromium, and the CLI.

One worker serves the whole module (the queue lives in MySQL; the tests act on
different rows). Its dead letters: a CONFIRM the logistics API refuses with 500s, a
PAID that contradicts an earlier one, and a record whose order number carries HTML.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from harness import console
from harness.console import chromium, served_worker
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import LOGS, ROOT, Worker, wait_for

TOKEN = "s3cret-token-for-tests"
READ_TOKEN = "a-token-that-only-reads"
READER = object()          # call()'s default: a GET carries TOKEN, anything else no token
XSS = '<img src=x onerror="window.__xss=1">'


@dataclass
class Desk:
    base: str
    worker: Worker
    fakes: FakesProcess
    db: object
    events_topic: str
    failing: str          # the order whose CONFIRM is dead-lettered (logistics answers 500)
    mismatch: str         # the order whose second PAID contradicts the first

    def rows(self) -> dict[str, dict]:
        rows = self.db.query("SELECT id, reason, status, order_no, redrives FROM t_compensation WHERE src_topic = %s",
                             self.events_topic)
        return {row["reason"]: row for row in rows}


def call(method: str, url: str, *, token: str | None | object = READER, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict]:
    if token is READER:
        token = TOKEN if method == "GET" else None
    return console.call(method, url, token=token, body=body, headers=headers)


@pytest.fixture(scope="module")
def desk(settings, scratch_db):
    failing, mismatch = order_no(prefix="CONS"), order_no(prefix="CONSMIS")
    docs = [event(o, t) for o in (failing, mismatch) for t in ("ORDER_CREATED", "ORDER_PAID")]
    docs += [event(failing, "ORDER_CONFIRM"), event(mismatch, "ORDER_PAID", data={"amount_cents": 1})]
    hostile = event(order_no(prefix="CONSX"), "ORDER_CREATED")
    hostile["order_no"] = f"ORD-20261129-{XSS}"
    records = [record(d) for d in docs] + [(b"ORD-XSS", json.dumps(hostile).encode())]
    with served_worker(settings, scratch_db, "console", records,
                       fakes={"waybill": {"fail_orders": [failing], "fail_status": 500}},
                       WEB_TOKEN=TOKEN, WEB_READ_TOKEN=READ_TOKEN, RETRY_BACKOFF_MS="20,20,20",
                       DLQ_RETRY_AFTER_SECONDS="0", COMPENSATION_BACKOFF_SECONDS="3600",
                       WEB_MAX_BODY_BYTES="2048") as served:
        d = Desk(served.base, served.worker, served.fakes, scratch_db, served.topics.events, failing, mismatch)
        # The compensator tries the CONFIRM once (still 500: open, next retry in an hour); the
        # mismatch and the hostile record go to a person at once.
        wait_for(lambda: {r: (row["status"], row["redrives"]) for r, row in d.rows().items()} == {
            "effect_unavailable": (1, 1), "payload_mismatch": (4, 0), "bad_order_no": (4, 0)}, timeout=120,
            what="the dead letters worked once", workers=[d.worker])
        yield d


# -- the JSON views ------------------------------------------------------------------

def test_the_queue_lists_filters_pages_and_counts(desk):
    status, page = call("GET", f"{desk.base}/compensation/?limit=2")
    assert status == 200 and len(page["items"]) == 2 and page["next_before"] == page["items"][-1]["id"]
    status, rest = call("GET", f"{desk.base}/compensation/?limit=2&before={page['next_before']}")
    ids = [item["id"] for item in page["items"] + rest["items"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids) >= 3
    status, manual = call("GET", f"{desk.base}/compensation/?status=manual&reason=payload_mismatch"
                                 f"&order_no={desk.mismatch}")
    assert [item["order_no"] for item in manual["items"]] == [desk.mismatch]
    status, others = call("GET", f"{desk.base}/compensation/?status=open&order_no={desk.mismatch}")
    assert others["items"] == []
    status, mine = call("GET", f"{desk.base}/compensation/?order_no={desk.failing}&older_than=0")
    assert [item["reason"] for item in mine["items"]] == ["effect_unavailable"]
    assert page["counts"]["by_status"]["manual"] >= 2 and page["counts"]["by_reason_unsettled"]["payload_mismatch"]


@pytest.mark.parametrize("query", ["status=closed", "reason=x'%20OR%201=1%20--", "order_no=<script>",
                                   "limit=0", "limit=9999", "before=-1", "older_than=1e9", "order_no=ORD%27--",
                                   "fingerprint=XYZ", "fingerprint=0123", "since=yesterday", "until=2026-13-01"])
def test_filters_that_are_not_what_they_should_be_are_refused(desk, query):
    status, answer = call("GET", f"{desk.base}/compensation/?{query}")
    assert status == 400 and answer["error"]


def test_an_entry_shows_its_record_history_steps_and_order(desk):
    row = desk.rows()["effect_unavailable"]
    status, entry = call("GET", f"{desk.base}/compensation/{row['id']}")
    assert status == 200 and entry["status"] == "open" and entry["order"]["status"] == "confirmed"
    assert json.loads(entry["record"]["value"]["text"])["type"] == "ORDER_CONFIRM"
    assert [step["biz_key"].split(":")[-1] for step in entry["idem"]] == ["issue_waybill", "mark_confirmed"]
    assert [h["action"] for h in entry["history"]] == ["redrive"] and entry["history"][0]["to_status"] == "open"
    assert call("GET", f"{desk.base}/compensation/999999999")[0] == 404
    assert call("GET", f"{desk.base}/compensation/abc")[0] == 400


def test_actions_need_the_token(desk):
    row = desk.rows()["payload_mismatch"]
    url = f"{desk.base}/compensation/{row['id']}/resolve"
    assert call("POST", url, body=b"{}")[0] == 401
    assert call("POST", url, body=b"{}", token="wrong")[0] == 401
    assert call("POST", url, body=b"{}", headers={"Authorization": TOKEN})[0] == 401          # not "Bearer ..."
    status, answer = call("POST", url, body=b"x" * 4096, token=TOKEN)
    assert status == 413 and "2048" in answer["error"]
    assert call("POST", url, body=b"[1, 2]", token=TOKEN)[0] == 400
    assert call("POST", url, body=json.dumps({"actor": "<b>"}).encode(), token=TOKEN)[0] == 400
    assert call("POST", f"{desk.base}/compensation/{row['id']}/explode", body=b"{}", token=TOKEN)[0] == 404
    assert desk.rows()["payload_mismatch"]["status"] == 4                    # nothing happened


def test_resolve_is_idempotent_and_audited(desk):
    row = desk.rows()["payload_mismatch"]
    url = f"{desk.base}/compensation/{row['id']}/resolve"
    body = json.dumps({"note": "refunded the difference", "actor": "alice"}).encode()
    status, first = call("POST", url, body=body, token=TOKEN)
    assert (status, first["changed"], first["status"]) == (200, True, "resolved")
    status, again = call("POST", url, body=body, token=TOKEN)
    assert (status, again["changed"], again["status"]) == (200, False, "resolved")
    status, refused = call("POST", f"{desk.base}/compensation/{row['id']}/discard", body=b"{}", token=TOKEN)
    assert status == 409 and "resolved" in refused["error"]
    [audit] = desk.db.query("SELECT actor, action, note FROM t_compensation_audit WHERE compensation_id = %s "
                            "AND action = 'resolve'", row["id"])
    assert audit == {"actor": "web:alice", "action": "resolve", "note": "refunded the difference"}


def test_without_a_configured_token_actions_are_refused_with_the_way_to_set_one(settings, scratch_db, topics,
                                                                                spawn_worker):
    pair = topics(partitions=1)
    worker = spawn_worker(pair, WEB_TOKEN="")
    base = f"http://127.0.0.1:{worker.web_port}"
    def up() -> bool:
        try:
            return call("GET", f"{base}/healthz")[0] == 200
        except OSError:
            return False

    wait_for(up, timeout=60, what="the web server", workers=[worker])
    status, answer = call("POST", f"{base}/compensation/1/retry", body=b"{}", token="anything")
    assert status == 403 and "set WEB_TOKEN" in answer["error"]
    status, answer = call("GET", f"{base}/compensation/", token="anything")
    assert status == 403 and "set WEB_READ_TOKEN" in answer["error"]


def test_the_data_views_need_a_token_and_a_host_of_ours(desk):
    """Phone numbers, addresses and whole records were served to anyone who reached the port."""
    row = desk.rows()["payload_mismatch"]
    data = ["/compensation/", f"/compensation/{row['id']}", f"/orders/{desk.failing}", "/idem/stuck/",
            f"/idem/{desk.failing}:ORDER_CONFIRM:issue_waybill", "/", "/router/", "/stats/"]   # Faust's own too
    for path in data:
        assert call("GET", desk.base + path, token=None)[0] == 401, path
        assert call("GET", desk.base + path, token="wrong")[0] == 401, path
    for token in (TOKEN, READ_TOKEN):
        assert call("GET", f"{desk.base}/compensation/", token=token)[0] == 200
    url = f"{desk.base}/compensation/{row['id']}/resolve"
    assert call("POST", url, body=b"{}", token=READ_TOKEN)[0] == 401                # reading is not acting
    assert desk.rows()["payload_mismatch"]["status"] == row["status"]
    for path in ("/healthz", "/health", "/readyz", "/metrics", "/console/", "/console/console.js"):
        assert _status(desk.base + path) == 200, path                              # open, no data in them
    # A page on another site that resolves its name to this machine (DNS rebinding) gets nothing.
    evil = {"Host": "attacker.example:6066"}
    assert call("GET", f"{desk.base}/compensation/", headers=evil)[0] == 421
    assert call("GET", f"{desk.base}/console/", headers=evil)[0] == 421
    assert _status(f"{desk.base}/metrics", headers=evil) == 200                   # scrapers use any name
    assert call("GET", f"{desk.base}/compensation/", headers={"Host": f"localhost:{desk.worker.web_port}"})[0] == 200


def _status(url: str, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_readiness_says_what_is_down_never_why_and_the_console_cannot_be_framed(desk):
    status, ready = call("GET", f"{desk.base}/readyz", token=None)
    assert set(ready["checks"].values()) <= {"ok", "unreachable", "running", "crashed", "not started"}, ready
    response = urllib.request.urlopen(f"{desk.base}/console/", timeout=30)
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_health_readiness_orders_and_steps(desk):
    assert call("GET", f"{desk.base}/healthz") == (200, {"ok": True})
    status, ready = call("GET", f"{desk.base}/readyz")
    assert status == 200 and ready["ready"] and ready["checks"]["mysql"] == "ok" and ready["checks"]["kafka"] == "ok"
    assert ready["checks"]["agent order_events"] == "running" and ready["checks"]["agent compensator"] == "running"
    status, timeline = call("GET", f"{desk.base}/orders/{desk.failing}")
    assert status == 200 and timeline["order"]["status"] == "confirmed"
    assert {step["biz_key"].split(":")[-1] for step in timeline["steps"]} >= {"create_order", "mark_paid",
                                                                               "mark_confirmed", "issue_waybill"}
    assert [letter["reason"] for letter in timeline["dead_letters"]] == ["effect_unavailable"]
    assert (timeline["dead_letters_total"], timeline["dead_letters_capped"]) == (1, False)
    assert timeline["dead_letters_all"] == f"/compensation/?order_no={desk.failing}"
    key = f"{desk.failing}:ORDER_CONFIRM:issue_waybill"
    status, step = call("GET", f"{desk.base}/idem/{key}")
    assert status == 200 and step["status"] == "pending" and step["outcome"] == "effect_unavailable"
    assert call("GET", f"{desk.base}/idem/not-a-key")[0] == 400
    assert call("GET", f"{desk.base}/orders/ORD-20261129-NOBODY")[0] == 404
    status, stuck = call("GET", f"{desk.base}/idem/stuck/")
    assert status == 200 and stuck["older_than_seconds"] == 600 and isinstance(stuck["rows"], list)


# -- the console, in a real browser ------------------------------------------------------

def test_the_console_finds_a_dead_letter_and_retries_it_to_compensated(desk):
    desk.fakes.configure({"waybill": {"fail_orders": []}})                 # the logistics API is back
    shot = LOGS / "console.png"
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page()
            page.goto(f"{desk.base}/console/")
            page.fill("#token", TOKEN)
            page.dispatch_event("#token", "change")
            page.click("nav a[data-nav=queue]")                          # the overview comes first
            page.fill("input[name=order_no]", desk.failing)
            page.click("#search")
            page.wait_for_selector(f"#queue tbody tr:has-text('{desk.failing}')")
            page.click(f"#queue tbody tr:has-text('{desk.failing}')")
            page.wait_for_selector("#detail-status:has-text('open')")
            page.fill("#note", "logistics is back")
            page.click("#retry")
            page.wait_for_selector("#detail-status:has-text('compensated')", timeout=30_000)
            assert "compensated" in page.text_content("#notice")
            page.wait_for_selector("#history tbody tr:has-text('web:console')")

            # A stored value with HTML in it is text on the page, never markup.
            page.fill("input[name=order_no]", "")
            page.select_option("select[name=status]", "manual")
            page.fill("input[name=reason]", "bad_order_no")
            page.click("#search")
            page.click("#queue tbody tr:has-text('bad_order_no')")
            page.wait_for_selector("#detail-record:has-text('onerror')")
            assert '<img src=x onerror=' in page.text_content("#detail-record")       # as text
            assert page.evaluate("window.__xss") is None and page.query_selector("#detail img") is None
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    assert desk.rows()["effect_unavailable"]["status"] == 3
    assert len(desk.fakes.ledger()["waybills"][desk.failing]) == 1


# -- the CLI ---------------------------------------------------------------------------

def dlq(desk, *args: str) -> subprocess.CompletedProcess:
    faust = Path(sys.executable).with_name("faust")
    return subprocess.run([str(faust), "-A", "app", "dlq", *args], cwd=ROOT, env=desk.worker.env,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_lists_shows_and_acts_with_the_same_audit_trail(desk):
    row = desk.rows()["bad_order_no"]
    listed = dlq(desk, "list", "--status", "manual", "--reason", "bad_order_no")
    assert listed.returncode == 0 and f"| {row['id']} " in listed.stdout, listed.stderr[-2000:]
    [fingerprint] = desk.db.query("SELECT fingerprint FROM t_compensation WHERE id = %s", row["id"])
    grouped = dlq(desk, "list", "--fingerprint", fingerprint["fingerprint"], "--since", "2000-01-01T00:00:00Z",
                  "--older-than", "0")
    assert grouped.returncode == 0 and f"| {row['id']} " in grouped.stdout, grouped.stderr[-2000:]
    later = dlq(desk, "list", "--fingerprint", fingerprint["fingerprint"], "--since", "2999-01-01T00:00:00Z")
    assert later.returncode == 0 and f"| {row['id']} " not in later.stdout, later.stderr[-2000:]
    shown = dlq(desk, "show", str(row["id"]))
    assert shown.returncode == 0 and json.loads(shown.stdout[shown.stdout.index("{"):])["reason"] == "bad_order_no"
    done = dlq(desk, "discard", str(row["id"]), "--note", "garbage from a test", "--actor", "bob")
    assert done.returncode == 0 and json.loads(done.stdout[done.stdout.index("{"):])["status"] == "discarded"
    again = dlq(desk, "resolve", str(row["id"]), "--actor", "bob")
    assert again.returncode != 0 and "cannot resolve a row that is discarded" in again.stdout
    [audit] = desk.db.query("SELECT actor, action, note FROM t_compensation_audit WHERE compensation_id = %s "
                            "AND action = 'discard'", row["id"])
    assert audit == {"actor": "cli:bob", "action": "discard", "note": "garbage from a test"}
