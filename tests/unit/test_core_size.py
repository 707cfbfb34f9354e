"""The pure core stays readable in one sitting per module: no module of the pipeline over 400 lines,
and no class of the core built from more than 8 loose parameters (a few cohesive values instead: a
policy, an identity, a clock). Records (dataclasses) are values, not collaborators: their fields are
not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
MAX_PARAMETERS = 8


def constructors(source: str) -> dict[str, int]:
    """Each class's hand-written ``__init__`` in ``source``: how many parameters it takes (``self`` aside)."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
                    args = item.args
                    count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) - 1
                    found[node.name] = count + (args.vararg is not None) + (args.kwarg is not None)
    return found


@pytest.mark.parametrize("core", ["app/pipeline", "app/compensation"])
def test_no_class_of_the_core_takes_more_than_8_parameters(core):
    wide = {f"{path.relative_to(ROOT)}:{name}": count
            for path in sorted((ROOT / core).rglob("*.py"))
            for name, count in constructors(path.read_text()).items() if count > MAX_PARAMETERS}
    assert not wide, f"group what these are built from into a few values (at most {MAX_PARAMETERS}): {wide}"


@pytest.mark.parametrize("core", ["app/pipeline"])
def test_no_module_of_the_core_is_over_400_lines(core):
    long = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / core).rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concern (at most {MAX_LINES} lines): {long}"


def test_the_parameter_count_can_fail():
    source = ("class Wide:\n    def __init__(self, a, b, *, c, d, e, f, g, h, i=0):\n        pass\n"
              "class Narrow:\n    def __init__(self, *args, **kw):\n        pass\n")
    assert constructors(source) == {"Wide": 9, "Narrow": 2}
