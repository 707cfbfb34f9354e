"""The HTTP API's reference (``docs/openapi.yaml``, presented on ``docs/http-api.md``) is the worker's web
server: every route the app registers (ours and Faust's own) is in the document with its methods, and
every operation of the document is a route the app registers. Its roles and its enumerations are the
code's: the open paths are ``app.web.http``'s, every POST is an operator's, and each closed set of values
(statuses, actions, commands, windows) is the one the view accepts.

The routes are read from the app as ``faust -A app`` builds it (``harness.surface``), the way
``tests/integration/test_viewer_routes.py`` reads them from a worker.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from app.compensation.bulk import ACTIONS, TRANSITIONS
from app.pipeline.states import PERSON_ACTIONS, LedgerStatus
from app.reconcile.cases import CASE_ACTIONS, CaseStatus
from app.version import VERSION
from app.web.groups import LISTS
from app.web.http import OPEN_PATHS, PAGES
from harness import surface

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "docs" / "openapi.yaml"
PAGE = ROOT / "docs" / "http-api.md"
METHODS = ("get", "post", "put", "patch", "delete")
ROLES = {"anyone", "viewer", "operator"}


def document() -> dict:
    return yaml.safe_load(DOCUMENT.read_text())


def operations(doc: dict) -> dict[tuple[str, str], dict]:
    return {(method.upper(), path): op for path, item in doc["paths"].items()
            for method, op in item.items() if method in METHODS}


def resolve(doc: dict, node):
    if isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        target = doc
        for part in ref[2:].split("/"):
            target = target[part]
        return resolve(doc, target)
    return node


def test_every_route_the_worker_answers_is_in_the_document_and_nothing_else():
    registered = surface.web_routes()
    answered = {(method, path) for method, path in registered if method != "HEAD"}
    documented = set(operations(document()))
    assert len(answered) > 40
    assert sorted(answered - documented) == [], "routes the worker answers that docs/openapi.yaml leaves out"
    assert sorted(documented - answered) == [], "operations docs/openapi.yaml has that the worker does not answer"
    # HEAD is answered on every path (as its GET), which the document says once, in its description.
    assert {path for _, path in documented} == {path for method, path in registered if method == "HEAD"}


def test_the_document_is_an_openapi_3_1_document_whose_references_resolve():
    doc = document()
    assert doc["openapi"].startswith("3.1.") and doc["info"]["title"] and VERSION.startswith(doc["info"]["version"])
    text = DOCUMENT.read_text()
    for ref in set(re.findall(r'\$ref: "([^"]+)"', text)):
        resolve(doc, {"$ref": ref})
    for (method, path), op in operations(doc).items():
        assert op.get("summary") and op.get("tags"), (method, path)
        assert op["responses"], (method, path)
        for status, answer in op["responses"].items():
            assert re.fullmatch(r"[1-5][0-9][0-9]", status) and resolve(doc, answer)["description"], (method, path)
        declared = set(re.findall(r"\{([a-z_]+)\}", path))
        params = [resolve(doc, p) for p in op.get("parameters", [])]
        assert {p["name"] for p in params if p["in"] == "path"} == declared, (method, path)
        assert all(p["required"] for p in params if p["in"] == "path"), (method, path)


def test_the_roles_are_the_ones_the_worker_enforces():
    doc = document()
    for (method, path), op in operations(doc).items():
        roles = set(op["x-roles"])
        assert roles and roles <= ROLES, (method, path)
        open_ = op.get("security", doc["security"]) == []
        # The open paths answer anyone; the console's page and scripts answer without a token.
        assert open_ == (path in OPEN_PATHS | PAGES) == (roles == {"anyone"}), (method, path)
        if method != "GET":
            assert roles == {"operator"}, f"{method} {path}: every action needs the operator's token"
    reads_of_operators = {path for (method, path), op in operations(doc).items()
                          if method == "GET" and op["x-roles"] == ["operator"]}
    assert reads_of_operators == {"/audit/views", "/compensation/{row_id}/{action}"}


def enum(doc: dict, method: str, path: str, name: str) -> list[str]:
    op = operations(doc)[(method, path)]
    [param] = [p for p in map(lambda p: resolve(doc, p), op.get("parameters", [])) if p["name"] == name]
    return resolve(doc, param["schema"])["enum"]


def test_every_closed_set_of_values_is_the_one_the_view_accepts():
    doc = document()
    schemas = doc["components"]["schemas"]
    assert set(enum(doc, "GET", "/compensation/", "status")) == {s.name.lower() for s in LedgerStatus}
    assert enum(doc, "POST", "/compensation/{row_id}/{action}", "action") == ["retry", *PERSON_ACTIONS]
    assert enum(doc, "GET", "/compensation/{row_id}/{action}", "action") == ["record"]
    assert enum(doc, "POST", "/bulk/{job_id}/{command}", "command") == list(TRANSITIONS)
    assert schemas["BulkAction"]["enum"] == list(ACTIONS)
    assert schemas["BulkFilter"]["properties"]["status"]["enum"] == ["open", "manual"]
    from app.web.bulk import FILTERS
    assert sorted(schemas["BulkFilter"]["properties"]) == sorted(FILTERS)
    assert enum(doc, "POST", "/reconcile/cases/{case_id}/{action}", "action") == list(CASE_ACTIONS)
    assert set(enum(doc, "GET", "/reconcile/cases/", "status")) == {s.name.lower() for s in CaseStatus}
    from app.adapters.mysql.reads.error_groups import WINDOWS
    assert enum(doc, "GET", "/groups/", "window") == list(WINDOWS)
    assert enum(doc, "GET", "/groups/", "status") == list(LISTS)


def test_the_page_presents_every_operation_of_the_document():
    rows = set(re.findall(r"^\| `(GET|POST)` \| `([^`]+)` \|", PAGE.read_text(), re.MULTILINE))
    assert rows == set(operations(document())), "docs/http-api.md's table and docs/openapi.yaml differ"
    assert "openapi.yaml" in PAGE.read_text()
