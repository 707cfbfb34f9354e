"""One token per person (``WEB_TOKENS_FILE``) on a real worker: each audit (the dead letters' actions, a
bulk job, the unmasked views) names the person whose token acted, whatever the request says; a shared
token (``WEB_TOKEN``) still works under the name the request gives, never a person's; a line removed
revokes that token at the next request, no restart; a broken file refuses the per-person tokens until
it is fixed, and one broken at start-up stops the worker (exit 78) without repeating the line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.adapters.web_tokens import digest
from harness.console import served_worker
from harness.events import event, order_no, record
from harness.services import Worker, wait_for, worker_env

SHARED = "shared-operator-token-for-people"
PEOPLE = {"alice": ("operator", "alice-own-token-" + "a" * 40), "bob": ("operator", "bob-own-token-" + "b" * 40),
          "vera": ("viewer", "vera-own-token-" + "v" * 40)}


def lines(*names: str) -> str:
    return "# the web views' people\n" + "".join(
        f"{name} {PEOPLE[name][0]} {digest(PEOPLE[name][1].encode())}\n" for name in names)


@dataclass
class Site:
    base: str
    worker: Worker
    db: object
    events_topic: str
    tokens: Path
    orders: list[str]

    def call(self, who: str, method: str, path: str, body: dict | None = None,
             actor: str | None = None) -> tuple[int, dict]:
        token = SHARED if who == "shared" else PEOPLE[who][1]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        if actor is not None:
            headers["X-Actor"] = actor
        request = urllib.request.Request(self.base + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def letters(self) -> dict[str, int]:
        rows = self.db.query("SELECT id, order_no FROM t_compensation WHERE src_topic = %s", self.events_topic)
        return {row["order_no"]: row["id"] for row in rows}

    def views_seen(self) -> list[tuple[str, str]]:
        rows = self.db.query("SELECT actor, what FROM t_view_audit WHERE consumer_group = %s ORDER BY id",
                             self.worker.env["APP_ID"])
        return [(row["actor"], row["what"]) for row in rows]


@pytest.fixture(scope="module")
def site(settings, scratch_db, tmp_path_factory):
    tokens = tmp_path_factory.mktemp("people") / "web-tokens"
    tokens.write_text(lines("alice", "bob", "vera"))
    orders = [order_no(prefix=f"PPL{i}") for i in range(3)]
    # Each order created twice, the second time with other data: dead-lettered for a person (payload_mismatch).
    records = [record(event(order, "ORDER_CREATED", data={"amount_cents": cents, "phone": "+8613800000000",
                                                          "address": "1 Test Road"}))
               for order in orders for cents in (100, 200)]
    with served_worker(settings, scratch_db, "people", records, WEB_TOKEN=SHARED, WEB_TOKENS_FILE=str(tokens),
                       DLQ_RETRY_AFTER_SECONDS="0", COMPENSATION_BACKOFF_SECONDS="3600") as served:
        s = Site(served.base, served.worker, scratch_db, served.topics.events, tokens, orders)
        wait_for(lambda: len(s.letters()) == 3, timeout=120, what="three dead letters", workers=[s.worker])
        yield s


def test_the_audit_names_the_person_whose_token_acted_whatever_the_request_says(site):
    letters = site.letters()
    assert site.call("alice", "GET", "/whoami")[1] == {"role": "operator", "name": "alice", "masked": False,
                                                            "may_act": True, "may_download": True, "audited": True}
    assert site.call("vera", "GET", "/whoami")[1]["name"] == "vera"
    assert site.call("shared", "GET", "/whoami")[1]["name"] is None

    status, _ = site.call("alice", "POST", f"/compensation/{letters[site.orders[0]]}/resolve",
                          {"note": "checked upstream", "actor": "mallory"})
    assert status == 200
    status, _ = site.call("bob", "POST", f"/compensation/{letters[site.orders[1]]}/discard", {"note": "junk"})
    assert status == 200
    audit = {row["compensation_id"]: row for row in site.db.query(
        "SELECT compensation_id, actor, note FROM t_compensation_audit WHERE action IN ('resolve', 'discard')")}
    alice, bob = audit[letters[site.orders[0]]], audit[letters[site.orders[1]]]
    assert alice["actor"] == "web:alice" and alice["note"].startswith("checked upstream") and "mallory" in alice["note"]
    assert (bob["actor"], bob["note"]) == ("web:bob", "junk")

    # A bulk job: made by alice, whatever its body says.
    job = {"action": "resolve", "filter": {"order_no": site.orders[2]}}
    status, dry = site.call("alice", "POST", "/bulk/dry-run", job)
    assert status == 200 and dry["count"] == 1
    status, made = site.call("alice", "POST", "/bulk/", {**job, "expected_count": 1, "actor": "mallory"})
    assert status == 201, made
    [created] = site.db.query("SELECT created_by, note FROM t_bulk_job WHERE id = %s", made["id"])
    assert created["created_by"] == "web:alice" and "mallory" in created["note"]

    # The unmasked views: each look audited under the token's person; X-Actor does not change it.
    before = len(site.views_seen())
    assert site.call("alice", "GET", f"/compensation/{letters[site.orders[2]]}", actor="mallory")[0] == 200
    assert site.call("bob", "GET", f"/orders/{site.orders[2]}")[0] == 200
    status, masked = site.call("vera", "GET", f"/compensation/{letters[site.orders[2]]}")
    assert status == 200 and masked["masked"] is True                      # a viewer: masked, not audited
    assert site.views_seen()[before:] == [("web:alice", "dead_letter"), ("web:bob", "timeline")]

    # A viewer's own token acts on nothing.
    assert site.call("vera", "POST", f"/compensation/{letters[site.orders[2]]}/resolve", {})[0] == 401

    # The shared token: the name the request gives, as before, but never a person's who has a token.
    status, answer = site.call("shared", "GET", f"/compensation/{letters[site.orders[2]]}", actor="alice")
    assert status == 403 and "token of their own" in answer["error"]
    assert site.call("shared", "POST", f"/compensation/{letters[site.orders[2]]}/resolve", {"actor": "bob"})[0] == 403
    assert site.call("shared", "GET", f"/compensation/{letters[site.orders[2]]}", actor="ops")[0] == 200
    assert site.views_seen()[-1] == ("web:ops", "dead_letter")


def test_a_line_removed_revokes_its_token_at_the_next_request_and_a_broken_file_refuses_them_all(site):
    assert site.call("bob", "GET", "/whoami")[0] == 200
    site.tokens.write_text(lines("alice", "vera"))                  # bob has left
    status, answer = site.call("bob", "GET", "/whoami")
    assert status == 401 and answer["error"] == "missing or wrong bearer token"
    assert site.call("bob", "POST", f"/compensation/{site.letters()[site.orders[2]]}/discard", {})[0] == 401
    assert site.call("alice", "GET", "/whoami")[1]["name"] == "alice"

    # A line broken by hand (a token pasted instead of its hash): no per-person token works until it is fixed,
    # the shared one still does, and the log names the line, never what it holds.
    pasted = PEOPLE["alice"][1]
    site.tokens.write_text(f"alice operator {pasted}\n")
    status, answer = site.call("alice", "GET", "/whoami")
    assert status == 503 and "WEB_TOKENS_FILE" in answer["error"] and pasted not in json.dumps(answer)
    assert site.call("shared", "GET", "/whoami")[0] == 200
    site.worker.wait_log("line 1: the third field is the token's SHA-256")
    assert pasted not in site.worker.logs()
    site.tokens.write_text(lines("alice"))
    assert site.call("alice", "GET", "/whoami")[1]["name"] == "alice"
    assert site.worker.alive


def test_a_worker_whose_tokens_file_cannot_be_read_does_not_start(settings, scratch_db, topics, tmp_path):
    pasted = "a-token-pasted-where-its-hash-belongs-" + "x" * 20
    broken = tmp_path / "web-tokens"
    broken.write_text(lines("alice") + f"bob operator {pasted}\n")
    pair = topics(partitions=1)
    worker = Worker(worker_env(MYSQL_URL=scratch_db.url, WORKER_ID="people-refused", WEB_TOKENS_FILE=str(broken),
                               **pair.env()), "people-refused").start()
    try:
        assert worker.wait_exit(120) == 78
        logs = worker.logs()
        assert "cannot start: WEB_TOKENS_FILE" in logs and "line 3: the third field" in logs
        assert pasted not in logs and "Traceback" not in logs
    finally:
        if worker.alive:
            worker.kill()
