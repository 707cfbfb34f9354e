"""``t_reconcile_case`` and its history: the cases for a person that the providers' reconciliation
finds (``app.reconcile.providers``), and what people did about them (``app.reconcile.cases``).

A finding is filed as one case per reference (each extra of a duplicate; an orphan; a missing
waybill), unique by (group, kind, effect, reference): a run that finds it again moves its
``last_seen_at`` and, while it is open, its evidence; a closed case stays closed.

Each action closes an open case once. Its statements are guarded the same way: the case's row is
locked (``SELECT ... FOR UPDATE``) and moved only from ``open``, so of two people at once one
closes it and the other is told who did. An adoption writes the receipt and moves the step in
the same transaction, after checking again what the finding saw. A compensation's cancel is a
call to the provider, never made inside a transaction: the case is checked (open, our receipt
holds another waybill, and this deployment's tokens for the order read), the provider asked again
what it holds for the order (``app.reconcile.at_provider``: our receipt's waybill still live, the
extra still live and issued under one of our tokens; otherwise refused, audited, and the case's
evidence refreshed with what the provider said), the provider called (with the case's own key, so
a cancel asked twice is done once; an answer about another waybill is refused and audited), then
the case closed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from app.adapters.effects.provider import Issued
from app.adapters.mysql.reads.receipt_ranges import RECEIPT_TABLES, STEP_COLUMNS, step_keys, step_state
from app.adapters.mysql.sql import Execute, marks
from app.adapters.mysql.store import MySqlStore
from app.observability.metrics import RECONCILE_CASE_ACTIONS, RECONCILE_CASES_OPEN
from app.pipeline.errors import Conflict
from app.pipeline.states import IdemStatus
from app.pipeline.steps import effects_used
from app.reconcile.at_provider import AnswerMismatch
from app.reconcile.cases import CASE_ACTIONS, KINDS, CaseStatus, adoption_refused, compensation_refused, refusal
from app.reconcile.providers import ProviderFinding, Tokens, issued_evidence, our_tokens
from app.render import json_default

COLUMNS = ("id", "kind", "effect", "provider", "order_no", "reference", "evidence", "status", "found_at",
           "last_seen_at", "found_by_run", "closed_at", "closed_by", "note")
AUDIT_COLUMNS = ("at", "actor", "action", "from_status", "to_status", "note", "detail")
CHUNK = 200                 # cases filed in one statement
MAX_LIST = 500



class AtTheProvider(Protocol):
    """What a compensation asks the provider (``app.reconcile.at_provider.AtProvider``)."""

    async def of_order(self, order_no: str) -> Sequence[Issued]:
        """The order's waybills as the provider lists them now."""
        ...

    async def cancel(self, reference: str) -> str:
        """Cancel ``reference``; what to write in the audit (``AnswerMismatch`` for an answer about another)."""
        ...


@dataclass(frozen=True, slots=True)
class Acted:
    """What became of a person's action: ``refused`` says why not (``case`` then says what closed it)."""
    case: dict[str, Any] | None
    changed: bool = False
    refused: str | None = None

    @property
    def found(self) -> bool:
        return self.case is not None


