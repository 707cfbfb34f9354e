"""The types a consumer group skipped, as a person finds them: the JSON view and the console's
section in a real headless Chromium, from records a real worker skipped (a native record and a
CloudEvent of types it does not handle), counted across its gauges' refreshes."""

from __future__ import annotations

from playwright.sync_api import sync_playwright

from harness.console import call, chromium, served_worker
from harness.events import cloudevent, event, order_no, record
from harness.services import LOGS, wait_for

TOKEN = "s3cret-token-for-skipped-tests"


def test_the_types_skipped_are_listed_with_where_the_latest_is(settings, scratch_db):
    o = order_no(prefix="SKIP")
    records = [record(event(o, "ORDER_CREATED")), record(event(o, "ORDER_PAID", type="ORDER_SHIPPED")),
               cloudevent(event(o, "ORDER_PAID"), type_name="com.shop.order.delivered"),
               record(event(o, "ORDER_PAID", type="ORDER_SHIPPED"))]
    with served_worker(settings, scratch_db, "skipped", records, WEB_TOKEN=TOKEN,
                       METRICS_REFRESH_SECONDS="0.5") as served:
        def listed():
            try:
                status, answer = call("GET", f"{served.base}/skipped/", token=TOKEN)
            except OSError:                  # not serving yet
                return None
            assert status == 200
            return {t["event_type"]: (t["skipped"], t["offset"]) for t in answer["types"]}

        wait_for(lambda: listed() == {"ORDER_SHIPPED": (2, 3), "com.shop.order.delivered": (1, 2)}, timeout=90,
                 what="both types counted in t_skipped_type", workers=[served.worker])
        assert call("GET", f"{served.base}/skipped/", token=None)[0] == 401
        shot = LOGS / "console-skipped.png"
        with sync_playwright() as p:
            browser = chromium(p)
            try:
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(f"{served.base}/console/")
                page.fill("#token", TOKEN)
                page.dispatch_event("#token", "change")
                page.click("nav a[data-nav=groups]")                     # types skipped are beside the error groups
                page.wait_for_selector("#skipped-table tbody tr.skipped-type:has-text('ORDER_SHIPPED')")
                line = page.text_content("#skipped-table tbody tr.skipped-type:has-text('ORDER_SHIPPED')")
                assert f"{served.topics.events}[0]@3" in line
                assert "UNHANDLED_EVENT_TYPES=skip" in page.text_content("#skipped-what")
                page.screenshot(path=str(shot), full_page=True)
                assert not errors
            finally:
                browser.close()
