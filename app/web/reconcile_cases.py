"""The providers' reconciliation's cases for a person, over JSON (``app.reconcile.cases``).

    GET  /reconcile/cases/?status=&limit=     open cases first, newest first, each with its evidence
    GET  /reconcile/cases/{id}                one case and its history
    POST /reconcile/cases/{id}/compensate     a duplicate: cancel the extra waybill at the provider
    POST /reconcile/cases/{id}/adopt          an orphan: make its waybill our receipt, its step done
    POST /reconcile/cases/{id}/dismiss        any case: nothing is done (a note says why)

An action needs the operator's token and the person's confirmation: the body names the waybill the
person saw and means (``{"confirm": "<reference>", "note", "actor"}``), the way a bulk job carries
the count its dry run showed; a different one is refused (400) and nothing is done. A case closed
already answers 409 with what closed it (who, when, how, their note). A compensation reads the
order's waybills at the provider again first and is refused (409, the case's evidence refreshed)
when our receipt's waybill is no longer live, the extra is not live or was not issued under one of
this deployment's tokens for the order; an answer to the cancel about another waybill is refused
too (409, the case left open). Every action is written to ``t_reconcile_case_audit`` as
``web:<name>``: the person a token of ``WEB_TOKENS_FILE`` names, else the body's ``actor``
(``app.web.http``). A viewer (``WEB_READ_TOKEN``) reads the cases masked; an operator's read of
one case (its evidence whole: the waybills' keys, the steps' tokens) is written to ``t_view_audit``.
"""

from __future__ import annotations

from aiohttp import web

from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.view_audit import Seen, ViewAudit
from app.pipeline.errors import EffectNotDelivered, EffectRejected, EffectUnavailable
from app.reconcile.cases import CASE_ACTIONS, CaseStatus
from app.reconcile.casework import Acted, Casework, NotCancellable
from app.settings import Settings
from app.web.http import (
    OPERATOR,
    Refused,
    Routes,
    as_seen,
    authorize,
    body,
    integer,
    json_response,
    note_and_actor,
    reader,
    refused,
    role,
)

STATUSES = {status.name.lower(): status for status in CaseStatus}
CLOSED_WITH = ("status", "closed_by", "closed_at", "note")
# What the provider's cancel may raise (app.adapters.effects.waybill): told as such, the case left open.
PROVIDER_ERRORS = (EffectRejected, EffectUnavailable, EffectNotDelivered)


async def list_cases(request: web.Request, *, settings: Settings, reconcile_cases: Casework,
                     queries: Queries) -> web.Response:
    try:
        status = request.query.get("status") or None
        if status is not None and status not in STATUSES:
            raise Refused(400, f"status must be one of {', '.join(STATUSES)}")
        limit = integer(request.query.get("limit"), "limit", low=1, high=500, default=100)
        who = role(request, settings)
    except Refused as exc:
        return refused(exc)
    answer = {"items": await reconcile_cases.list(STATUSES[status] if status else None, limit or 100),
              "open": await reconcile_cases.refresh_gauge()}
    return json_response(await as_seen(who, answer, queries))


async def show_case(request: web.Request, case_id: str, *, settings: Settings, reconcile_cases: Casework,
                    queries: Queries, view_audit: ViewAudit) -> web.Response:
    try:
        number = integer(case_id, "id", low=1, high=2 ** 62)
        who, name = reader(request, settings)
    except Refused as exc:
        return refused(exc)
    case = await reconcile_cases.get(number)
    if case is None:
        return json_response({"error": f"no reconcile case {number}"}, status=404)
    if who != OPERATOR:
        return json_response(await as_seen(who, case, queries))
    await view_audit.record(Seen(f"web:{name}", who, "reconcile_case", request.path, order_no=case["order_no"]))
    return json_response({**case, "masked": False})


async def act_on_case(request: web.Request, case_id: str, action: str, *, settings: Settings,
                      reconcile_cases: Casework) -> web.Response:
    try:
        who = authorize(request, settings)
        if action not in CASE_ACTIONS:
            raise Refused(404, f"no action {action!r}: {', '.join(CASE_ACTIONS)}")
        number = integer(case_id, "id", low=1, high=2 ** 62)
        doc = await body(request, settings)
        note, actor = note_and_actor(doc, who, settings)
        if action == "dismiss" and not (note or "").strip():
            raise Refused(400, "a dismissal needs a note: why nothing is to be done")
    except Refused as exc:
        return refused(exc)
    case = await reconcile_cases.get(number)
    if case is None:
        return json_response({"error": f"no reconcile case {number}"}, status=404)
    if case["status"] != "open":
        return closed(case)
    if doc.get("confirm") != case["reference"]:
        return json_response({"error": f"confirm the {action}: send the waybill you mean as \"confirm\"",
                              "reference": case["reference"], "kind": case["kind"]}, status=400)
    try:
        acted = await reconcile_cases.act(number, action, actor, note)
    except NotCancellable as exc:
        return json_response({"error": str(exc)}, status=409)
    except PROVIDER_ERRORS as exc:
        return json_response({"error": f"the provider could not be asked or did not cancel; the case is open "
                                       f"still: {exc}", "retriable": exc.retriable}, status=502)
    return answer(acted)


def answer(acted: Acted) -> web.Response:
    if not acted.found:
        return json_response({"error": acted.refused}, status=404)
    assert acted.case is not None
    if acted.refused is not None:
        if acted.case["status"] != "open":
            return closed(acted.case, acted.refused)
        return json_response({"error": acted.refused, "case": acted.case}, status=409)
    return json_response({"changed": acted.changed, "case": acted.case})


def closed(case: dict, reason: str | None = None) -> web.Response:
    """409: the case was closed already, and by what."""
    said = {name: case.get(name) for name in CLOSED_WITH}
    return json_response({"error": reason or f"the case is {case['status']} already", "closed": said,
                          "case_id": case["id"]}, status=409)


ROUTES: Routes = {
    "/reconcile/cases/": {"get": list_cases},
    "/reconcile/cases/{case_id}": {"get": show_case},
    "/reconcile/cases/{case_id}/{action}": {"post": act_on_case},
}
