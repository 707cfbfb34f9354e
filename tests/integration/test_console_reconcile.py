"""The reconcile as a person meets it on the console, in a real headless Chromium: a worker whose
logistics API ignores idempotency keys (the seed's incident) issues two waybills for one order; the
worker's own timer reconciles, its run shows the duplicate, and an operator cancels the extra one
from the case, once, after typing its waybill."""

from __future__ import annotations

import json

from playwright.sync_api import sync_playwright

from harness.console import call, chromium, served_worker
from harness.events import event, order_no, record
from harness.services import LOGS, wait_for

TOKEN = "s3cret-token-for-reconcile-tests"


def test_a_duplicate_waybill_is_shown_and_its_extra_cancelled_once_from_the_console(settings, own_db):
    o = order_no(prefix="RCON")
    records = [record(event(o, t)) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    faults = {"waybill": {"ignore_idempotency_key": True, "reset_next": 1}}
    timer = {"RECONCILE_EVERY_SECONDS": "1", "RECONCILE_LAG_SECONDS": "0", "RECONCILE_WINDOW_SECONDS": "600"}
    with served_worker(settings, own_db, "reconcile", records, fakes=faults, WEB_TOKEN=TOKEN, **timer) as served:
        def cases():
            try:
                status, answer = call("GET", f"{served.base}/reconcile/cases/", token=TOKEN)
            except OSError:                  # not serving yet
                return None
            assert status == 200
            return [c for c in answer["items"] if c["order_no"] == o]

        [case] = wait_for(cases, timeout=90, what="the duplicate filed as a case", workers=[served.worker])
        waybills = served.fakes.ledger()["waybills"][o]
        assert case["kind"] == "duplicate" and len(waybills) == 2 and case["reference"] in waybills
        shot = LOGS / "console-reconcile.png"
        with sync_playwright() as p:
            browser = chromium(p)
            try:
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(f"{served.base}/console/")
                page.fill("#actor", "alice")
                page.fill("#token", TOKEN)
                page.dispatch_event("#token", "change")
                page.click("nav a[data-nav=reconcile]")                  # the overview comes first
                page.click("#reconcile-runs tbody tr.reconcile-run:has-text('findings')")
                page.wait_for_selector(f"#reconcile-findings tr.provider:has-text('{o}')")
                assert "provider duplicate" in page.text_content(f"#reconcile-findings tr.provider:has-text('{o}')")
                row = f"#reconcile-cases tbody tr.reconcile-case:has-text('{case['reference']}')"
                page.click(f"{row} button:has-text('compensate')")
                page.fill("#case-confirm-reference", case["reference"])
                page.fill("#case-confirm-note", "the provider ignored the key")
                page.click("#case-confirm-yes")
                page.wait_for_selector(f"{row} td.status:has-text('compensated')")
                page.screenshot(path=str(shot), full_page=True)
                assert not errors
            finally:
                browser.close()
        ledger = served.fakes.ledger()
        assert [c["waybill_no"] for c in ledger["cancels"]] == [case["reference"]]
        status, again = call("POST", f"{served.base}/reconcile/cases/{case['id']}/compensate", token=TOKEN,
                             body=json.dumps({"confirm": case["reference"], "note": "again", "actor": "bob"}).encode())
        assert status == 409 and len(served.fakes.ledger()["cancels"]) == 1
