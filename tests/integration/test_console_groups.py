"""Error groups as people use them, on a real worker: the JSON views and the console's
section in a real headless Chromium, from a group's line to its inflow chart and to the
queue filtered by it.

Its dead letters: three CONFIRMs while the logistics API answers 500 (one outage, one
group) and one it refuses with 422 (another group).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from harness.console import call, chromium, served_worker
from harness.events import event, order_no, record
from harness.services import LOGS, wait_for

TOKEN = "s3cret-token-for-group-tests"


@pytest.fixture(scope="module")
def desk(settings, scratch_db):
    down = [order_no(prefix="GRPDOWN") for _ in range(3)]
    refused = order_no(prefix="GRPREF")
    docs = [event(o, t) for o in down + [refused] for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    with served_worker(settings, scratch_db, "groups", [record(d) for d in docs],
                       fakes={"waybill": {"fail_orders": down, "fail_status": 500, "reject_orders": [refused]}},
                       WEB_TOKEN=TOKEN, RETRY_BACKOFF_MS="20,20,20", DLQ_RETRY_AFTER_SECONDS="0",
                       COMPENSATION_BACKOFF_SECONDS="3600") as served:

        def rows():
            return scratch_db.query("SELECT order_no, reason, status, redrives, fingerprint FROM t_compensation "
                                    "WHERE src_topic = %s ORDER BY order_no", served.topics.events)
        # The compensator tries each 500 once (still 500: open, next retry in an hour); the 422 is a person's.
        wait_for(lambda: sorted((r["reason"], r["status"], r["redrives"]) for r in rows()) ==
                 [("effect_rejected", 4, 0)] + [("effect_unavailable", 1, 1)] * 3, timeout=120,
                 what="the dead letters worked once", workers=[served.worker])
        outage = {r["fingerprint"] for r in rows() if r["order_no"] in down}
        assert len(outage) == 1
        yield {"base": served.base, "outage": outage.pop(), "down": down, "refused": refused}


def test_the_groups_view_lists_one_line_per_cause_and_a_group_its_inflow(desk):
    base = desk["base"]
    status, listing = call("GET", f"{base}/groups/?window=24h&status=all", token=TOKEN)
    assert status == 200
    first, second = listing["groups"][:2]
    assert first["fingerprint"] == desk["outage"]
    assert (first["letters"], first["open"], first["orders"], first["open_share"], first["detail"]) == \
        (3, 3, 3, 1.0, "500")
    assert (second["reason"], second["letters"], second["detail"]) == ("effect_rejected", 1, "422")
    assert listing["queue"]["depth"] >= 4
    status, one = call("GET", f"{base}/groups/{desk['outage']}", token=TOKEN)
    assert status == 200 and sum(p["letters"] for p in one["windows"]["7d"]["series"]) == 3
    status, queue = call("GET", f"{base}/compensation/?fingerprint={desk['outage']}", token=TOKEN)
    assert status == 200 and sorted(i["order_no"] for i in queue["items"]) == sorted(desk["down"])
    assert call("GET", f"{base}/groups/?window=1y", token=TOKEN)[0] == 400
    assert call("GET", f"{base}/groups/?status=some", token=TOKEN)[0] == 400
    assert call("GET", f"{base}/groups/not-a-print", token=TOKEN)[0] == 400
    assert call("GET", f"{base}/groups/0123456789abcdef", token=TOKEN)[0] == 404
    assert call("GET", f"{base}/groups/", token=None)[0] == 401


def test_the_console_shows_a_groups_chart_and_opens_its_queue(desk):
    shot = LOGS / "console-groups.png"
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{desk['base']}/console/")
            page.fill("#token", TOKEN)
            page.dispatch_event("#token", "change")
            page.click("nav a[data-nav=groups]")                         # the overview comes first
            line = f"#groups-table tbody tr[data-fingerprint='{desk['outage']}']"
            page.wait_for_selector(line)
            assert "queue depth" in page.text_content("#groups-queue")
            page.click(line)
            page.wait_for_selector("#chart-24h rect.bar[data-letters='3']")
            assert page.query_selector_all("#chart-24h rect.bar").__len__() == 24
            assert page.query_selector_all("#chart-7d rect.bar").__len__() >= 28
            assert "3 letters, 3 open" in page.text_content("#group-figures")
            # The queue page, the group's: its fingerprint in the filter form, its three orders listed.
            page.click("#group-queue")
            assert page.input_value("#filter-fingerprint") == desk["outage"]
            for order in desk["down"]:
                page.wait_for_selector(f"#queue tbody tr:has-text('{order}')")
            assert page.query_selector(f"#queue tbody tr:has-text('{desk['refused']}')") is None
            page.screenshot(path=str(shot), full_page=True)
            assert not errors
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
