"""The rules the chaos checker holds the pipeline to, written out again here.

Nothing is imported from ``app/``: a rule the pipeline got wrong must not be wrong in the
checker for the same reason. Each rule below is taken from the docs (sections "How
exactly-once works here", "The order state machine", "Dead-letter records", "Compensation")
and from what ``tables/schema.py`` says the columns hold; the pipeline's own copy lives in
``app/pipeline/states.py`` and ``app/pipeline/steps.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import permutations

CREATED, PAID, CONFIRMED, CANCELLED = 1, 2, 3, 4          # t_order.status; the integer is the rank
STATUS_NAME = {None: "none", CREATED: "CREATED", PAID: "PAID", CONFIRMED: "CONFIRMED", CANCELLED: "CANCELLED"}

# What each event type moves its order to (its local step), and its external effect, if any.
TARGET = {"ORDER_CREATED": CREATED, "ORDER_PAID": PAID, "ORDER_CONFIRM": CONFIRMED, "ORDER_CANCEL": CANCELLED}
LOCAL_STEP = {"ORDER_CREATED": "create_order", "ORDER_PAID": "mark_paid", "ORDER_CONFIRM": "mark_confirmed",
              "ORDER_CANCEL": "mark_cancelled"}
# The effects the checker can hold to exactly once (``harness.chaos.orders``: one check each), by the
# name the pipeline declares them under, with the step and the event type that call them, and the
# providers' contracts the check has a rule for (the manifest says which provider and contract the
# run deployed: ``effect_steps``, from the providers' registry). An effect the pipeline declares and
# this does not name, or a contract it has no rule for, is a violation of the run
# (``unchecked_effects``): a new effect or provider must come with its check, or a chaos run would
# pass without checking it.
CHECKED_EFFECTS = {"waybill": ("issue_waybill", "ORDER_CONFIRM"), "sms": ("send_cancel_sms", "ORDER_CANCEL")}
# What "exactly once" means for each contract:
# * replays, refuses_duplicates: one effect at the provider for a done step, carrying its token; none
#   for a step that never ran; a step whose call was made and then voided (stale) leaves its effect
#   for a person;
# * lookup: the same, and never an outcome left unknown (the provider can be asked);
# * none: at most one effect; an outcome left unknown waits for a person (a dead letter of its event).
# And for every contract: a provider keeps a key for a while only (the manifest's ``keys_kept_for_seconds``);
# no call carries a key the provider first took longer ago than that (``replayed_past_horizon``: it may be
# new to the provider again), and a step left for that reason is pending with a person
# (``key_horizon_passed``), not ``pending_left``.
CHECKED_CONTRACTS = {"waybill": frozenset({"replays", "refuses_duplicates"}), "sms": frozenset({"lookup", "none"})}
EFFECT_STEP = {type_: step for step, type_ in CHECKED_EFFECTS.values()}
# Any other effect is held to its contract alone, when that is one a call made twice cannot make
# twice (``orders.OrderCheck.by_contract``): at most one effect at the provider for each order,
# exactly one for a done step, carrying its token; none for a step that never ran or was voided,
# unless a person has it. Its fake files what it did in the ledger's ``effects``, and the manifest
# names the services its calls are recorded as (``effect_steps``' ``services``: the call first).
# Its rows and its calls are read like the others'; a contract outside this set needs a check of its own.
BY_CONTRACT = frozenset({"replays", "refuses_duplicates"})
# What the fakes' ledger may record calls to when the manifest does not say (``effect_steps``'
# ``services``): each shipped provider's calls, then its lookups.
SERVICES = frozenset({"waybill", "express", "express_lookup", "sms", "sms_lookup"})
WAYBILL_SERVICES = ("waybill", "express")        # the calls that carry a waybill step's token as "key"
TYPES = tuple(TARGET)

# The only moves an order makes; None is "no order yet". Anything else is stale (the order is
# at or past the target) or not ready (an earlier move is missing).
MOVES = frozenset({(None, CREATED), (CREATED, PAID), (PAID, CONFIRMED),
                   (CREATED, CANCELLED), (PAID, CANCELLED), (CONFIRMED, CANCELLED)})
APPLIED, STALE, NOT_READY = "applied", "stale", "not_ready"

# t_idem.status, and the outcomes the checker reads in it.
PENDING, DONE, FAILED = 1, 2, 3
UNKNOWN_SMS = "unknown_outcome_non_idempotent"   # an SMS that may have gone out; no lookup to ask
PAST_HORIZON = "key_horizon_passed"              # a step whose provider may have forgotten its key: a person's

# t_compensation.status
LEDGER_STATUS = {1: "open", 2: "retrying", 3: "compensated", 4: "manual", 5: "discarded", 6: "superseded",
                 7: "resolved"}
UNSETTLED = frozenset({"open", "retrying"})      # the drain should have left none

# Dead-letter reasons of records that break the event contract ("Dead-letter records").
MALFORMED_EXACT = frozenset({"not_utf8", "not_json", "not_object", "empty_value", "oversized", "unreadable_record",
                             "header_not_utf8", "unknown_type", "bad_order_no", "missing_key", "key_mismatch"})
MALFORMED_PREFIXES = ("missing_field:", "bad_field:")
# The workload's labels for malformed records, and the reasons each may be dead-lettered with.
# A label named after a reason must get that reason; an unknown label any malformed reason.
KIND_REASONS = {
    "not_json": {"not_json", "not_utf8"},
    "no_order_no": {"missing_field:order_no", "bad_field:order_no"},
    "bad_type": {"unknown_type", "missing_field:type", "bad_field:type"},
    "bad_amount": {"bad_field:data.amount_cents"},
    "null_key_value": {"empty_value"},
    "tombstone": {"empty_value"},
    "data_not_object": {"bad_field:data"},          # an outbox payload that is a list
}


def judge(current: int | None, target: int) -> str:
    """What an event moving an order to ``target`` does to an order in ``current``."""
    if (current, target) in MOVES:
        return APPLIED
    if current is not None and current >= target:
        return STALE
    return NOT_READY


def step_keys(order_no: str, type_: str) -> tuple[str, str | None]:
    """The ``t_idem`` keys of an event: ``<order_no>:<type>:<step>``, local step and effect step."""
    effect = EFFECT_STEP.get(type_)
    return f"{order_no}:{type_}:{LOCAL_STEP[type_]}", None if effect is None else f"{order_no}:{type_}:{effect}"


def unchecked_effects(declared: Iterable[dict]) -> list[str]:
    """The declared effect steps (``{"event_type", "step", "effect"}``, from the manifest) this checker
    does not check: an effect it does not know and cannot hold to its contract alone (``BY_CONTRACT``),
    or a known effect at a step or event type it does not expect."""
    unknown = []
    for d in declared:
        known = CHECKED_EFFECTS.get(d["effect"])
        if known is None and d.get("contract") in BY_CONTRACT and d.get("services"):
            continue
        if known is None:
            unknown.append(f"effect {d['effect']!r} (step {d['step']} of {d['event_type']}, contract "
                           f"{d.get('contract')!r}): the checker has no exactly-once check for it; deploy it with a "
                           f"provider of a contract it holds any effect to ({', '.join(sorted(BY_CONTRACT))}) and a "
                           "fake that files its effects, or add a check to harness/chaos/orders.py and name it in "
                           "harness/chaos/rules.py CHECKED_EFFECTS")
        elif known != (d["step"], d["event_type"]):
            unknown.append(f"effect {d['effect']!r} at step {d['step']} of {d['event_type']}: the checker checks it "
                           f"at step {known[0]} of {known[1]} only")
        elif d.get("contract") not in CHECKED_CONTRACTS[d["effect"]]:
            unknown.append(f"effect {d['effect']!r} deployed with the provider {d.get('provider')!r} of contract "
                           f"{d.get('contract')!r}: the checker has no exactly-once rule for that contract there "
                           f"(it has {', '.join(sorted(CHECKED_CONTRACTS[d['effect']]))}); add one to "
                           "harness/chaos/orders.py and name it in harness/chaos/rules.py CHECKED_CONTRACTS")
    return unknown


def by_contract(declared: Iterable[dict] | None) -> list[dict]:
    """The declared effect steps held to their contract alone (the others have checks of their own)."""
    return [d for d in declared or () if d["effect"] not in CHECKED_EFFECTS and d.get("contract") in BY_CONTRACT]


def effect_steps(declared: Iterable[dict] | None) -> dict[str, list[str]]:
    """Each event type's effect steps, in order: the manifest's (``effect_steps``), else the ones this
    checker knows."""
    if declared is None:
        return {type_: [step] for type_, step in EFFECT_STEP.items()}
    found: dict[str, list[str]] = {}
    for d in declared:
        found.setdefault(d["event_type"], []).append(d["step"])
    return found


def known_services(declared: Iterable[dict] | None) -> frozenset[str]:
    """What the fakes' ledger may record calls to: the shipped providers' services, and those the
    manifest names for the run's providers."""
    return SERVICES | {service for d in declared or () for service in d.get("services") or ()}


