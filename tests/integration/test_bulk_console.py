"""The console's bulk panel in a real headless Chromium: a bulk retry of the queue's current
filter, from the dry run through the confirmation and the progress to done (a screenshot of
each state in the logs folder)."""

from __future__ import annotations

from playwright.sync_api import sync_playwright

from harness.bulk_workers import FAST, TOKEN, answering
from harness.console import chromium
from harness.dead_letters import write_dead_letters
from harness.fakes import FakesProcess
from harness.services import LOGS, wait_for


def test_the_console_retries_the_filtered_queue_in_bulk_from_dry_run_to_done(scratch_db, topics, spawn_worker):
    pair = topics(partitions=1)
    orders = write_dead_letters(scratch_db, pair.group, pair.events, 60, prefix="BCONS")
    fakes = FakesProcess()
    try:
        worker = spawn_worker(pair, **fakes.env(), BULK_RATE_PER_SECOND="15",
                              BULK_CHUNK_SIZE="5", **FAST)
        wait_for(lambda: answering(worker), timeout=90, what="the worker's web views", workers=[worker])
        shots = []

        def shot(page, name: str) -> None:
            path = LOGS / f"bulk-console-{len(shots) + 1}-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)

        with sync_playwright() as p:
            browser = chromium(p)
            try:
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"http://127.0.0.1:{worker.web_port}/console/")
                page.fill("#token", TOKEN)
                page.fill("#actor", "frank")
                page.click("nav a[data-nav=queue]")                      # the overview comes first
                page.select_option("select[name=status]", "manual")
                page.fill("input[name=reason]", "effect_unavailable")
                page.click("#search")
                page.wait_for_selector("#queue tbody tr:has-text('BCONS')")
                shot(page, "filtered")

                page.fill("#bulk-note", "logistics is back")
                page.click("#bulk-dry-run")
                page.wait_for_selector("#bulk-count:has-text('60 dead letters would be acted on')")
                assert len(page.query_selector_all("#bulk-sample tbody tr")) == 20
                assert page.is_enabled("#bulk-start")
                shot(page, "dry-run")

                page.click("#bulk-start")
                page.wait_for_selector("#bulk-confirm-text:has-text('retry 60 dead letters?')")
                shot(page, "confirm")
                assert scratch_db.scalar("SELECT COUNT(*) FROM t_bulk_job WHERE consumer_group = %s", pair.group) == 0

                page.click("#bulk-confirm-yes")
                page.wait_for_selector("#bulk-status:has-text('running')")
                page.wait_for_selector("#bulk-progress:has-text('remaining')")
                wait_for(lambda: 0 < int(page.get_attribute("#bulk-bar", "value") or 0) < 60, timeout=60,
                         what="the progress bar moving")
                shot(page, "progress")

                page.wait_for_selector("#bulk-status:has-text('done')", timeout=60_000)
                assert "60 of 60 done: 60 changed, 0 unchanged, 0 failed, 0 remaining" in \
                    page.text_content("#bulk-progress")
                assert page.is_disabled("#bulk-pause") and page.is_disabled("#bulk-abort")
                shot(page, "done")
                assert not errors, errors
            finally:
                browser.close()
        assert all(path.stat().st_size > 10_000 for path in shots)
        audit = scratch_db.query("SELECT DISTINCT a.actor, a.action, a.note FROM t_compensation_audit a JOIN "
                                 "t_compensation c ON c.id = a.compensation_id WHERE c.consumer_group = %s "
                                 "AND a.job_id IS NOT NULL", pair.group)
        assert audit == [{"actor": "web:frank", "action": "retry", "note": "logistics is back"}]
        waybills = fakes.ledger()["waybills"]
        assert all(len(waybills.get(o, [])) == 1 for o in orders)
    finally:
        fakes.stop()
