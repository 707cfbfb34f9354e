"""Entry points name what they use (``app.injection``): each agent, timer, view and command is a
module-level function handed the collaborators its keyword-only parameters name, never the runtime;
a name the table lacks is refused when it is wired; what the runtime makes when it opens is found at
each use, so a view asked before the runtime is open answers as it did when it held the runtime."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from app.bootstrap import Runtime, RuntimeNotOpen
from app.injection import Collaborators, Opened, UnknownCollaborator
from app.settings import Settings
from app.web import bulk, compensation, health, views

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = [path for folder in ("agents", "app/web", "app/timers", "app/commands")
                for path in sorted((ROOT / folder).rglob("*.py"))]


def _takes_the_runtime(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    return [a.arg for a in args if a.arg in ("runtime", "rt")
            or (a.annotation is not None and "Runtime" in ast.unparse(a.annotation))]


def test_no_entry_point_takes_the_runtime():
    bad = {f"{path.relative_to(ROOT)}:{node.name}": hits for path in ENTRY_POINTS
           for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (hits := _takes_the_runtime(node))}
    assert not bad, f"an entry point names the collaborators it uses, not the runtime: {bad}"


def test_the_check_for_the_runtime_can_fail():
    tree = ast.parse("async def view(request, *, rt): ...\ndef register(app, runtime: Runtime, settings): ...")
    assert [_takes_the_runtime(node) for node in tree.body] == [["rt"], ["runtime"]]


def test_register_defines_nothing_inside_it():
    # Handlers are module-level: a register() only hands them to Faust (no view class in a closure).
    bad = sorted(f"{path.relative_to(ROOT)}:{inner.name}" for path in ENTRY_POINTS
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.FunctionDef) and node.name == "register"
                 for inner in ast.walk(node)
                 if inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    assert not bad, f"define handlers at module level, not inside register(): {bad}"


def test_every_route_is_a_module_level_async_function_of_its_module():
    for module in views.MODULES:
        for path, methods in module.ROUTES.items():
            for method, handler in methods.items():
                assert method in ("get", "post"), (path, method)
                assert inspect.iscoroutinefunction(handler), (path, method)
                assert getattr(module, handler.__name__) is handler, f"{path} {method}: not {module.__name__}'s own"


async def _show(job_id: str, *, settings: Settings, bulk_jobs: object) -> str:
    """A handler of the shape the entry points have."""
    return f"{job_id} {settings.app_id} {bulk_jobs}"


def test_a_handler_is_handed_what_it_names_and_keeps_its_own_signature():
    wire = Collaborators({"settings": Settings(), "bulk_jobs": "jobs", "queries": "unused"})
    bound = wire(_show)
    assert asyncio.run(bound("7")) == f"7 {Settings().app_id} jobs"
    # Faust calls a task or timer whose signature is empty without the app, and passes a command
    # itself: what it reads is the handler's own parameters, the collaborators left out.
    assert list(inspect.signature(bound).parameters) == ["job_id"]
    assert (bound.__name__, bound.__module__, bound.__doc__) == (_show.__name__, _show.__module__, _show.__doc__)
    assert not hasattr(bound, "__wrapped__")
    assert asyncio.run(wire(_show, bulk_jobs="given")("8")).endswith("given")


def test_a_name_the_table_lacks_is_refused_when_wired():
    with pytest.raises(UnknownCollaborator, match="bulk_jobs"):
        Collaborators({"settings": Settings()})(_show)
    with pytest.raises(UnknownCollaborator, match="queries"):
        Collaborators({"settings": Settings(), "bulk_jobs": None})(_show, queries=None)


def test_an_opened_part_is_found_at_each_use_and_only_then():
    found = []

    class Part:
        value = 1

    def find():
        if not found:
            raise RuntimeNotOpen("not yet")
        return found[-1]

    part = Opened(find)
    wire = Collaborators({"settings": Settings(), "bulk_jobs": part})
    lazy, now = wire(_use), wire.resolved(_use)          # handed over before anything is open
    with pytest.raises(RuntimeNotOpen):
        asyncio.run(lazy())
    found.append(Part())
    assert asyncio.run(lazy()) == 1
    part.value = 2                                         # a set reaches the object itself
    assert found[-1].value == 2
    assert asyncio.run(now()) == 2


async def _use(*, bulk_jobs) -> object:
    return bulk_jobs.value


@pytest.fixture(scope="module")
def closed_wire() -> Collaborators:
    """The worker's table on a runtime that is not open (before the worker opens it, or after it closed)."""
    return Collaborators({**Runtime(Settings()).collaborators(), "agents": {}})


def _answer(coroutine) -> tuple[int, dict]:
    response = asyncio.run(coroutine)
    return response.status, json.loads(response.text)


def test_readiness_before_the_runtime_is_open_says_what_is_down(closed_wire):
    status, doc = _answer(closed_wire(health.readyz)(make_mocked_request("GET", "/readyz")))
    assert status == 503
    assert doc["checks"]["mysql"] == doc["checks"]["kafka"] == "unreachable"


def test_a_view_checks_its_input_before_it_uses_the_runtime(closed_wire):
    status, doc = _answer(closed_wire(compensation.list_queue)(make_mocked_request("GET", "/compensation/?status=x")))
    assert status == 400 and "status must be one of" in doc["error"]
    status, doc = _answer(closed_wire(bulk.show_job)(make_mocked_request("GET", "/bulk/x"), "x"))
    assert status == 400 and doc["error"] == "id must be a whole number"
    with pytest.raises(RuntimeNotOpen):                    # aiohttp answers 500, as it did
        asyncio.run(closed_wire(bulk.show_job)(make_mocked_request("GET", "/bulk/7"), "7"))