class ReconcileCases:
    def __init__(self, store: MySqlStore, *, group: str, tokens: Tokens) -> None:
        self.store = store
        self.group = group[:255]
        self.tokens = tokens            # which waybills are ours to cancel (app.reconcile.providers.our_tokens)

    async def _run(self, work: Callable[[Execute], Awaitable[Any]]) -> Any:
        return await self.store.in_transaction(lambda tx: work(tx._exec))

    # -- a run files what it found -------------------------------------------------------

    async def file(self, findings: Iterable[ProviderFinding], run_id: int | None) -> dict[str, int]:
        """One case per reference of ``findings``; counts of those ``opened`` now, ``seen_again`` (open
        before) and ``closed_before`` (a person closed it; left so)."""
        rows = {(f.kind, f.effect, ref): f for f in findings for ref in f.references}
        counts = {"opened": 0, "seen_again": 0, "closed_before": 0}
        items = sorted(rows.items())
        for start in range(0, len(items), CHUNK):
            chunk = items[start:start + CHUNK]
            found = await self._run(partial(_file, group=self.group, chunk=chunk, run_id=run_id))
            for key, value in found.items():
                counts[key] += value
        await self.refresh_gauge()
        return counts

    # -- what people read ----------------------------------------------------------------

    async def list(self, status: CaseStatus | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The group's cases of ``status``, or open ones first and then the closed, newest first (at
        most ``limit``): a status at a time from ``idx_group_status_id``, never a sort of them all."""
        limit = max(1, min(limit, MAX_LIST))

        async def work(execute: Execute) -> list[dict[str, Any]]:
            async def newest(of: CaseStatus, n: int) -> list[dict[str, Any]]:
                result = await execute(f"SELECT {', '.join(COLUMNS)} FROM t_reconcile_case WHERE consumer_group = %s "
                                       "AND status = %s ORDER BY id DESC LIMIT %s", [self.group, int(of), n])
                return [_case(row) for row in result]
            if status is not None:
                return await newest(status, limit)
            found = await newest(CaseStatus.OPEN, limit)
            left = limit - len(found)
            if left:
                closed = [case for of in CaseStatus if of is not CaseStatus.OPEN for case in await newest(of, left)]
                found += sorted(closed, key=lambda case: case["id"], reverse=True)[:left]
            return found
        return await self._run(work)

    async def get(self, case_id: int) -> dict[str, Any] | None:
        """One case with its history."""
        async def work(execute: Execute) -> dict[str, Any] | None:
            case = await _get(execute, self.group, case_id)
            if case is not None:
                result = await execute(f"SELECT {', '.join(AUDIT_COLUMNS)} FROM t_reconcile_case_audit "
                                       "WHERE case_id = %s ORDER BY id", [case_id])
                case["history"] = [_history(row) for row in result]
            return case
        return await self._run(work)

    async def open_counts(self) -> dict[str, int]:
        async def work(execute: Execute) -> dict[str, int]:
            result = await execute("SELECT kind, COUNT(*) FROM t_reconcile_case WHERE consumer_group = %s "
                                   "AND status = %s GROUP BY kind", [self.group, int(CaseStatus.OPEN)])
            return {kind: 0 for kind in KINDS} | {row[0]: int(row[1]) for row in result}
        return await self._run(work)

    async def refresh_gauge(self) -> dict[str, int]:
        """``order_reconcile_cases_open{kind}`` from the table; the counts."""
        counts = await self.open_counts()
        for kind, count in counts.items():
            RECONCILE_CASES_OPEN.labels(kind).set(count)
        return counts

    # -- a person acts -------------------------------------------------------------------

    async def act(self, case_id: int, action: str, actor: str, note: str | None, *,
                  provider: AtTheProvider | None = None) -> Acted:
        """``compensate`` (with ``provider``: the case's provider, read again and asked to cancel the
        case's reference), ``adopt`` or ``dismiss`` an open case, once, audited."""
        if action == "compensate":
            if provider is None:
                raise ValueError("a compensation needs the case's provider")
            acted = await self._compensate(case_id, actor, note, provider)
        elif action == "adopt":
            acted = await self._run(lambda execute: _adopt(execute, self.group, case_id, actor, note))
        else:
            if action == "dismiss" and not (note or "").strip():
                raise ValueError("a dismissal needs a note: why nothing is to be done")
            acted = await self._run(lambda execute: _close(execute, self.group, case_id, action, actor, note))
        if acted.changed:
            RECONCILE_CASE_ACTIONS.labels(action).inc()
            await self.refresh_gauge()
        return acted

    async def _compensate(self, case_id: int, actor: str, note: str | None, provider: AtTheProvider) -> Acted:
        before, keeper, stored = await self._run(lambda execute: _compensable(execute, self.group, case_id))
        if before.refused is not None:
            return before
        case = before.case
        assert case is not None and keeper is not None
        reference, order = case["reference"], case["order_no"]
        try:
            # Read again now: the run that filed the case may be hours old (app.reconcile.at_provider).
            listed = await provider.of_order(order)
            ours = our_tokens(self.tokens, case["effect"], order, *stored)
            why = compensation_refused(reference, keeper, listed, ours)
            if why is not None:
                return await self._run(lambda execute: _refuse(execute, self.group, case_id, actor, note, why,
                                                               listed, ours))
            said = await provider.cancel(reference)
        except AnswerMismatch as exc:
            wrong = str(exc)
            await self._run(lambda execute: _audit(execute, case_id, actor, "compensate", CaseStatus.OPEN, None,
                                                   note, wrong))
            return Acted(case, refused=wrong)
        except Exception as exc:
            detail = f"the provider's listing or cancel failed, nothing changed: {exc}"
            await self._run(lambda execute: _audit(execute, case_id, actor, "compensate", CaseStatus.OPEN, None,
                                                   note, detail))
            raise
        return await self._run(lambda execute: _close(execute, self.group, case_id, "compensate", actor, note,
                                                      detail=said, done_anyway=said))


# -- the statements ------------------------------------------------------------------------

async def _file(execute: Execute, *, group: str, chunk: list, run_id: int | None) -> dict[str, int]:
    keys = [key for key, _ in chunk]
    flat = [v for key in keys for v in key]
    result = await execute(
        "SELECT kind, effect, reference, status FROM t_reconcile_case WHERE consumer_group = %s "
        f"AND (kind, effect, reference) IN ({marks(len(keys), '(%s, %s, %s)')}) FOR UPDATE", [group, *flat])
    before = {(row[0], row[1], row[2]): CaseStatus(row[3]) for row in result}
    params: list[Any] = []
    for (kind, effect, ref), finding in chunk:
        evidence = finding.case_evidence(ref)
        params += [group, kind, effect, finding.provider[:32], finding.order_no[:64], ref[:64],
                   json.dumps(evidence, default=json_default, separators=(",", ":")), int(CaseStatus.OPEN), run_id]
    # VALUES(): MariaDB's form, which MySQL 8 still takes (app.adapters.mysql.skipped_types).
    await execute(
        "INSERT INTO t_reconcile_case (consumer_group, kind, effect, provider, order_no, reference, evidence, status, "
        f"found_at, last_seen_at, found_by_run) VALUES {marks(len(chunk), '(%s, %s, %s, %s, %s, %s, %s, %s, NOW(3), NOW(3), %s)')} "
        f"ON DUPLICATE KEY UPDATE evidence = IF(status = {int(CaseStatus.OPEN)}, VALUES(evidence), evidence), "
        "last_seen_at = VALUES(last_seen_at)", params)
    opened = [key for key in keys if key not in before]
    if opened:
        result = await execute(
            "SELECT id, kind FROM t_reconcile_case WHERE consumer_group = %s "
            f"AND (kind, effect, reference) IN ({marks(len(opened), '(%s, %s, %s)')})",
            [group, *[v for key in opened for v in key]])
        run = f"reconcile:{run_id}" if run_id is not None else "reconcile"
        rows = list(result)
        if rows:
            await execute(
                "INSERT INTO t_reconcile_case_audit (case_id, at, actor, action, from_status, to_status, detail) "
                f"VALUES {marks(len(rows), '(%s, NOW(3), %s, %s, NULL, %s, %s)')}",
                [v for case_id, kind in rows for v in (case_id, run, "opened", int(CaseStatus.OPEN), f"found: {kind}")])
    return {"opened": len(opened), "seen_again": sum(1 for s in before.values() if s is CaseStatus.OPEN),
            "closed_before": sum(1 for s in before.values() if s is not CaseStatus.OPEN)}


async def _get(execute: Execute, group: str, case_id: int, *, lock: bool = False) -> dict[str, Any] | None:
    result = await execute(f"SELECT {', '.join(COLUMNS)} FROM t_reconcile_case WHERE consumer_group = %s AND id = %s"
                           + (" FOR UPDATE" if lock else ""), [group, case_id])
    row = result.first()
    return _case(row) if row is not None else None


async def _open_case(execute: Execute, group: str, case_id: int, action: str) -> Acted:
    """The case, locked, and why ``action`` cannot be done to it (None: it can)."""
    case = await _get(execute, group, case_id, lock=True)
    if case is None:
        return Acted(None, refused=f"no reconcile case {case_id}")
    return Acted(case, refused=refusal(action, case["kind"], CaseStatus[case["status"].upper()]))


async def _compensable(execute: Execute, group: str, case_id: int) -> tuple[Acted, str | None, list[str]]:
    """An open duplicate whose order's receipt holds another waybill than the one to cancel; that
    waybill (the keeper) and the tokens our tables hold for the order's step (the receipt's, the rows')."""
    acted = await _open_case(execute, group, case_id, "compensate")
    if acted.refused is not None:
        return acted, None, []
    case = acted.case
    assert case is not None
    table, column = RECEIPT_TABLES[case["effect"]]
    result = await execute(f"SELECT {column}, idem_token FROM {table} WHERE order_no = %s", [case["order_no"]])
    row = result.first()
    if row is None:
        return Acted(case, refused="the order has no receipt: adopt its waybill first, then cancel the others"), None, []
    if row[0] == case["reference"]:
        return Acted(case, refused=f"our receipt holds {row[0]}: it is the keeper, not an extra"), None, []
    keys = step_keys(case["effect"], case["order_no"])
    steps = await execute(f"SELECT idem_token FROM t_idem WHERE biz_key IN ({marks(len(keys))})", keys)
    return acted, row[0], [row[1], *(token for token, in steps)]


async def _refuse(execute: Execute, group: str, case_id: int, actor: str, note: str | None, why: str,
                  listed: Sequence[Issued], ours: frozenset[str]) -> Acted:
    """A compensation refused on what the provider lists now: audited, and the open case's evidence
    refreshed with it (a run that finds the case again writes its own)."""
    acted = await _open_case(execute, group, case_id, "compensate")
    if acted.refused is not None or acted.case is None:
        return acted
    evidence = {**acted.case["evidence"], "compensable": False, "why_not": why,
                "rechecked": {"at": datetime.now(UTC).isoformat(), "by": actor,
                              "waybills": [{**issued_evidence(w), "ours": w.key in ours} for w in listed]}}
    await execute("UPDATE t_reconcile_case SET evidence = %s WHERE consumer_group = %s AND id = %s",
                  [json.dumps(evidence, default=json_default, separators=(",", ":")), group, case_id])
    await _audit(execute, case_id, actor, "compensate", CaseStatus.OPEN, None, note, f"refused: {why}")
    return Acted(await _get(execute, group, case_id), refused=f"not cancelled: {why}")


async def _close(execute: Execute, group: str, case_id: int, action: str, actor: str, note: str | None, *,
                 detail: str | None = None, done_anyway: str | None = None) -> Acted:
    acted = await _open_case(execute, group, case_id, action)
    if acted.refused is not None:
        if done_anyway is not None and acted.case is not None:     # the provider did it; someone closed it first
            status = CaseStatus[acted.case["status"].upper()]
            await _audit(execute, case_id, actor, action, status, status, note,
                         f"{done_anyway}; the case had been closed meanwhile by {acted.case['closed_by']}")
        return acted
    to, _ = CASE_ACTIONS[action]
    result = await execute(
        "UPDATE t_reconcile_case SET status = %s, closed_at = NOW(3), closed_by = %s, note = %s "
        "WHERE consumer_group = %s AND id = %s AND status = %s",
        [int(to), actor[:128], None if note is None else note[:1024], group, case_id, int(CaseStatus.OPEN)])
    if result.rowcount != 1:            # locked and open above: the store runs the whole transaction again
        raise Conflict(f"reconcile case {case_id} moved under its lock")
    await _audit(execute, case_id, actor, action, CaseStatus.OPEN, to, note, detail)
    return Acted(await _get(execute, group, case_id), changed=True)


async def _adopt(execute: Execute, group: str, case_id: int, actor: str, note: str | None) -> Acted:
    """The orphan waybill written as the order's receipt and its step done, checked again under locks."""
    acted = await _open_case(execute, group, case_id, "adopt")
    if acted.refused is not None:
        return acted
    case = acted.case
    assert case is not None
    effect, order, reference = case["effect"], case["order_no"], case["reference"]
    key = (case["evidence"].get("waybill") or {}).get("idempotency_key")
    keys = step_keys(effect, order)
    result = await execute(f"SELECT {STEP_COLUMNS} FROM t_idem WHERE biz_key IN ({marks(len(keys))}) FOR UPDATE", keys)
    steps = [step_state(row) for row in result]
    step = next((s for s in steps if s.token == key), steps[0] if steps else None)
    table, column = RECEIPT_TABLES[effect]
    held = (await execute(f"SELECT {column} FROM {table} WHERE order_no = %s FOR UPDATE", [order])).first()
    why = adoption_refused(step, key) or (f"the order has a receipt now ({held[0]})" if held is not None else None)
    if why is not None:
        return Acted(case, refused=f"not adopted: {why}")
    assert step is not None
    await execute(f"INSERT INTO {table} (order_no, {column}, idem_token, biz_key, attempt, gmt_create) "
                  "VALUES (%s, %s, %s, %s, %s, NOW(3))", [order, reference, step.token, step.biz_key, step.attempt])
    if step.status == IdemStatus.PENDING:
        done = effects_used()[effect].done
        moved = await execute(
            f"UPDATE t_idem SET status = {int(IdemStatus.DONE)}, outcome = %s, last_err = NULL, lease_until = NULL, "
            f"gmt_modified = NOW(3) WHERE biz_key = %s AND part_date = %s AND attempt = %s "
            f"AND status = {int(IdemStatus.PENDING)}", [done, step.biz_key, step.part_date, step.attempt])
        if moved.rowcount != 1:         # locked above, pending and not live: run the whole transaction again
            raise Conflict(f"the step {step.biz_key} moved under its lock")
    detail = (f"receipt {reference} written for {step.biz_key} (attempt {step.attempt}); the step was "
              f"{IdemStatus(step.status).name.lower()}" + (", now done" if step.status == IdemStatus.PENDING else ""))
    return await _close(execute, group, case_id, "adopt", actor, note, detail=detail)


async def _audit(execute: Execute, case_id: int, actor: str, action: str, from_status: CaseStatus | None,
                 to_status: CaseStatus | None, note: str | None, detail: str | None) -> None:
    await execute(
        "INSERT INTO t_reconcile_case_audit (case_id, at, actor, action, from_status, to_status, note, detail) "
        "VALUES (%s, NOW(3), %s, %s, %s, %s, %s, %s)",
        [case_id, actor[:128], action[:32], None if from_status is None else int(from_status),
         None if to_status is None else int(to_status), None if note is None else note[:1024],
         None if detail is None else detail[:1024]])


def _case(row) -> dict[str, Any]:
    case = dict(zip(COLUMNS, row, strict=True))
    case["status"] = CaseStatus(case["status"]).name.lower()
    case["evidence"] = json.loads(case["evidence"]) if case["evidence"] else {}
    return case


def _history(row) -> dict[str, Any]:
    entry = dict(zip(AUDIT_COLUMNS, row, strict=True))
    for name in ("from_status", "to_status"):
        entry[name] = None if entry[name] is None else CaseStatus(entry[name]).name.lower()
    return entry
