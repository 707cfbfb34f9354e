"""Every order of the run: where it ended, how it got there, and what its effects were.

The final state must be the one the *set* of the order's events leads to
(``rules.final_state``), unless the events missing from it are dead letters left to a
person. How it got there is checked by replaying its recorded local steps in the database's
order (``rules.replay``): every ``applied`` row a legal forward move, every ``stale`` row an
order already at or past its target, ending where ``t_order`` is; a state below that end
moved backwards. Effects are counted in the fake services' ledger, which records what the
services did, not what the pipeline believes (its ``effects``: what each fake did, by effect and order):

* a done waybill step: exactly one waybill, a receipt naming it and the step's token, and
  every call of the order carrying that token; a waybill step failed ``stale`` (a CANCEL came
  first): no waybill and no receipt; a CONFIRMED order: a done waybill step;
* a done SMS step: exactly one message, with the step's token as ``client_ref``; an SMS whose
  outcome stayed unknown (a gateway without lookup): at most one message and a dead letter of
  its CANCEL with a person; with a lookup, never unknown;
* never a second waybill or SMS for an order, nor a receipt without its waybill;
* never a waybill call carrying a key its provider took longer ago than it keeps keys (the manifest's
  ``keys_kept_for_seconds``): such a call may be new to the provider, a second waybill, not a replay;
* any other effect the manifest declares, with a provider whose contract makes a call made twice
  one effect (``rules.BY_CONTRACT``), by that contract alone, from what its fake filed in the ledger's
  ``effects``: at most one per order; a done step: exactly one, carrying the step's token, and every
  call of the order carrying that token; an applied event: its step done, voided (stale) or with a
  person; an effect with no done step: a person has it. The same horizon rule holds for its calls.
"""

from __future__ import annotations

from harness.chaos import rules
from harness.chaos.accounting import Accountant, describe_row


