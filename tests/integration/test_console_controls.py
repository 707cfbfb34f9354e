"""The operator controls as a person meets them on the console, in a real headless Chromium: an
operator holds the SMS effect and pauses a partition from the Controls page, the overview shows both
with who, why and until when, the worker holds them (its metrics say so), and the operator ends the
hold and resumes the partition from the same page; each step written to the audit under the person's
name. A viewer sees the controls and no form to change them."""

from __future__ import annotations

from playwright.sync_api import sync_playwright

from harness.console import call, chromium, served_worker
from harness.services import LOGS, wait_for, worker_metric

TOKEN = "s3cret-token-for-the-controls-console"
READ_TOKEN = "read-token-for-the-controls-console"


def test_an_operator_holds_an_effect_and_pauses_a_partition_from_the_console_and_ends_both(settings, own_db):
    with served_worker(settings, own_db, "controls", [], WEB_TOKEN=TOKEN, WEB_READ_TOKEN=READ_TOKEN,
                       CONTROLS_REFRESH_SECONDS="0.5") as served:
        topic = served.topics.events
        wait_for(lambda: worker_metric(served.worker, "order_controls_read_timestamp_seconds"), timeout=60,
                 what="the worker serving", workers=[served.worker])
        shot = LOGS / "console-controls.png"
        with sync_playwright() as p:
            browser = chromium(p)
            try:
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.on("dialog", lambda dialog: dialog.accept("the gateway is back" if "hold" in dialog.message
                                                               else "the stretch was fixed upstream"))
                page.goto(f"{served.base}/console/")
                page.fill("#actor", "alice")
                page.fill("#token", TOKEN)
                page.dispatch_event("#token", "change")
                page.click("nav a[data-nav=controls]")
                page.wait_for_selector("#hold-form select[name=effect] option[value=sms]", state="attached")
                page.select_option("#hold-form select[name=effect]", "sms")
                page.fill("#hold-form input[name=reason]", "the SMS gateway's maintenance")
                page.fill("#hold-form input[name=hours]", "1")
                page.check("#hold-form input[name=until_released]")
                page.click("#hold-form button[type=submit]")
                page.wait_for_selector("#controls-holds tbody tr[data-effect=sms]:has-text('until released')")
                page.fill("#pause-form input[name=partition]", "0")
                page.fill("#pause-form input[name=reason]", "an order support is looking at")
                page.click("#pause-form button[type=submit]")
                page.wait_for_selector("#controls-pauses tbody tr[data-partition='0']")
                wait_for(lambda: worker_metric(served.worker, "order_effect_held", '{effect="sms"}') == 1
                         and worker_metric(served.worker, "order_partition_paused",
                                           f'{{partition="0",topic="{topic}"}}') == 1,
                         timeout=60, what="the worker holding sms and pausing the partition", workers=[served.worker])

                page.click("nav a[data-nav=overview]")
                row = page.wait_for_selector("#overview-holds tbody tr[data-effect=sms]")
                said = row.text_content()
                assert "web:alice" in said and "the SMS gateway's maintenance" in said and "until released" in said
                assert "an order support is looking at" in page.text_content("#overview-pauses tbody")
                page.screenshot(path=str(shot), full_page=True)

                page.click("nav a[data-nav=controls]")
                page.click("#controls-holds tbody tr[data-effect=sms] button:has-text('End')")
                page.wait_for_selector("#controls-holds tbody tr[data-effect=sms]", state="detached")
                page.click("#controls-pauses tbody tr[data-partition='0'] button:has-text('Resume')")
                page.wait_for_selector("#controls-pauses tbody tr[data-partition='0']", state="detached")
                wait_for(lambda: worker_metric(served.worker, "order_effect_held", '{effect="sms"}') == 0,
                         timeout=60, what="the hold ended on the worker", workers=[served.worker])
                audit = [(row["actor"], row["action"]) for row in own_db.query(
                    "SELECT actor, action FROM t_control_audit ORDER BY id")]
                assert audit == [("web:alice", "hold"), ("web:alice", "pause"), ("web:alice", "release"),
                                 ("web:alice", "resume")]

                viewer = browser.new_page()
                viewer.goto(f"{served.base}/console/")
                viewer.fill("#token", READ_TOKEN)
                viewer.dispatch_event("#token", "change")
                viewer.click("nav a[data-nav=controls]")
                viewer.wait_for_selector("#controls-audit tbody tr")
                assert not viewer.is_visible("#controls-forms")
                assert not errors
            finally:
                browser.close()
        status, _ = call("POST", f"{served.base}/controls/pauses/", token=READ_TOKEN,
                         body=b'{"partition": 0, "reason": "a viewer may not"}')
        assert status == 401
