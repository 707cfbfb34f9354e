"""The folders are the architecture, and these tests keep them so.

* ``app.pipeline`` stands alone: importing it pulls in neither Faust nor aiohttp
  nor a database driver, nor OpenTelemetry or prometheus-client (it reports to its observer
  port, which ``app.observability`` implements), and it imports nothing of the adapters or the wiring.
* ``app.compensation`` (the dead-letter lifecycle) is pure the same way; it stands on the
  pipeline, and the pipeline imports nothing of it.
* ``app.main`` is the only composition root: agents and web views get what they
  need handed to them; they import neither ``app.main`` nor each other, and no
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

# (modules whose name starts with, may not import anything starting with, why)
PURE_CORE_MAY_NOT = ("app.adapters", "app.main", "app.bootstrap", "app.web", "agents", "app.settings",
                     "app.observability", "faust", "mode", "aiohttp", "aiokafka", "sqlalchemy", "aiomysql",
                     "opentelemetry", "prometheus_client")

RULES = [
    ("app.pipeline", (*PURE_CORE_MAY_NOT, "app.compensation"),
     "the pipeline is pure: ports in, results out; what becomes of a dead letter stands on it, not in it"),
    ("app.compensation", PURE_CORE_MAY_NOT, "the dead-letter lifecycle is pure like the pipeline it runs events through"),
    ("app.reconcile.input", PURE_CORE_MAY_NOT, "how a record ended is judged from rows handed over, nothing read"),
    ("app.reconcile.report", PURE_CORE_MAY_NOT, "a report says what a run found; it reads nothing"),
    ("agents", ("app.main", "agents.", "app.web", "app.timers", "app.commands"), "an agent gets its runtime handed over"),
    ("app.web", ("app.main", "agents", "app.timers", "app.commands"), "a view gets what it needs handed over"),
    ("app.timers", ("app.main", "agents", "app.web", "app.commands"), "a timer gets what it needs handed over"),
    ("app.commands", ("app.main", "agents", "app.web", "app.timers"), "a command gets what it needs handed over"),
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


RECEIVERS = ("agents", "app.web", "app.timers", "app.commands")     # registered by app.main, handed the runtime


def test_only_the_composition_root_imports_agents_views_timers_commands_and_the_runtime_builder():
    wiring = (*RECEIVERS, "app.bootstrap")
    bad = {name: sorted(i for i in imports(path) if i.startswith(wiring))
           for name, path in MODULES.items()
           if name != "app.main" and not name.startswith(wiring)}
    # What app.main registers may name the runtime's type (app.bootstrap.Runtime); nothing else may.
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


@pytest.mark.parametrize("core", ["app.pipeline", "app.compensation"])
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