class OrderCheck:
    def __init__(self, books: Accountant) -> None:
        self.books = books
        self.m, self.t, self.f, self.a, self.fakes = books.m, books.t, books.f, books.a, books.fakes
        self.requests, self.types_of, self.ledger_at = books.requests, books.types_of, books.ledger_at
        self.second_effects: set[str] = set()      # orders with a waybill, SMS or receipt too many

    def run(self) -> set[str]:
        for order_no in sorted(set(self.m.get("orders", {})) | set(self.types_of)):
            self.order(order_no)
        return self.second_effects

    def order(self, order_no: str) -> None:
        kinds = self.types_of.get(order_no, set())
        moves = []
        for type_ in rules.TYPES:
            for key in {*filter(None, rules.step_keys(order_no, type_)), *self.books.effect_keys(order_no, type_)}:
                if key in self.t.idem and type_ not in kinds:
                    self.f.flag("misaccounted", f"{key}: a step of an event that was never produced")
            local = self.t.idem.get(rules.step_keys(order_no, type_)[0])
            if type_ in kinds and local and local["status"] == rules.DONE:
                offsets = [e["offset"] for e in self.requests[(order_no, type_)]]
                moves.append((local["gmt_create"], type_, local["outcome"], offsets))
        row = self.t.orders.get(order_no)
        actual = row["status"] if row else None
        explained, end, why = rules.replay(moves)
        if not explained:
            self.f.flag("regressions", f"{order_no}: {why}")
        elif actual != end:
            how = "moved backwards" if end is not None and (actual is None or actual < end) else \
                "moved without a recorded step"
            self.f.flag("regressions", f"{order_no}: t_order says {rules.STATUS_NAME.get(actual, actual)}, its "
                                       f"recorded steps lead to {rules.STATUS_NAME[end]} ({how})")
        elif end != rules.final_state(kinds):
            missing = [t for t in kinds if self.books.request_end(order_no, t) not in ("done", "stale")]
            if missing and all(self.ledger_at.get((e["partition"], e["offset"]))
                               for t in missing for e in self.requests[(order_no, t)]):
                self.a.unfinished_orders += 1
            else:
                self.f.flag("regressions", f"{order_no}: ends {rules.STATUS_NAME[end]}, its events "
                                           f"{sorted(kinds)} lead to {rules.STATUS_NAME[rules.final_state(kinds)]}")
        if self.fakes is not None:      # None: the services' ledger could not be read
            self.waybill(order_no, actual)
            self.sms(order_no)
            for declared in rules.by_contract(self.m.get("effect_steps")):
                self.by_contract(order_no, declared)
            for effect in {d["effect"] for d in self.m.get("effect_steps") or ()} | {"waybill"}:
                self.past_horizon(order_no, effect)

    def waybill(self, order_no: str, actual: int | None) -> None:
        issued = [done.get("reference") for done in self.effects_of("waybill", order_no)]
        receipt = self.t.receipts.get(order_no)
        self.a.effects["waybills"] += len(issued)
        self.a.effects["receipts"] += receipt is not None
        step = self.t.idem.get(rules.step_keys(order_no, "ORDER_CONFIRM")[1])
        if len(issued) > 1:
            self.duplicate(order_no, f"{len(issued)} waybills {issued}", len(issued) - 1)
        if step is not None and step["status"] == rules.DONE:
            if not issued:
                self.f.flag("missing_effects", f"{order_no}: the waybill step is done, the API issued none")
            if receipt is None:
                self.f.flag("missing_effects", f"{order_no}: a waybill {issued} and no receipt")
            elif receipt["waybill_no"] not in issued or receipt["idem_token"] != step["idem_token"]:
                self.f.flag("missing_effects", f"{order_no}: the receipt ({receipt['waybill_no']}, token "
                                               f"{receipt['idem_token']}) is not the API's {issued} for the step's "
                                               f"token {step['idem_token']}")
            keys = {c.get("key") for service in rules.call_services(self.m.get("effect_steps"), "waybill")
                    for c in self.books.calls(service, order_no)}
            if keys - {step["idem_token"]}:
                self.f.flag("misaccounted", f"{order_no}: waybill calls carried {len(keys)} tokens, not only the "
                                            f"step's {step['idem_token']}")
            return
        if actual == rules.CONFIRMED and not self.books.left_to_person(order_no, "ORDER_CONFIRM"):
            self.f.flag("missing_effects", f"{order_no}: CONFIRMED, but its waybill step is "
                                           f"{'absent' if step is None else describe_row(step)}")
        if receipt is not None:
            self.duplicate(order_no, f"a receipt {receipt['waybill_no']} for a waybill step that is "
                                     f"{'absent' if step is None else describe_row(step)}", 1)
        stale = step is not None and step["status"] == rules.FAILED and step["outcome"] == rules.STALE
        if stale:
            cancel = self.t.idem.get(rules.step_keys(order_no, "ORDER_CANCEL")[0])
            if not (cancel and cancel["outcome"] == rules.APPLIED and cancel["gmt_create"] <= step["gmt_modified"]):
                self.f.flag("regressions", f"{order_no}: the waybill step is stale, but no CANCEL ran before it")
        if issued and (step is None or stale):
            # The call was made (its outcome unknown) and the order was cancelled before the re-claim:
            # a waybill exists that no receipt records.
            self.f.flag("missing_effects", f"{order_no}: waybill {issued[0]} issued, no receipt records it (the "
                                           f"step is {'absent' if step is None else describe_row(step)})")

    def effects_of(self, effect: str, order_no: str) -> list[dict]:
        """What the providers of ``effect`` did for the order, as their fakes filed it (the ledger's
        ``effects``: each with its ``reference``, the ``key`` it was asked under, ``at`` and ``provider``)."""
        return self.fakes.get("effects", {}).get(effect, {}).get(order_no, [])

    def by_contract(self, order_no: str, declared: dict) -> None:
        """An effect with no check of its own, held to its provider's contract (``rules.BY_CONTRACT``)."""
        effect, type_ = declared["effect"], declared["event_type"]
        done = self.effects_of(effect, order_no)
        step = self.t.idem.get(f"{order_no}:{type_}:{declared['step']}")
        local = self.t.idem.get(rules.step_keys(order_no, type_)[0])
        person = self.books.left_to_person(order_no, type_)
        self.a.effects[effect] += len(done)
        if len(done) > 1:
            self.duplicate(order_no, f"{len(done)} {effect} effects {[d.get('reference') for d in done]}",
                           len(done) - 1)
        if step is not None and step["status"] == rules.DONE:
            if step["idem_token"] not in {d.get("key") for d in done}:
                self.f.flag("missing_effects", f"{order_no}: the {declared['step']} step is done, the provider did "
                                               f"{len(done)} {effect} effects, none under its token {step['idem_token']}")
            keys = {c.get("key") for service in rules.call_services([declared], effect)
                    for c in self.books.calls(service, order_no)}
            if keys - {step["idem_token"]}:
                self.f.flag("misaccounted", f"{order_no}: {effect} calls carried {len(keys)} tokens, not only the "
                                            f"step's {step['idem_token']}")
            return
        stale = step is not None and step["status"] == rules.FAILED and step["outcome"] == rules.STALE
        applied = local is not None and local["status"] == rules.DONE and local["outcome"] == rules.APPLIED
        if applied and not stale and not person:
            self.f.flag("missing_effects", f"{order_no}: its {type_} applied, its {declared['step']} step is "
                                           f"{'absent' if step is None else describe_row(step)}")
        if done and not person:
            self.f.flag("missing_effects", f"{order_no}: the provider did {effect} {done[0].get('reference')}, its "
                                           f"{declared['step']} step is {'absent' if step is None else describe_row(step)}")

    def past_horizon(self, order_no: str, effect: str) -> None:
        """Calls that repeated a key after the provider may have forgotten it (from its first taking)."""
        horizon = rules.keys_kept_for(self.m.get("effect_steps"), effect)
        if horizon is None:
            return
        for service in rules.call_services(self.m.get("effect_steps"), effect):
            taken = (self.fakes.get("keys") or {}).get(service) or {}
            for call in self.books.calls(service, order_no):
                first = taken.get(call.get("key"))
                if first is not None and call.get("at", 0) - first > horizon:
                    self.f.flag("replayed_past_horizon", f"{order_no}: a {service} call with key {call['key']} "
                                                         f"{call['at'] - first:.1f}s after the provider first took "
                                                         f"it; it keeps keys {horizon:g}s")

    def sms(self, order_no: str) -> None:
        sent = self.effects_of("sms", order_no)
        self.a.effects["sms"] += len(sent)
        step = self.t.idem.get(rules.step_keys(order_no, "ORDER_CANCEL")[1])
        if len(sent) > 1:
            self.duplicate(order_no, f"{len(sent)} SMS {[m.get('reference') for m in sent]}", len(sent) - 1)
        if step is not None and step["status"] == rules.DONE:
            if not sent:
                self.f.flag("missing_effects", f"{order_no}: the SMS step is done, the gateway sent none")
            elif step["idem_token"] not in {m.get("key") for m in sent}:
                self.f.flag("missing_effects", f"{order_no}: no SMS carries the step's client_ref "
                                               f"{step['idem_token']}")
            return
        if step is not None and step["status"] == rules.FAILED and step["outcome"] == rules.UNKNOWN_SMS:
            if rules.contract_of(self.m.get("effect_steps"), "sms") == "lookup" or (
                    "effect_steps" not in self.m and self.m.get("sms_lookup")):
                self.f.flag("missing_effects", f"{order_no}: the SMS was left unknown although the gateway "
                                               "answers lookups")
            if not self.books.left_to_person(order_no, "ORDER_CANCEL"):
                self.f.flag("missing_effects", f"{order_no}: the SMS's outcome is unknown and no dead letter "
                                               "of its CANCEL waits for a person")
            self.a.effects["sms_unknown_manual"] += 1
            return
        if sent and (step is None or step["status"] == rules.FAILED):
            self.f.flag("missing_effects", f"{order_no}: an SMS went out, its step is "
                                           f"{'absent' if step is None else describe_row(step)}")

    def duplicate(self, order_no: str, what: str, n: int) -> None:
        self.second_effects.add(order_no)
        self.f.flag("duplicate_effects", f"{order_no}: {what}", n)
