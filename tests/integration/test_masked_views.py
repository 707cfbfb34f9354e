"""Personal data in free text, on a real worker: a cancel reason with a phone number, an e-mail
address and a street address, and services whose refusals repeat the request back (the order's
address as UTF-8, its phone, the idempotency key or client_ref, and a form-encoded trace of it
all). One order's address is Chinese; another's is one no pattern finds (a German address), so
only knowing the order's own contacts can mask it where the answer does not show the order. A
viewer reads every view and ``dlq show``: no phone number, e-mail address, address or token in
any encoding. An operator reads the service's answer whole, as text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from harness.console import call, served_worker
from harness.events import event, order_no, record
from harness.services import ROOT, Worker, wait_for

TOKEN = "operator-token-for-masking"
READ_TOKEN = "viewer-token-for-masking"
PHONE, ADDRESS = "+8613912345678", "北京市朝阳区建国路88号华贸中心3座1203室"
LATIN_ADDRESS = "Königsallee 92a, Hinterhaus, 40212 Düsseldorf"
REASON = "call me back on 13800138000 or jane.doe@example.com, at 12 Main Street"
PLAIN = [PHONE, PHONE[3:], ADDRESS, "北京市朝阳区建国路88号", "华贸中心3座1203室", LATIN_ADDRESS, "Königsallee 92a",
         "40212 Düsseldorf", "13800138000", "jane.doe@example.com", "12 Main Street"]
ENCODINGS = {
    "plain": lambda s: s,
    "repr of bytes": lambda s: repr(s.encode())[2:-1],
    "JSON escapes": lambda s: json.dumps(s)[1:-1],
    "JSON escapes, upper case": lambda s: json.dumps(s)[1:-1].upper(),
    "percent-encoded": quote,
    "form-encoded": quote_plus,
}


@dataclass
class Site:
    base: str
    worker: Worker
    db: object
    events_topic: str
    confirmed: str       # its CONFIRM's waybill is refused with the request repeated back
    confirmed_latin: str  # the same, for an address no pattern finds
    cancelled: str       # its CANCEL's SMS is refused with the request repeated back

    def letters(self) -> dict[str, dict]:
        """The dead letters by order and reason: ``rejected``, ``rejected_latin``, ``not_delivered``."""
        rows = self.db.query("SELECT id, order_no, reason, status, redrives, message FROM t_compensation "
                             "WHERE src_topic = %s", self.events_topic)
        names = {self.confirmed: "rejected", self.confirmed_latin: "rejected_latin", self.cancelled: "not_delivered"}
        return {names[row["order_no"]]: row for row in rows}

    def steps(self) -> list[dict]:
        orders = (self.confirmed, self.confirmed_latin, self.cancelled)
        return self.db.query("SELECT biz_key, idem_token, last_err FROM t_idem WHERE "
                             + " OR ".join(["biz_key LIKE %s"] * len(orders)), *(f"{order}:%" for order in orders))

    def secrets(self) -> list[str]:
        """Every personal value and token, in every encoding a service or a log may write it."""
        tokens = [step["idem_token"] for step in self.steps() if step["idem_token"]]
        return sorted({encode(value) for value in PLAIN + tokens for encode in ENCODINGS.values()})


@pytest.fixture(scope="module")
def site(settings, scratch_db):
    confirmed, latin, cancelled = order_no(prefix="MASKW"), order_no(prefix="MASKL"), order_no(prefix="MASKS")
    docs = [event(order, "ORDER_CREATED", data={"amount_cents": 12_900, "phone": PHONE, "address": address})
            for order, address in ((confirmed, ADDRESS), (latin, LATIN_ADDRESS), (cancelled, ADDRESS))]
    docs += [event(order, type_) for order in (confirmed, latin) for type_ in ("ORDER_PAID", "ORDER_CONFIRM")]
    docs.append(event(cancelled, "ORDER_CANCEL", data={"reason": REASON}))
    with served_worker(settings, scratch_db, "masking", [record(d) for d in docs],
                       fakes={"waybill": {"echo_orders": [confirmed, latin]}, "sms": {"echo_orders": [cancelled]}},
                       WEB_TOKEN=TOKEN, WEB_READ_TOKEN=READ_TOKEN, RETRY_BACKOFF_MS="20,20,20",
                       DLQ_RETRY_AFTER_SECONDS="0", COMPENSATION_BACKOFF_SECONDS="3600") as served:
        s = Site(served.base, served.worker, scratch_db, served.topics.events, confirmed, latin, cancelled)
        # The refused waybills go to a person at once; the SMS is redriven once, then waits an hour.
        wait_for(lambda: {r: (row["reason"], row["status"], row["redrives"]) for r, row in s.letters().items()} == {
            "rejected": ("effect_rejected", 4, 0), "rejected_latin": ("effect_rejected", 4, 0),
            "not_delivered": ("effect_not_delivered", 1, 1)}, timeout=120,
            what="the two dead letters settled", workers=[s.worker])
        yield s


def test_the_services_answers_reached_the_messages_with_the_personal_data_in_them(site):
    letters, steps = site.letters(), {step["biz_key"]: step for step in site.steps()}
    waybill = steps[f"{site.confirmed}:ORDER_CONFIRM:issue_waybill"]
    sms = steps[f"{site.cancelled}:ORDER_CANCEL:send_cancel_sms"]
    assert ADDRESS in letters["rejected"]["message"] and waybill["idem_token"] in waybill["last_err"]
    assert LATIN_ADDRESS in letters["rejected_latin"]["message"]
    assert "13800138000" in sms["last_err"] and sms["idem_token"] in sms["last_err"]
    assert quote_plus(PHONE) in sms["last_err"]                          # the form-encoded trace
    assert len(waybill["idem_token"]) == 32 and "b'" not in letters["rejected"]["message"]


def views(site: Site) -> list[str]:
    letters = site.letters()
    _, groups = call("GET", f"{site.base}/groups/?status=all", token=TOKEN)
    return (["/compensation/", "/idem/stuck/", "/groups/?status=all"]
            + [f"/groups/{group['fingerprint']}" for group in groups["groups"]]
            + [f"/compensation/{row['id']}" for row in letters.values()]
            + [f"/orders/{order}" for order in (site.confirmed, site.confirmed_latin, site.cancelled)]
            + [f"/idem/{step['biz_key']}" for step in site.steps()])


def test_a_viewer_sees_no_phone_email_address_or_token_in_any_view(site):
    secrets = site.secrets()
    for path in views(site):
        status, answer = call("GET", site.base + path, token=READ_TOKEN)
        assert status == 200 and answer["masked"] is True, (path, answer)
        text = json.dumps(answer, ensure_ascii=False)
        assert [s for s in secrets if s in text or s in json.dumps(answer)] == [], (path, text[:3000])
    _, letter = call("GET", f"{site.base}/compensation/{site.letters()['not_delivered']['id']}", token=READ_TOKEN)
    assert json.loads(letter["record"]["value"]["text"])["data"]["reason"] == "call me back on ***8000 or j***@***, at 12 ***"
    _, step = call("GET", f"{site.base}/idem/{site.confirmed_latin}:ORDER_CONFIRM:issue_waybill", token=READ_TOKEN)
    assert '"address": "Kön***"' in step["last_err"] and step["idem_token"].startswith("***")   # /idem shows no order


def test_the_cli_shows_a_viewer_none_of_them_either(site):
    faust = Path(sys.executable).with_name("faust")
    secrets = site.secrets()
    for row in site.letters().values():
        shown = subprocess.run([str(faust), "-A", "app", "dlq", "show", str(row["id"])], cwd=ROOT, env=site.worker.env,
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert [s for s in secrets if s in shown.stdout] == [] and '"masked": true' in shown.stdout, shown.stdout[-3000:]


def test_an_operator_reads_the_services_answer_whole_as_text(site):
    row = site.letters()["rejected"]
    status, letter = call("GET", f"{site.base}/compensation/{row['id']}", token=TOKEN)
    assert status == 200 and letter["masked"] is False
    assert f'"address": "{ADDRESS}"' in letter["message"] and PHONE not in letter["message"]
    status, step = call("GET", f"{site.base}/idem/{site.cancelled}:ORDER_CANCEL:send_cancel_sms", token=TOKEN)
    assert REASON in step["last_err"] and len(step["idem_token"]) == 32
