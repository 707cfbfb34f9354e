"""The folders are the architecture, and these tests keep them so.

* ``app.pipeline`` stands alone: importing it pulls in neither Faust nor aiohttp
  nor a database driver, nor OpenTelemetry or prometheus-client (it reports to its observer
  port, which ``app.observability`` implements), and it imports nothing of the adapters or the wiring.
* ``app.compensation`` (the dead-letter lifecycle) is pure the same way; it stands on the
  pipeline, and the pipeline imports nothing of it.
* Every package of ``app`` (and every module at its top) has its floor in ``FLOORS``: the packages of
  ``app`` it may import and why. A package left out fails, so a new one is placed when it is made.
* ``app.reconcile`` judges from what its ports hand over: it imports no adapter, and no adapter
  imports it; they meet in ``app.bootstrap``.
* ``app.main`` is the only composition root: agents, timers, web views and commands are
  handed the collaborators they name (``app.injection``), never the runtime: they import
  neither ``app.main``, the runtime's builder (``app.bootstrap``) nor each other, and no
  module but ``app.main`` imports an agent or a view.
* Adapters never reach back into the wiring.
* ``app.settings`` imports none of what is built from it (adapters, pipeline, wiring).
* ``harness`` is what the tests and the benchmark both stand on: it imports neither, and
  the benchmark imports nothing of the tests.
* No module of ``app`` imports itself through others: the imports that run while a module is
  imported (not those under ``if TYPE_CHECKING:`` or inside functions) make no loop.
* ``tests`` holds tests: test modules, ``conftest.py`` and packages' ``__init__.py``; the
  machinery they run on (the chaos run's driver and checker among it) lives in ``harness``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


MODULES = {module_name(p): p for folder in ("app", "agents") for p in (ROOT / folder).rglob("*.py")}

LIBRARIES = ("faust", "mode", "aiohttp", "aiokafka", "sqlalchemy", "aiomysql")
# (modules whose name starts with, may not import anything starting with, why)
PURE_CORE_MAY_NOT = ("app.adapters", "app.main", "app.bootstrap", "app.web", "agents", "app.settings",
                     "app.observability", *LIBRARIES, "opentelemetry", "prometheus_client")

RULES = [
    ("app.pipeline", (*PURE_CORE_MAY_NOT, "app.compensation"),
     "the pipeline is pure: ports in, results out; what becomes of a dead letter stands on it, not in it"),
    ("app.compensation", PURE_CORE_MAY_NOT, "the dead-letter lifecycle is pure like the pipeline it runs events through"),
    ("app.reconcile", ("app.adapters", "app.main", "app.bootstrap", "app.web", "app.timers", "app.commands", "agents",
                       "app.settings", *LIBRARIES),
     "the reconcile reads and calls through its ports (app/reconcile/ports.py); bootstrap hands the adapters over"),
    ("app.reconcile.input", PURE_CORE_MAY_NOT, "how a record ended is judged from rows handed over, nothing read"),
    ("app.reconcile.report", PURE_CORE_MAY_NOT, "a report says what a run found; it reads nothing"),
    ("app.reconcile.providers", PURE_CORE_MAY_NOT, "the providers' findings are judged from records handed over"),
    ("app.reconcile.cases", PURE_CORE_MAY_NOT, "a case's life is data and checks; it reads nothing"),
    ("app.reconcile.ports", PURE_CORE_MAY_NOT, "ports say what is read and called, not how"),
    ("app.adapters", ("app.reconcile",), "adapters implement the reconcile's ports without importing it"),
    ("agents", ("app.main", "app.bootstrap", "agents.", "app.web", "app.timers", "app.commands"),
     "an agent is handed what it names, not the runtime"),
    ("app.web", ("app.main", "app.bootstrap", "agents", "app.timers", "app.commands"),
     "a view is handed what it names, not the runtime"),
    ("app.timers", ("app.main", "app.bootstrap", "agents", "app.web", "app.commands"),
     "a timer is handed what it names, not the runtime"),
    ("app.commands", ("app.main", "app.bootstrap", "agents", "app.web", "app.timers"),
     "a command is handed what it names, not the runtime"),
    ("app.settings", ("app.adapters", "app.main", "app.bootstrap", "app.web", "app.timers", "app.commands",
                      "app.pipeline", "agents", "faust", "mode", "aiohttp", "aiokafka", "sqlalchemy", "aiomysql"),
     "the settings build nothing: the adapters build themselves from them"),
    ("app.adapters", ("app.main", "app.bootstrap", "app.web", "app.timers", "app.commands", "agents"),
     "adapters do not know the wiring"),
    ("app", ("tests", "harness", "bench"), "the product does not stand on its tests, their harness or the benchmark"),
    ("agents", ("tests", "harness", "bench"), "the product does not stand on its tests, their harness or the benchmark"),
]


@pytest.mark.parametrize("prefix, forbidden, why", RULES, ids=[rule[0] for rule in RULES])
def test_layer_imports(prefix, forbidden, why):
    bad = {}
    for name, path in MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            hits = sorted(i for i in imports(path) if i.startswith(forbidden) and not i.startswith(name))
            if hits:
                bad[name] = hits
    assert not bad, f"{why}: {bad}"


# The floors of app/, from the ground up: each package of app/ (and each module at its top) with the
# packages of app/ it may import, beside its own modules and its subpackages', and why. Every package
# has one (test_every_package_of_app_has_its_floor): a new one is placed when it is made.
ENTRY_POINTS = ("app.adapters", "app.background", "app.compensation", "app.exits", "app.injection",
                "app.observability", "app.personal", "app.pipeline", "app.reconcile", "app.render", "app.settings")
FLOORS: dict[str, tuple[tuple[str, ...], str]] = {
    "app.pipeline": ((), "the pipeline stands on nothing: ports in, results out"),
    "app.pipeline.batch": (("app.pipeline",), "a batch's phases stand on the pipeline's rules and ports"),
    "app.pipeline.processor": (("app.pipeline",), "T1, T2, T3 stand on the pipeline's rules and ports"),
    "app.version": ((), "a release's version, written once"),
    "app.render": ((), "how stored values are shown to people"),
    "app.chaos": (("app.pipeline",), "the chaos run's cut points: an observer of the pipeline's"),
    "app.exits": ((), "the ways a process stops on purpose"),
    "app.settings": (("app.exits",), "the settings build nothing; a refused setting stops the process"),
    "app.personal": (("app.render",), "personal data found and masked in what is shown"),
    "app.compensation": (("app.pipeline",), "the dead-letter lifecycle runs events through the pipeline again"),
    "app.reconcile": (("app.pipeline", "app.observability.metrics"),
                      "the reconcile judges with the pipeline's own rules, from what its ports hand over"),
    "app.observability": (("app.pipeline", "app.settings", "app.version"), "what a worker shows of itself"),
    "app.adapters.effects": (("app.pipeline", "app.settings", "app.observability"),
                             "the providers' clients: the pipeline's effect port over HTTP"),
    "app.adapters.kafka": (("app.pipeline", "app.compensation", "app.settings", "app.observability", "app.exits"),
                           "the broker's clients: the pipeline's and the dead letters' topics"),
    "app.adapters.mysql": (("app.pipeline", "app.settings", "app.observability", "app.render", "app.version"),
                           "the store: the pipeline's ports on MySQL"),
    "app.adapters.mysql.ledger": (("app.adapters.mysql", "app.pipeline", "app.compensation"),
                                  "the compensation ledger's statements, on the store"),
    "app.adapters.mysql.reads": (("app.adapters.mysql", "app.pipeline"),
                                 "what people and the watchers read, on the store"),
    "app.adapters": (("app.pipeline", "app.settings", "app.observability", "app.render"),
                     "the adapters that span several (alerts, the watermark, web tokens) stand on them"),
    "app.injection": ((), "entry points handed the collaborators they name"),
    "app.sizing": (("app.adapters.kafka", "app.pipeline", "app.settings"), "the capacity model of the settings"),
    "app.background": ((), "background work a stopping runtime waits for"),
    "app.bootstrap": (("app.adapters", "app.pipeline", "app.compensation", "app.reconcile", "app.observability",
                       "app.settings", "app.chaos", "app.background", "app.injection", "app.sizing"),
                      "the runtime: the cores wired to their adapters"),
    "app.faust_app": (("app.adapters", "app.observability", "app.settings", "app.exits", "app.version"),
                      "how the Faust app is configured"),
    "app.admin": (("app.adapters.kafka", "app.adapters.mysql", "app.settings", "app.exits", "app.version"),
                  "python -m app.admin: migrations and topics, without a worker's runtime"),
    "app.web": (ENTRY_POINTS, "a view gets what it needs handed over"),
    "app.timers": (ENTRY_POINTS, "a timer gets what it needs handed over"),
    "app.commands": (ENTRY_POINTS, "a command gets what it needs handed over"),
    "app.main": (("app.web", "app.timers", "app.commands", "app.bootstrap", "app.faust_app", "app.adapters",
                  "app.settings", "app.exits", "app.injection"), "the composition root registers the entry points"),
    "app": (("app.main",), "faust -A app finds the app in app.main, built on first access"),
}


def floor_of(name: str) -> str | None:
    """The package of ``FLOORS`` a module of app/ belongs to: the longest that holds it (``app`` holds
    its own ``__init__.py`` alone); None for a module of a package not listed."""
    if name == "app":
        return "app"
    held = [floor for floor in FLOORS if floor != "app" and (name == floor or name.startswith(floor + "."))]
    return max(held, key=len) if held else None


def module_of(name: str) -> str:
    """The module of app/ an imported name is, or is in (``app.x.y`` of ``from app.x import y``: a class)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def app_imports(path: Path) -> set[str]:
    """The modules of app/ that the module at ``path`` imports, anywhere in it (type checking and
    functions too): ``from app import exits`` is ``app.exits``, ``from app.x import Thing`` ``app.x``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [module_of(f"{node.module}.{alias.name}") for alias in node.names]
        else:
            continue
        found |= {module_of(n) for n in names if n.split(".")[0] == "app"}
    return found


def off_floor(name: str, imported: set[str]) -> list[str]:
    """What of ``imported`` the module ``name`` may not import: outside its own package's floor, and
    outside what its floor may import."""
    floor = floor_of(name)
    if floor is None:
        return sorted(imported)
    allowed, _ = FLOORS[floor]
    own = (floor,) if floor == "app" else (floor, *(f for f in FLOORS if f.startswith(floor + ".")))
    return sorted(i for i in imported
                  if not any(i == p or (p != "app" and i.startswith(p + ".")) for p in (*own, *allowed)))


def test_every_package_of_app_has_its_floor():
    packages = {name for name, path in MODULES.items()
                if name.split(".")[0] == "app" and (path.name == "__init__.py" or name.count(".") == 1)}
    unplaced = sorted({*(packages - FLOORS.keys()),
                       *(name for name in MODULES if name.split(".")[0] == "app" and floor_of(name) is None)})
    assert not unplaced, f"give each package of app/ its floor in FLOORS (what of app/ it may import, and why): {unplaced}"
    gone = sorted(FLOORS.keys() - packages)
    assert not gone, f"FLOORS names packages app/ no longer has: {gone}"


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_each_package_imports_only_what_its_floor_stands_on(floor):
    bad = {name: hits for name, path in MODULES.items()
           if floor_of(name) == floor and (hits := off_floor(name, app_imports(path)))}
    assert not bad, f"{floor}: {FLOORS[floor][1]}; it may import {FLOORS[floor][0] or 'nothing of app/'}: {bad}"


def test_the_floors_can_fail(tmp_path):
    """A module of a package no floor names is unplaced; one that imports above its floor is caught."""
    assert floor_of("app.newfolder.thing") is None and floor_of("app.adapters.mysql.reads.console") == \
        "app.adapters.mysql.reads"
    bad = tmp_path / "bad.py"
    bad.write_text("from app.adapters.mysql.store import MySqlStore\nfrom app import exits\n"
                   "def later():\n    from app.reconcile.ports import Tokens\n")
    assert app_imports(bad) == {"app.adapters.mysql.store", "app.exits", "app.reconcile.ports"}
    assert off_floor("app.adapters.kafka.dlq", app_imports(bad)) == ["app.adapters.mysql.store",
                                                                      "app.reconcile.ports"]
    assert off_floor("app.pipeline.plan", {"app.pipeline.steps"}) == []
    assert off_floor("app.adapters.watermark", {"app.adapters.mysql.store"}) == []    # its own subpackage
    assert off_floor("app", {"app.main", "app.web.http"}) == ["app.web.http"]


RECEIVERS = ("agents", "app.web", "app.timers", "app.commands")     # registered by app.main, handed what they name


def test_only_the_composition_root_imports_agents_views_timers_commands_and_the_runtime_builder():
    wiring = (*RECEIVERS, "app.bootstrap")
    bad = {name: sorted(i for i in imports(path) if i.startswith(wiring))
           for name, path in MODULES.items()
           if name != "app.main" and not name.startswith(wiring)}
    # Agents, views, timers and commands are held by test_layer_imports: none imports another kind, nor
    # the runtime's builder.
    bad = {name: hits for name, hits in bad.items() if hits}
    assert not bad, f"only app.main wires agents, views, timers, commands and the runtime: {bad}"


def imported_by(core: str, roots: tuple[str, ...]) -> list[str]:
    """The modules of ``roots`` that importing ``core`` and every module under it (packages included)
    pulls in, in a fresh interpreter."""
    code = (f"import sys, pkgutil, importlib, {core} as p\n"
            f"for m in pkgutil.walk_packages(p.__path__, '{core}.'): importlib.import_module(m.name)\n"
            f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {roots!r})\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return [name for name in out.stdout.strip().split(",") if name]


@pytest.mark.parametrize("core", ["app.pipeline", "app.compensation", "app.reconcile"])
def test_pure_core_imports_nothing_from_faust_or_aiohttp(core):
    bad = imported_by(core, ("faust", "aiohttp", "mode", "aiokafka", "sqlalchemy", "aiomysql"))
    assert not bad, f"{core} imports {bad}"


@pytest.mark.parametrize("core", ["app.pipeline", "app.compensation"])
def test_pure_core_imports_no_opentelemetry_nor_prometheus(core):
    """Spans and metrics are the observer port's implementations (``app.observability``): the core only
    reports what happened, and carries a record's trace as an object it does not look into."""
    bad = imported_by(core, ("opentelemetry", "prometheus_client"))
    assert not bad, f"{core} imports {bad}"


