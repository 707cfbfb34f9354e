"""Viewers and operators on a real worker: a viewer's answers never carry a phone number or an
address (every view's raw JSON is searched for the literal values), an operator's do and each
such look is audited with the person's name, only an operator downloads a record, and the
console shows each what its role allows (headless Chromium).

One worker serves the module. Its dead letters, each carrying personal data a different way:
a second ORDER_CREATED that contradicts the first (JSON record, and the order's own phone and
address), a record that is not JSON, and one too large whose dead letter keeps only its start.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from harness.console import chromium, served_worker
from harness.events import event, order_no, record
from harness.services import LOGS, ROOT, Worker, wait_for

TOKEN = "operator-token-for-roles"
READ_TOKEN = "viewer-token-for-roles"
DOCS = ROOT / "docs"
PEOPLE = {
    "first": ("+8613811112222", "12 Orchard Road, Block 7"),       # the order's own, from its first CREATED
    "second": ("+8613933334444", "98 Willow Street, Floor 3"),     # the contradicting CREATED's
    "text": ("+8613755556666", "31 Harbour View Terrace"),        # in a record that is not JSON
    "cut": ("+8613677778888", "5 Lantern Court, Unit 12"),         # in a record cut to its start
}
SECRETS = [value for pair in PEOPLE.values() for value in pair]


@dataclass
class Site:
    base: str
    worker: Worker
    db: object
    events_topic: str
    order: str            # the order whose second CREATED is dead-lettered

    def rows(self) -> dict[str, dict]:
        rows = self.db.query("SELECT id, reason, status, order_no, record_value FROM t_compensation "
                             "WHERE src_topic = %s", self.events_topic)
        return {row["reason"]: row for row in rows}

    def audit(self) -> list[dict]:
        return self.db.query("SELECT actor, role, what, path, compensation_id, order_no FROM t_view_audit "
                             "WHERE consumer_group = %s ORDER BY id", self.worker.env["APP_ID"])


def get(url: str, token: str | None, actor: str | None = None) -> tuple[int, bytes, dict]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if actor is not None:
        request.add_header("X-Actor", actor)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


@pytest.fixture(scope="module")
def site(settings, scratch_db):
    order, text_order, cut_order = order_no(prefix="ROLE"), order_no(prefix="ROLET"), order_no(prefix="ROLEC")
    first, second = ({"amount_cents": 500, "phone": p, "address": a} for p, a in (PEOPLE["first"], PEOPLE["second"]))
    big = event(cut_order, "ORDER_CREATED", data={"amount_cents": 1, "phone": PEOPLE["cut"][0],
                                                  "address": PEOPLE["cut"][1]}, padding="x" * 3000)
    records = [record(event(order, "ORDER_CREATED", data=first)), record(event(order, "ORDER_CREATED", data=second)),
               (text_order.encode(), f"phone={PEOPLE['text'][0]}; address={PEOPLE['text'][1]}".encode()),
               record(big)]
    with served_worker(settings, scratch_db, "roles", records, WEB_TOKEN=TOKEN, WEB_READ_TOKEN=READ_TOKEN,
                       MAX_EVENT_BYTES="2048", DLQ_TRUNCATE_BYTES="1024", DLQ_RETRY_AFTER_SECONDS="0",
                       COMPENSATION_BACKOFF_SECONDS="3600") as served:
        s = Site(served.base, served.worker, scratch_db, served.topics.events, order)
        wait_for(lambda: set(s.rows()) == {"payload_mismatch", "not_json", "oversized"}, timeout=120,
                 what="the three dead letters", workers=[s.worker])
        yield s


def views(site: Site) -> list[str]:
    rows = site.rows()
    paths = ["/compensation/", f"/compensation/?order_no={site.order}", f"/orders/{site.order}", "/idem/stuck/",
             f"/idem/{site.order}:ORDER_CREATED:create_order", "/groups/?status=all", "/groups/?window=7d", "/bulk/"]
    _, raw, _ = get(f"{site.base}/groups/?status=all", TOKEN)
    groups = [f"/groups/{group['fingerprint']}" for group in json.loads(raw)["groups"]]
    return paths + groups + [f"/compensation/{row['id']}" for row in rows.values()]


def test_a_viewer_never_gets_a_phone_number_or_an_address(site):
    rows = site.rows()
    assert rows["oversized"]["record_value"].startswith(b"{") and PEOPLE["cut"][1].encode() in \
        rows["oversized"]["record_value"]                                 # the stored start holds them
    before = len(site.audit())
    for path in views(site):
        status, raw, _ = get(site.base + path, READ_TOKEN, actor="vera")
        assert status == 200, (path, raw[:300])
        text = raw.decode()
        for secret in SECRETS:
            assert secret not in text, (path, secret)
        assert json.loads(text)["masked"] is True, path
    status, raw, _ = get(f"{site.base}/compensation/{rows['payload_mismatch']['id']}", READ_TOKEN)
    entry = json.loads(raw)
    shown = json.loads(entry["record"]["value"]["text"])["data"]
    assert (shown["phone"], shown["address"]) == ("***4444", "98 ***")                 # the documented shape
    assert (entry["order"]["phone"], entry["order"]["address"]) == ("***2222", "12 ***")
    for reason in ("not_json", "oversized"):
        value = json.loads(get(f"{site.base}/compensation/{rows[reason]['id']}", READ_TOKEN)[1])["record"]["value"]
        assert "withheld" in value and "text" not in value, reason
    assert len(site.audit()) == before                                   # masked answers are not audited


def test_an_operator_sees_them_whole_and_every_look_is_audited_with_the_name(site):
    rows = site.rows()
    before = len(site.audit())
    status, raw, _ = get(f"{site.base}/compensation/{rows['payload_mismatch']['id']}", TOKEN, actor="alice")
    entry = json.loads(raw)
    assert status == 200 and entry["masked"] is False
    assert PEOPLE["second"][0] in entry["record"]["value"]["text"] and entry["order"]["phone"] == PEOPLE["first"][0]
    status, raw, _ = get(f"{site.base}/compensation/{rows['not_json']['id']}", TOKEN, actor="alice")
    assert PEOPLE["text"][1] in json.loads(raw)["record"]["value"]["text"]
    status, raw, _ = get(f"{site.base}/orders/{site.order}", TOKEN, actor="bob")
    assert json.loads(raw)["order"]["address"] == PEOPLE["first"][1]
    assert get(f"{site.base}/orders/{site.order}", TOKEN, actor="<script>")[0] == 400     # a name, or nothing
    assert site.audit()[before:] == [
        {"actor": "web:alice", "role": "operator", "what": "dead_letter",
         "path": f"/compensation/{rows['payload_mismatch']['id']}", "compensation_id": rows["payload_mismatch"]["id"],
         "order_no": site.order},
        {"actor": "web:alice", "role": "operator", "what": "dead_letter", "path": f"/compensation/{rows['not_json']['id']}",
         "compensation_id": rows["not_json"]["id"], "order_no": None},
        {"actor": "web:bob", "role": "operator", "what": "timeline", "path": f"/orders/{site.order}",
         "compensation_id": None, "order_no": site.order}]
    status, raw, _ = get(f"{site.base}/audit/views?limit=2", TOKEN)
    listed = json.loads(raw)
    assert status == 200 and [i["actor"] for i in listed["items"]] == ["web:bob", "web:alice"] and listed["next_before"]
    assert get(f"{site.base}/audit/views", READ_TOKEN)[0] == 403


def test_only_an_operator_downloads_a_record_and_each_download_is_audited(site):
    row = site.rows()["payload_mismatch"]
    url = f"{site.base}/compensation/{row['id']}/record"
    assert get(url, READ_TOKEN)[0] == 403 and get(url, None)[0] == 401
    before = len(site.audit())
    status, raw, headers = get(url, TOKEN, actor="carol")
    assert status == 200 and raw == row["record_value"]
    assert headers["Content-Disposition"] == f'attachment; filename="dead-letter-{row["id"]}-value.bin"'
    status, raw, headers = get(f"{url}?part=envelope", TOKEN, actor="carol")
    envelope = json.loads(raw)
    assert envelope["key"]["text"] == site.order and envelope["value"]["bytes"] == len(row["record_value"])
    assert "attachment" in headers["Content-Disposition"]
    assert get(f"{url}?part=all", TOKEN)[0] == 400
    assert [(a["actor"], a["what"]) for a in site.audit()[before:]] == [("web:carol", "download:value"),
                                                                         ("web:carol", "download:envelope")]


def test_whoami_answers_the_role(site):
    assert json.loads(get(f"{site.base}/whoami", TOKEN)[1]) == {
        "role": "operator", "name": None, "masked": False, "may_act": True, "may_download": True, "audited": True}
    assert json.loads(get(f"{site.base}/whoami", READ_TOKEN)[1])["role"] == "viewer"
    assert get(f"{site.base}/whoami", None)[0] == 401 and get(f"{site.base}/whoami", "wrong")[0] == 401


def send(site: Site, method: str, path: str, headers: dict[str, bytes]) -> tuple[int, bytes]:
    """One request whose header values are sent byte for byte (``urllib`` would refuse them)."""
    conn = http.client.HTTPConnection("127.0.0.1", site.worker.web_port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_header_bytes_that_are_not_utf8_are_refused_before_any_view_without_a_trace(site):
    ours = f"127.0.0.1:{site.worker.web_port}".encode()
    logged = len(site.worker.logs())
    for method, path in (("GET", "/compensation/"), ("GET", "/whoami"), ("POST", "/compensation/1/resolve")):
        for value in (b"Bearer \xff\xfe" + TOKEN.encode(), b"\xff\xfe", b"Bearer " + TOKEN.encode() + b"\xe9",
                      b"B\xe9arer " + TOKEN.encode()):
            status, body = send(site, method, path, {"Host": ours, "Authorization": value})
            assert status == 401, (method, path, value, body)
            reason = json.loads(body)["error"]
            assert "Authorization" in reason and TOKEN not in reason and "\\x" not in reason, reason
            assert b"\xff" not in body and b"\\udc" not in body.lower() and b"\xe9" not in body, body
    for host in (b"127.0.0.1\xff", b"\xff\xfe:80", b"[\xff]:80"):
        status, body = send(site, "GET", "/compensation/", {"Host": host, "Authorization": b"Bearer " + TOKEN.encode()})
        assert status == 421 and b"\\udc" not in body.lower() and b"\xff" not in body, (host, body)
    status, body = send(site, "GET", f"/orders/{site.order}", {"Host": ours, "Authorization": b"Bearer " +
                                                                TOKEN.encode(), "X-Actor": b"al\xffce"})
    assert status == 400 and b"X-Actor" in body
    added = site.worker.logs()[logged:]
    assert "Traceback" not in added and "Error handling request" not in added, added[-3000:]
    assert get(f"{site.base}/whoami", TOKEN)[0] == 200                  # and the worker serves on


def dlq(site: Site, *args: str) -> subprocess.CompletedProcess:
    faust = Path(sys.executable).with_name("faust")
    return subprocess.run([str(faust), "-A", "app", "dlq", *args], cwd=ROOT, env=site.worker.env,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_shows_masked_unless_asked_and_audits_the_unmasked(site):
    row = site.rows()["payload_mismatch"]
    shown = dlq(site, "show", str(row["id"]))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert not [s for s in SECRETS if s in shown.stdout] and "***4444" in shown.stdout
    before = len(site.audit())
    whole = dlq(site, "show", str(row["id"]), "--unmasked", "--actor", "dave")
    assert whole.returncode == 0 and PEOPLE["second"][0] in whole.stdout
    assert site.audit()[before:] == [{"actor": "cli:dave", "role": "operator", "what": "dead_letter",
                                      "path": f"dlq show {row['id']} --unmasked", "compensation_id": row["id"],
                                      "order_no": site.order}]


# -- the console, in a real browser ------------------------------------------------------


def sign_in(page, base: str, token: str, role: str) -> None:
    page.goto(f"{base}/console/")
    page.fill("#token", token)
    page.dispatch_event("#token", "change")
    page.wait_for_selector(f"#whoami[data-role={role}]")


def open_letter(page, order: str) -> None:
    page.click("nav a[data-nav=queue]")
    page.fill("#filters input[name=order_no]", order)
    page.click("#search")
    page.click("#queue tbody tr:has-text('payload_mismatch')")
    page.wait_for_selector("#detail-status:has-text('manual')")


def test_the_console_masks_for_a_viewer_shows_an_operator_whole_and_keeps_the_token_for_the_tab(site):
    phone, address = PEOPLE["second"]
    row = site.rows()["payload_mismatch"]
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            tab = browser.new_context(accept_downloads=True)
            page = tab.new_page()
            sign_in(page, site.base, READ_TOKEN, "viewer")
            open_letter(page, site.order)
            page.wait_for_selector("#detail-record:has-text('***4444')")
            assert "masked" in page.get_attribute("#detail-record", "class")
            assert "masked" in page.get_attribute("#detail-order", "class")
            assert not [s for s in SECRETS if s in page.content()]
            assert not page.is_visible("#retry") and not page.is_visible("#download")
            page.screenshot(path=str(LOGS / "roles-viewer.png"), full_page=True)

            page.reload()                                             # the same tab keeps the token
            page.wait_for_selector("#whoami[data-role=viewer]")
            assert not page.is_visible("#token") and page.is_visible("#forget")
            assert page.evaluate("localStorage.length") == 0 and tab.cookies() == []
            other = browser.new_context().new_page()                  # another tab (context) asks again
            other.goto(f"{site.base}/console/")
            assert other.is_visible("#token") and other.evaluate("sessionStorage.getItem('token')") is None
            page.click("#forget")                                     # and forgetting is at once
            assert page.is_visible("#token") and page.evaluate("sessionStorage.getItem('token')") is None

            before = len(site.audit())
            page.fill("#actor", "erin")
            page.fill("#token", TOKEN)
            page.dispatch_event("#token", "change")
            page.wait_for_selector("#whoami[data-role=operator]")
            open_letter(page, site.order)
            page.wait_for_selector(f"#detail-record:has-text('{phone}')")
            assert address in page.text_content("#detail-record") and "masked" not in \
                (page.get_attribute("#detail-record", "class") or "")
            assert page.is_visible("#retry") and page.is_visible("#download")
            page.screenshot(path=str(LOGS / "roles-operator.png"), full_page=True)
            with page.expect_download() as fetched:
                page.click("#download")
            assert Path(fetched.value.path()).read_bytes() == row["record_value"]
            assert [(a["actor"], a["what"]) for a in site.audit()[before:]] == [("web:erin", "dead_letter"),
                                                                                 ("web:erin", "download:value")]
        finally:
            browser.close()