def call_services(declared: Iterable[dict] | None, effect: str) -> tuple[str, ...]:
    """The services whose calls carry a step of ``effect``'s token as ``key``: each of its run's providers'
    call (the first of its services), and for the waybill every shipped provider's."""
    named = tuple(d["services"][0] for d in declared or () if d["effect"] == effect and d.get("services"))
    return tuple(dict.fromkeys((*named, *(WAYBILL_SERVICES if effect == "waybill" else ()))))


def keys_kept_for(declared: Iterable[dict] | None, effect: str) -> float | None:
    """How long the run's provider of ``effect`` keeps a key, in seconds (the manifest's ``effect_steps``;
    None: for ever, or not said)."""
    return next((d.get("keys_kept_for_seconds") for d in declared or () if d["effect"] == effect), None)


def contract_of(declared: Iterable[dict] | None, effect: str) -> str | None:
    """The contract the run deployed for ``effect`` (the manifest's ``effect_steps``)."""
    return next((d.get("contract") for d in declared or () if d["effect"] == effect), None)


def final_state(types: Iterable[str]) -> int | None:
    """Where an order ends once every one of its events has run, retried as often as needed,
    in whatever order they came: a function of the *set* of its event types.

    CANCEL applies from any state and nothing leaves CANCELLED, so with a CREATED it wins.
    Without CANCEL the order climbs CREATED -> PAID -> CONFIRMED as far as the chain goes
    (a CONFIRM without a PAID is never ready). Without CREATED there is no order at all."""
    kinds = set(types)
    if "ORDER_CREATED" not in kinds:
        return None
    if "ORDER_CANCEL" in kinds:
        return CANCELLED
    if "ORDER_PAID" in kinds:
        return CONFIRMED if "ORDER_CONFIRM" in kinds else PAID
    return CREATED