def test_the_import_check_can_fail():
    assert "opentelemetry.trace" in imported_by("app.observability", ("opentelemetry",))


def test_the_checks_can_fail(tmp_path):
    """A module of the pipeline that imports aiohttp is caught by the rule above."""
    bad = tmp_path / "bad.py"
    bad.write_text("import aiohttp\nfrom app.adapters.mysql import MySqlStore\n")
    assert {"aiohttp", "app.adapters.mysql"} <= imports(bad)
    forbidden = RULES[0][1]
    assert sorted(i for i in imports(bad) if i.startswith(forbidden))


def test_the_tests_and_the_benchmark_share_the_harness_not_each_other():
    bad = {}
    for folder, forbidden in (("harness", ("tests", "bench")), ("bench", ("tests",))):
        for path in (ROOT / folder).rglob("*.py"):
            hits = sorted(i for i in imports(path) if i.split(".")[0] in forbidden)
            if hits:
                bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"the harness imports neither the tests nor the benchmark, the benchmark not the tests: {bad}"


# What ``tests/`` may hold beside test modules, conftest.py and __init__.py: data files a test reads
# (none today), by their path from the root.
TEST_DATA: set[str] = set()


def strays(paths: list[str]) -> list[str]:
    """The files of ``paths`` (under ``tests/``) that are neither a test module, a conftest, an
    ``__init__.py`` nor a data file of ``TEST_DATA``: machinery that belongs in ``harness/``."""
    def kept(path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        return (name in ("conftest.py", "__init__.py") or (name.startswith("test_") and name.endswith(".py"))
                or path in TEST_DATA)
    return sorted(path for path in paths if "/__pycache__/" not in path and not kept(path))


def test_the_tests_folder_holds_only_tests():
    on_disk = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")]
    listed = subprocess.run(["git", "ls-files", "-z", "tests"], cwd=ROOT, capture_output=True, check=True)
    tracked = [name for name in listed.stdout.decode().split("\0") if name]
    bad = strays(sorted(set(on_disk) | set(tracked)))
    assert not bad, f"tests/ holds tests; move machinery to harness/ (or list a data file in TEST_DATA): {bad}"


def test_a_test_module_imports_no_other_test_module():
    # What two test modules share is machinery: it lives in harness/, not in one of them.
    bad = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        hits = sorted(i for i in imports(path) if i.startswith("tests."))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"move what the tests share to harness/: {bad}"


def test_a_helper_module_in_tests_is_a_stray():
    paths = ["tests/conftest.py", "tests/chaos/__init__.py", "tests/chaos/test_chaos.py",
             "tests/chaos/driver.py", "tests/chaos/CONTRACT.md", "tests/unit/__pycache__/x.cpython-311.pyc"]
    assert strays(paths) == ["tests/chaos/CONTRACT.md", "tests/chaos/driver.py"]


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_time_imports(path: Path, name: str) -> set[str]:
    """The modules that importing ``name`` (at ``path``) imports while it runs: its imports outside
    functions and outside ``if TYPE_CHECKING:``. ``from x import y`` imports ``x``, and ``x.y`` too
    when that is a module; a relative import is read from ``name``'s package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = ".".join(part for part in ((base if node.level else ""), node.module or "") if part)
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                if not _type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([child for child in getattr(node, field, []) if isinstance(child, ast.AST)])
                if isinstance(node, ast.ExceptHandler):
                    visit(node.body)
    visit(ast.parse(path.read_text()).body)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: {other for other in import_time_imports(path, name) if other in modules and other != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop of imports through each group of modules that import each other (Tarjan's
    strongly connected components), as the path ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)

    def loop(group: set[str]) -> list[str]:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:                                        # shortest way round, breadth first
            node = queue.pop(0)
            for other in sorted(graph[node] & group):
                if other == start:
                    return [*paths[node], start]
                if other not in paths:
                    paths[other] = [*paths[node], other]
                    queue.append(other)
        raise AssertionError(group)                         # a strongly connected group has a loop

    return sorted(loop(group) for group in groups)


def test_no_module_imports_itself_through_others():
    """No module of ``app`` imports, while it is imported, a module that imports it back (however
    far round): each could only be read after the other."""
    found = cycles(import_graph({name: path for name, path in MODULES.items() if name.split(".")[0] == "app"}))
    assert not found, "modules that import themselves through others: " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_check_can_fail():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_imports_under_type_checking_and_in_functions_are_not_import_time(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nfrom . import sibling\nfrom .inner import deep\n"
                      "if TYPE_CHECKING:\n    import later\nelse:\n    import now\n"
                      "def f():\n    import inside\n"
                      "try:\n    import tried\nexcept ImportError:\n    import fallback\n")
    assert import_time_imports(module, "pkg.m") == {
        "typing", "typing.TYPE_CHECKING", "pkg", "pkg.sibling", "pkg.inner", "pkg.inner.deep",
        "now", "tried", "fallback"}
