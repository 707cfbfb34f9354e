"""Every page of the console in a real headless Chromium, at a desktop's 1280 pixels and a phone's
390: each is screenshotted (full page) and nothing on it runs past the screen's right edge. The
overview comes first; times read relative with the exact one on hover; statuses are badges; a
viewer sees masked fields marked as masked; an empty list and an API that fails say what to do.

One worker serves the module. Its dead letters: a CONFIRM the logistics API refuses with 500s
(open, its provider failing), and a second ORDER_CREATED carrying a phone and an address that
contradicts the first (manual).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, sync_playwright

from harness.console import call, chromium, served_worker
from harness.events import event, order_no, record
from harness.services import LOGS, Worker, wait_for

TOKEN = "operator-token-for-pages"
READ_TOKEN = "viewer-token-for-pages"
PHONE, ADDRESS = "+8613812345678", "77 Juniper Lane, Tower 2"        # the order's, from its first CREATED
OTHER_PHONE, OTHER_ADDRESS = "+8613900001111", "3 Other Road, Flat 9"   # the contradicting CREATED's
WIDTHS = (1280, 390)
# Each page: its route, and what shows once its data is on it.
PAGES = {
    "overview": ("#/overview", "#overview-providers tbody tr"),
    "queue": ("#/queue", "#queue tbody tr.row"),
    "letter": ("#/queue/{letter}", "#detail-fields dd"),
    "groups": ("#/groups", "#groups-table tbody tr.group"),
    "bulk": ("#/bulk", "#bulk-jobs tbody tr"),
    "orders": ("#/orders/{order}", "#timeline-steps tbody tr"),
    "reconcile": ("#/reconcile", "#reconcile-runs tbody tr"),
}
# Whatever on the page lies past the viewport's right edge (the document wider than the
# screen, or any visible element's box running past it).
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const found = [];
  if (document.documentElement.scrollWidth > width) found.push(`document ${document.documentElement.scrollWidth}`);
  for (const element of document.querySelectorAll("body *")) {
    const box = element.getBoundingClientRect();
    if (!box.width || !box.height || getComputedStyle(element).visibility === "hidden") continue;
    if (box.right > width + 0.5) found.push(`${element.tagName}#${element.id}.${element.className} ${box.right}`);
  }
  return found;
}"""


@dataclass
class Desk:
    base: str
    worker: Worker
    db: object
    events_topic: str
    failing: str          # its CONFIRM dead-lettered: the logistics API answers 500
    personal: str         # its second CREATED contradicts the first, with a phone and an address

    def letters(self) -> dict[str, int]:
        rows = self.db.query("SELECT id, reason FROM t_compensation WHERE src_topic = %s", self.events_topic)
        return {row["reason"]: row["id"] for row in rows}