def is_malformed_reason(reason: str | None) -> bool:
    return bool(reason) and (reason in MALFORMED_EXACT or reason.startswith(MALFORMED_PREFIXES))


def reason_fits(kind: str | None, reason: str | None) -> bool:
    """Is ``reason`` a dead-letter reason a malformed record of label ``kind`` may get?"""
    if not is_malformed_reason(reason):
        return False
    if kind in KIND_REASONS:
        return reason in KIND_REASONS[kind]
    if kind in MALFORMED_EXACT:
        return reason == kind
    return True


def replay(moves: Sequence[tuple[object, str, str, Sequence[int]]]) -> tuple[bool, int | None, str]:
    """Run an order's recorded local steps through the state machine again.

    ``moves`` are ``(when, event type, outcome, offsets)`` of its done local rows: ``when`` is
    ``t_idem.gmt_create``, the database clock of the T1 that wrote the row (T1s of one order
    are serialised by its row locks, so they are ordered by it); ``offsets`` are those of the
    records asking for that event (the original and its copies: one of them wrote the row).
    Rows written by one T1 share their time, and one T1 judges its events in offset order, so
    a tie is ordered by offsets: every order of it is tried in which some record of each event
    comes after one of the event before it. Returns whether some order explains every outcome
    (an ``applied`` row a legal forward move, a ``stale`` row an order at or past its target),
    the state that order ends in, and, if none does, what broke."""
    groups: list[list[tuple[str, str, Sequence[int]]]] = []
    last = object()
    for when, type_, outcome, offsets in sorted(moves, key=lambda m: (m[0], min(m[3], default=0))):
        if when != last:
            groups.append([])
            last = when
        groups[-1].append((type_, outcome, offsets))
    first_error = ""

    def in_offset_order(order) -> bool:
        after = -1
        for _, _, offsets in order:
            later = [o for o in offsets if o > after]
            if not later:
                return False
            after = min(later)
        return True

    def walk(index: int, state: int | None):
        nonlocal first_error
        if index == len(groups):
            return state
        tried = [order for order in permutations(groups[index]) if in_offset_order(order)]
        for order in tried or [tuple(groups[index])]:
            current, broke = state, ""
            for type_, outcome, _ in order:
                verdict = judge(current, TARGET[type_])
                if verdict != outcome:
                    broke = (f"{type_} recorded {outcome!r} while the order was {STATUS_NAME[current]} "
                             f"(the rules say {verdict})")
                    break
                if verdict == APPLIED:
                    current = TARGET[type_]
            if broke:
                first_error = first_error or broke
                continue
            end = walk(index + 1, current)
            if end is not False:
                return end
        return False

    end = walk(0, None)
    return (False, None, first_error) if end is False else (True, end, "")
