"""Every produced record accounted for exactly once, from the tables the run left behind.

How "accounted for exactly once" is established from what the run left behind
------------------------------------------------------------------------------
A record is identified by its coordinates (partition, offset) on the events topic. It can
end in exactly one of three ways, and the tables say which:

* **dead-lettered**: ``t_compensation`` has a row for it. The ledger is unique by (consumer
  group, topic, partition, offset, timestamp) and is written *before* the record goes to the
  dead-letter topic and before its batch may be committed, so a dead-lettered record has
  exactly one row, whatever was replayed. Two rows for one (group, topic, partition,
  offset) is a record accounted twice. The row says the reason and what became of it
  (compensated, superseded, manual, ...); a compensated row must find its event's steps done,
  a superseded one its event stale. A malformed record must be here, with a contract reason
  that fits its kind, and a valid event must not be here as malformed.
* **done** or **stale**: no ledger row, and the event's steps are finished in ``t_idem``. Its
  keys are ``<order_no>:<type>:<step>``: the local step's row is inserted ``done`` with outcome
  ``applied`` or ``stale`` in the T1 that judged it, the effect step's row ends ``done`` (the
  call succeeded, receipt written) or ``failed stale`` (the order had moved past it, never
  called). The keys carry no event id, so an exact duplicate and a re-published copy (new
  event id, same request) land on the original's rows: the rows account for the *request*
  once, and each copy is accounted by them without a second effect. That a copy was read at
  all is shown by the committed offsets, which must reach the end of every partition.
* **skipped**: a record of a type the processor does not handle (the workload's ``bad_type``),
  with no ledger row: the workers skip such types by default (``UNHANDLED_EVENT_TYPES=skip``) and
  keep nothing per record, so what shows it was read is the committed offsets, which must reach
  the end of every partition. Dead-lettered instead (strict workers), its reason must fit.
* **lost**: neither. A local row missing, an effect row still pending, or one failed for
  good with no dead letter to say so (a failed step's event is dead-lettered every time it is
  delivered again, so each copy carries its own ledger row), or a record the manifest lists
  that is not on the topic.

The dead-letter topic is the ledger's transport, not its record: a copy can go out twice (a
worker killed after the send, before the commit), and a row can have no copy (killed before
the send, and the replay then succeeded: the compensator's timer settles the row from the
ledger). So a copy on the topic must have its ledger row and carry the original record; extra
copies and rows without one are counted, not failed.

After a failover that lost rows (``--db-failover async``) the ledger row of a copy may be gone:
the dead primary had it (the driver's forensics list the ledger rows it lost, in the manifest),
the promoted replica never got it. For those records only, and counted in ``failover_ledger``
instead of failed: a copy without its row, the row the compensator then filed for a person
(``no_ledger_row``), and such a row taken over by the replay's own dead letter, which keeps the
name-less columns of the compensator's row. The record itself is accounted for like any other.

Orders and their effects are checked in ``harness.chaos.orders``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from harness.chaos import rules
from harness.chaos.evidence import Tables, TopicRead

PROBLEM_LINES = 50
VALID = ("original", "exact_duplicate", "republished")
PERSON = frozenset({"manual", "discarded", "resolved"})          # a dead letter left to, or closed by, a person


@dataclass
class Findings:
    """Violations by kind, and one line per violation (the first ``PROBLEM_LINES``)."""

    counts: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    total: int = 0

    def flag(self, kind: str, line: str, n: int = 1) -> None:
        self.counts[kind] += n
        self.total += 1
        if len(self.problems) < PROBLEM_LINES:
            self.problems.append(f"{kind}: {line}")


@dataclass
class Accounts:
    """What the accounting found, beside the violations."""

    accounted: dict = field(default_factory=lambda: {"done": 0, "stale": 0, "skipped": 0, "dead_letter": Counter()})
    by_kind: dict = field(default_factory=lambda: defaultdict(Counter))
    late: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)         # ledger rows by reason
    ledger_status: Counter = field(default_factory=Counter)        # ledger rows by status
    manual_by_reason: Counter = field(default_factory=Counter)
    dlq: Counter = field(default_factory=Counter)
    effects: Counter = field(default_factory=Counter)
    duplicates_stopped: int = 0
    unfinished_orders: int = 0
    failover_ledger: Counter = field(default_factory=Counter)     # what a failover's lost ledger rows left


class Accountant:
    def __init__(self, manifest: dict, events: TopicRead, dlq: TopicRead, tables: Tables, fakes: dict | None,
                 findings: Findings) -> None:
        self.m = manifest
        self.events, self.dlq, self.t, self.fakes, self.f = events, dlq, tables, fakes, findings
        self.a = Accounts()
        self.produced = manifest["produced"]
        self.on_topic = {(r.partition, r.offset): r for r in events.records}
        self.ledger_at: dict[tuple[int, int], list[dict]] = defaultdict(list)
        for row in tables.ledger:
            if row["src_topic"] == manifest["events_topic"]:
                self.ledger_at[(row["src_partition"], row["src_offset"])].append(row)
        self.requests: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for entry in self.produced:
            if entry["kind"] in VALID:
                self.requests[(entry["order_no"], entry["type"])].append(entry)
        self.types_of: dict[str, set[str]] = defaultdict(set)
        for order_no, type_ in self.requests:
            self.types_of[order_no].add(type_)
        self.originals_of: dict[str, set[str]] = defaultdict(set)
        for entry in self.produced:
            if entry["kind"] == "original":
                self.originals_of[entry["order_no"]].add(entry["type"])
        self.lost_ledger = lost_ledger_rows(manifest)
        self.effect_steps = rules.effect_steps(manifest.get("effect_steps"))     # per event type
        self.calls_of: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for call in (fakes or {}).get("calls", []):
            self.a.effects[f"{call.get('service')}_calls"] += 1
            order = (call.get("body") or {}).get("order_no")      # a service whose request names the order
            if order is not None:
                self.calls_of[(call.get("service"), order)].append(call)

    def run(self) -> Accounts:
        self.manifest_against_topic()
        for entry in self.produced:
            self.account(entry)
        self.ledger_rows_nobody_listed()
        self.dead_letter_topic()
        self.pending()
        return self.a

    def duplicates_stopped(self, orders_with_second_effects: set[str]) -> int:
        """Exact and re-published duplicates accounted for, whose order shows no second effect."""
        return sum(1 for e in self.produced if e["kind"] in ("exact_duplicate", "republished")
                   and e["order_no"] not in orders_with_second_effects and self.category(e) != "lost")

    # -- the manifest against the topic ---------------------------------------------------

    def manifest_against_topic(self) -> None:
        if self.events.error:
            return
        listed = {(e["partition"], e["offset"]) for e in self.produced}
        for coords in sorted(set(self.on_topic) - listed):
            self.f.flag("manifest_mismatches", f"record {coords} is on {self.m['events_topic']} but not in the manifest")
        by_id = {e["event_id"]: e for e in self.produced if e["kind"] == "original"}
        for entry in self.produced:
            record = self.on_topic.get((entry["partition"], entry["offset"]))
            if record is None:
                self.f.flag("manifest_mismatches", f"{_name(entry)} is listed but not on the topic")
            elif entry["kind"] in VALID:
                self.same_event(entry, record, by_id.get(entry.get("duplicate_of")))
        for order_no, spec in self.m.get("orders", {}).items():
            if set(spec.get("lifecycle", ())) != self.originals_of.get(order_no, set()):
                self.f.flag("manifest_mismatches", f"{order_no}: lifecycle {spec.get('lifecycle')} is not the "
                                                   "set of its original events")

    def same_event(self, entry: dict, record, original: dict | None) -> None:
        if self.m.get("envelope") == "outbox":          # the EventRouter's: the id and type in headers
            seen = (record.key, record.header("id"), record.key.decode("utf-8", "replace") if record.key else None,
                    record.header("eventType"))
        else:
            try:
                doc = json.loads(record.value)
                seen = (record.key, doc.get("event_id"), doc.get("order_no"), doc.get("type"))
            except (TypeError, ValueError, AttributeError):
                seen = (record.key, None, None, None)
        wanted = (entry["order_no"].encode(), entry["event_id"], entry["order_no"], entry["type"])
        if seen != wanted:
            self.f.flag("manifest_mismatches", f"{_name(entry)}: the topic holds {seen!r}")
        if entry["kind"] == "exact_duplicate" and entry.get("duplicate_of") != entry["event_id"]:
            self.f.flag("manifest_mismatches", f"{_name(entry)}: an exact duplicate with another event_id")
        if entry["kind"] == "republished" and (original is None or entry["event_id"] == original["event_id"]
                                               or (original["order_no"], original["type"])
                                               != (entry["order_no"], entry["type"])):
            self.f.flag("manifest_mismatches", f"{_name(entry)}: not a re-publication of {entry.get('duplicate_of')}")

    # -- one record -----------------------------------------------------------------

    def effect_keys(self, order_no: str, type_: str) -> list[str]:
        """The ``t_idem`` keys of the request's effect steps (every one the manifest declares)."""
        return [f"{order_no}:{type_}:{step}" for step in self.effect_steps.get(type_, ())]

    def request_end(self, order_no: str, type_: str) -> str:
        """How the request's steps ended: done, stale, failed, pending, absent or broken (of several
        effect steps, the one furthest from done says it)."""
        local = self.t.idem.get(rules.step_keys(order_no, type_)[0])
        if local is None:
            return "absent"
        if local["status"] != rules.DONE or local["outcome"] not in (rules.APPLIED, rules.STALE):
            return "broken"
        if local["outcome"] == rules.STALE:
            return "stale"
        ends = {_effect_end(self.t.idem.get(key)) for key in self.effect_keys(order_no, type_)}
        return next((end for end in ("broken", "pending", "failed", "stale") if end in ends), "done")

    def category(self, entry: dict) -> str:
        rows = self.ledger_at.get((entry["partition"], entry["offset"]), [])
        if rows:
            return "dead_letter"
        if entry.get("malformed_kind") == "bad_type":
            return "skipped"          # a type not handled (UNHANDLED_EVENT_TYPES=skip): its commit shows it read
        if entry["kind"] not in VALID:
            return "lost"
        if not self.events.error and (entry["partition"], entry["offset"]) not in self.on_topic:
            return "lost"
        end = self.request_end(entry["order_no"], entry["type"])
        return end if end in ("done", "stale") else "lost"

    def account(self, entry: dict) -> None:
        rows = self.ledger_at.get((entry["partition"], entry["offset"]), [])
        category = self.category(entry)
        self.a.by_kind[entry["kind"]][category] += 1
        if entry.get("late"):
            self.a.late[category] += 1
        if len(rows) > 1:
            self.f.flag("double_accounted", f"{_name(entry)} has {len(rows)} ledger rows "
                                            f"(ids {[r['id'] for r in rows]})")
        if rows:
            self.a.accounted["dead_letter"][rows[0]["reason"]] += 1
            self.dead_lettered(entry, rows[0])
        elif category == "lost":
            if entry["kind"] not in VALID:
                why = "malformed, and not dead-lettered"
            elif (entry["partition"], entry["offset"]) not in self.on_topic and not self.events.error:
                why = "not on the topic"
            else:
                why = f"not dead-lettered, and its steps are {self.request_end(entry['order_no'], entry['type'])}"
            self.f.flag("lost", f"{_name(entry)}: {why}")
        else:
            self.a.accounted[category] += 1

    def dead_lettered(self, entry: dict, row: dict) -> None:
        status, reason = rules.LEDGER_STATUS.get(row["status"], str(row["status"])), row["reason"]
        where = f"{_name(entry)} (ledger row {row['id']}, {reason}, {status})"
        if status in rules.UNSETTLED:
            self.f.flag("unsettled", f"{where}: still {status} after the drain")
        coords = (entry["partition"], entry["offset"])
        if reason == "no_ledger_row" and coords in self.lost_ledger:
            self.a.failover_ledger["filed_for_a_person"] += 1
        elif reason in ("no_ledger_row", "unreadable_dead_letter"):
            self.f.flag("misaccounted", f"{where}: the compensator met a dead letter without its ledger row")
        record = self.on_topic.get((entry["partition"], entry["offset"]))
        if record is not None and row["src_timestamp"] not in (record.timestamp, -1):
            self.f.flag("misaccounted", f"{where}: the row's source timestamp {row['src_timestamp']} is not "
                                        f"the record's {record.timestamp}")
        if entry["kind"] not in VALID:
            if not rules.reason_fits(entry.get("malformed_kind"), reason):
                self.f.flag("misaccounted", f"{where}: a {entry.get('malformed_kind')} record dead-lettered as "
                                            f"{reason!r}")
            if status not in PERSON:
                self.f.flag("misaccounted", f"{where}: a malformed record ended {status}, not with a person")
            return
        if rules.is_malformed_reason(reason):
            self.f.flag("misaccounted", f"{where}: a valid event dead-lettered as malformed")
        if row["order_no"] is None and row["event_id"] is None and coords in self.lost_ledger:
            self.a.failover_ledger["taken_over_by_the_replay"] += 1
        elif (row["order_no"], row["event_id"]) != (entry["order_no"], entry["event_id"]):
            self.f.flag("misaccounted", f"{where}: the row names {row['order_no']} / {row['event_id']}")
        end = self.request_end(entry["order_no"], entry["type"])
        if status == "compensated" and end not in ("done", "stale"):
            self.f.flag("misaccounted", f"{where}: compensated, but its steps are {end}")
        if status == "superseded" and end != "stale":
            self.f.flag("misaccounted", f"{where}: superseded, but its steps are {end}")

    # -- the ledger and the dead-letter topic ---------------------------------------------

    def ledger_rows_nobody_listed(self) -> None:
        listed = {(e["partition"], e["offset"]) for e in self.produced}
        for row in self.t.ledger:
            status = rules.LEDGER_STATUS.get(row["status"], str(row["status"]))
            self.a.dead_letters[row["reason"]] += 1
            self.a.ledger_status[status] += 1
            if status == "manual":
                self.a.manual_by_reason[row["reason"]] += 1
            coords = (row["src_partition"], row["src_offset"])
            if row["src_topic"] != self.m["events_topic"]:
                self.f.flag("misaccounted", f"ledger row {row['id']} ({row['reason']}) is for "
                                            f"{row['src_topic']}{list(coords)}: a dead letter nobody could read")
            elif coords not in listed:
                self.f.flag("misaccounted", f"ledger row {row['id']} ({row['reason']}) is for {coords}, "
                                            "a record the manifest does not list")

    def dead_letter_topic(self) -> None:
        copies: Counter = Counter()
        for record in self.dlq.records:
            if (record.header("dlq.consumer.group"), record.header("dlq.original.topic")) != \
                    (self.m["group"], self.m["events_topic"]):
                self.a.dlq["foreign"] += 1
                continue
            try:
                coords = (int(record.header("dlq.original.partition")), int(record.header("dlq.original.offset")))
            except (TypeError, ValueError):
                self.f.flag("misaccounted", f"dead letter {self.m['dlq_topic']}[{record.partition}]@"
                                            f"{record.offset} does not say where it came from")
                continue
            copies[coords] += 1
            if coords not in self.ledger_at and coords in self.lost_ledger:
                self.a.failover_ledger["copies_without_row"] += 1
            elif coords not in self.ledger_at:
                self.f.flag("misaccounted", f"dead letter of {coords} ({record.header('dlq.error.type')}) "
                                            "has no ledger row")
            original = self.on_topic.get(coords)
            cut = record.header("dlq.truncated") or record.header("dlq.placeholder")
            if original is not None and not cut and (record.key, record.value) != (original.key, original.value):
                self.f.flag("misaccounted", f"dead letter of {coords} does not carry the original record")
        self.a.dlq["records"] = sum(copies.values())
        self.a.dlq["extra_copies"] = sum(n - 1 for n in copies.values())
        if not self.dlq.error:
            self.a.dlq["rows_without_copy"] = sum(1 for c in self.ledger_at if c not in copies)

    def left_to_person(self, order_no: str, type_: str) -> bool:
        """Some record of this request is a dead letter a person has (or had) in hand."""
        return any(rules.LEDGER_STATUS.get(row["status"]) in PERSON
                   for entry in self.requests.get((order_no, type_), [])
                   for row in self.ledger_at.get((entry["partition"], entry["offset"]), []))

    def left_for(self, order_no: str, type_: str, reason: str) -> bool:
        """Some record of this request is a dead letter with a person for ``reason``."""
        return any(rules.LEDGER_STATUS.get(row["status"]) == "manual" and row.get("reason") == reason
                   for entry in self.requests.get((order_no, type_), [])
                   for row in self.ledger_at.get((entry["partition"], entry["offset"]), []))

    def calls(self, service: str, order_no: str) -> list[dict]:
        return self.calls_of.get((service, order_no), [])

    def pending(self) -> None:
        for key, row in sorted(self.t.idem.items()):
            order_no, type_ = key.split(":")[:2]
            if row["status"] == rules.PENDING and self.left_for(order_no, type_, rules.PAST_HORIZON):
                # Its provider may have forgotten its key: kept pending for a person (who may adopt
                # what the provider did), not left behind.
                self.a.effects["past_horizon_manual"] += 1
            elif row["status"] == rules.PENDING:
                self.f.flag("pending_left", f"{key}: pending, attempt {row['attempt']}, owner {row['owner']}, "
                                            f"last outcome {row['outcome']}")


def lost_ledger_rows(manifest: dict) -> set[tuple[int, int]]:
    """(partition, offset) of the events topic's records whose ledger row the failover lost."""
    lost = ((manifest.get("failover") or {}).get("lost") or {}).get("t_compensation") or {}
    return {(partition, offset) for group, topic, partition, offset, _timestamp in lost.get("keys", [])
            if (group, topic) == (manifest["group"], manifest["events_topic"])}


def _effect_end(row: dict | None) -> str:
    if row is None:
        return "broken"
    if row["status"] == rules.DONE:
        return "done"
    if row["status"] == rules.FAILED:
        return "stale" if row["outcome"] == rules.STALE else "failed"
    return "pending"


def _name(entry: dict) -> str:
    what = entry.get("type") or entry.get("malformed_kind") or "record"
    return f"{entry['kind']} {what} of {entry.get('order_no')} at [{entry['partition']}]@{entry['offset']}"


def describe_row(row: dict) -> str:
    status = {rules.PENDING: "pending", rules.DONE: "done", rules.FAILED: "failed"}.get(row["status"], row["status"])
    return f"{status} ({row['outcome']})"