@pytest.fixture(scope="module")
def desk(settings, scratch_db):
    failing, personal = order_no(prefix="PAGE"), order_no(prefix="PAGEP")
    docs = [event(failing, t) for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    docs += [event(personal, "ORDER_CREATED", data={"amount_cents": 700, "phone": PHONE, "address": ADDRESS}),
             event(personal, "ORDER_CREATED", data={"amount_cents": 900, "phone": OTHER_PHONE,
                                                    "address": OTHER_ADDRESS})]
    with served_worker(settings, scratch_db, "pages", [record(d) for d in docs],
                       fakes={"waybill": {"fail_orders": [failing], "fail_status": 500}},
                       WEB_TOKEN=TOKEN, WEB_READ_TOKEN=READ_TOKEN, RETRY_BACKOFF_MS="20,20,20",
                       DLQ_RETRY_AFTER_SECONDS="0", COMPENSATION_BACKOFF_SECONDS="3600") as served:
        d = Desk(served.base, served.worker, scratch_db, served.topics.events, failing, personal)
        wait_for(lambda: set(d.letters()) == {"effect_unavailable", "payload_mismatch"}, timeout=120,
                 what="both dead letters", workers=[d.worker])
        yield d


def signed_in(page: Page, base: str, token: str, role: str) -> None:
    page.goto(f"{base}/console/")
    page.fill("#token", token)
    page.dispatch_event("#token", "change")
    page.wait_for_selector(f"#whoami[data-role={role}]")


def overflowing(page: Page) -> list[str]:
    return page.evaluate(OVERFLOW)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_screen_and_is_screenshotted(desk, width):
    letter = desk.letters()["payload_mismatch"]
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            signed_in(page, desk.base, TOKEN, "operator")
            assert page.is_visible("#page-overview") and not page.is_visible("#page-queue")   # the first page
            for name, (route, ready) in PAGES.items():
                page.goto(f"{desk.base}/console/{route.format(letter=letter, order=desk.failing)}")
                page.wait_for_selector(ready)
                page.wait_for_selector(f"nav a[data-nav='{'queue' if name == 'letter' else name}'][aria-current=page]")
                shot = LOGS / f"console-{name}-{width}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 5_000
                assert overflowing(page) == [], (name, width)
            assert errors == []
        finally:
            browser.close()


def test_the_overview_shows_the_queue_inflow_groups_jobs_and_providers(desk):
    status, overview = call("GET", f"{desk.base}/overview/", token=READ_TOKEN)
    assert status == 200 and overview["masked"] is True
    assert overview["by_status"]["manual"] >= 1 and overview["queue"]["depth"] >= 2
    assert overview["queue"]["oldest_open_age_seconds"] >= 0
    assert overview["inflow"]["24h"]["letters"] >= 2 and len(overview["inflow"]["24h"]["series"]) == 24
    assert overview["inflow"]["7d"]["letters"] >= overview["inflow"]["24h"]["letters"]
    assert {g["reason"] for g in overview["top_groups"]} >= {"effect_unavailable", "payload_mismatch"}
    assert overview["providers"] and all(p["state"] in {"closed", "open", "probing"} for p in overview["providers"])
    status, providers = call("GET", f"{desk.base}/providers/", token=READ_TOKEN)
    assert status == 200 and {p["effect"] for p in providers["providers"]} == {p["effect"] for p in overview["providers"]}
    assert call("GET", f"{desk.base}/overview/")[0] == 401 and call("GET", f"{desk.base}/providers/")[0] == 401

    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            signed_in(page, desk.base, TOKEN, "operator")
            page.wait_for_selector("#overview-statuses .badge.manual")
            page.wait_for_selector("#overview-providers tbody tr[data-effect] .badge")
            page.wait_for_selector("#overview-24h rect.bar", state="attached")
            assert sum(int(n) for n in page.eval_on_selector_all(
                "#overview-24h rect.bar", "bars => bars.map(b => b.dataset.letters)")) >= 2
            assert page.is_visible("#overview-oldest time[datetime][title]")
            page.click("#overview-statuses a:has-text('manual')")                     # a status opens the queue
            page.wait_for_selector("#page-queue #queue tbody tr.row")
            assert page.input_value("select[name=status]") == "manual"
        finally:
            browser.close()


def test_a_viewer_sees_masked_fields_marked_times_exact_on_hover_and_badges(desk):
    letter = desk.letters()["payload_mismatch"]
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 900})
            signed_in(page, desk.base, READ_TOKEN, "viewer")
            page.goto(f"{desk.base}/console/#/queue")
            page.wait_for_selector("#queue tbody tr.row .badge")
            time = page.query_selector("#queue tbody tr.row time")
            assert time.get_attribute("datetime").endswith("Z") and time.get_attribute("title").endswith("UTC")
            assert "ago" in time.text_content() and "." not in time.text_content()          # no raw ISO
            page.goto(f"{desk.base}/console/#/queue/{letter}")
            page.wait_for_selector("#detail-record mark.masked-value")
            assert page.is_visible("#detail-masked") and "masked" in page.get_attribute("#detail-record", "class")
            marks = page.eval_on_selector_all("#detail-record mark.masked-value", "ms => ms.map(m => m.textContent)")
            assert any(m.endswith("1111") for m in marks) and all("***" in m for m in marks)    # the record's phone
            order_marks = page.eval_on_selector_all("#detail-order mark.masked-value", "ms => ms.map(m => m.textContent)")
            assert any(m.endswith("5678") for m in order_marks)                                 # the order's
            assert '"amount_cents": 900' in page.text_content("#detail-record")            # indented JSON
            assert page.get_attribute("#detail-status", "class").split() >= ["status", "badge"]
            assert page.query_selector("#detail-fields time[datetime][title]") is not None
            assert not [s for s in (PHONE, ADDRESS, OTHER_PHONE, OTHER_ADDRESS) if s in page.content()]
            page.screenshot(path=str(LOGS / "console-letter-viewer-390.png"), full_page=True)
            assert overflowing(page) == []
        finally:
            browser.close()


def test_an_empty_list_and_a_failing_api_say_what_to_do(desk):
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 900})
            signed_in(page, desk.base, TOKEN, "operator")
            page.goto(f"{desk.base}/console/#/queue?order_no=ORD-20261129-NOBODY")
            page.wait_for_selector("#queue-empty:has-text('Clear a filter')")
            page.goto(f"{desk.base}/console/#/orders/ORD-20261129-NOBODY")
            page.wait_for_selector("#lookup-error:has-text('look for it in the queue')")

            empty = {"now": "2026-12-01T10:00:00", "by_status": {}, "capped": [], "cap": 10000,
                     "queue": {"depth": 0, "oldest_open_at": None, "oldest_open_age_seconds": None},
                     "inflow": {w: {"letters": 0, "series": [], "since": None, "bucket_hours": 1} for w in ("24h", "7d")},
                     "top_groups": [], "more_groups": 0, "bulk_in_progress": [], "providers": []}
            page.route("**/overview/", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                   body=json.dumps(empty)))
            page.goto(f"{desk.base}/console/#/bulk")
            page.goto(f"{desk.base}/console/#/overview")
            page.wait_for_selector("#overview-empty:has-text('The queue is empty')")
            page.wait_for_selector("#overview-bulk td.empty:has-text('Dry run')")
            page.screenshot(path=str(LOGS / "console-overview-empty-390.png"), full_page=True)

            page.unroute("**/overview/")
            page.route("**/overview/", lambda route: route.fulfill(
                status=503, content_type="application/json", body=json.dumps({"error": "the database is unreachable"})))
            page.goto(f"{desk.base}/console/#/bulk")
            page.goto(f"{desk.base}/console/#/overview")
            page.wait_for_selector("#overview-error:has-text('the database is unreachable')")
            assert "readyz" in page.text_content("#overview-error") and "reload" in page.text_content("#overview-error")
            assert not page.is_visible("#overview-body")                     # no figures of an earlier read
            page.route("**/bulk/", lambda route: route.abort())
            page.goto(f"{desk.base}/console/#/bulk")
            page.wait_for_selector("#bulk-jobs-error:has-text('did not answer')")
            page.goto(f"{desk.base}/console/#/overview")
            page.screenshot(path=str(LOGS / "console-overview-error-390.png"), full_page=True)
            assert overflowing(page) == []
        finally:
            browser.close()
