"""A process of a test's with modules of the test's own installed first:

    python -m harness.preload -- faust -A app worker -l info      # HARNESS_PRELOAD=harness.added_provider

imports every module ``HARNESS_PRELOAD`` names (comma-separated) and enters its ``installed()`` for
the life of the process, then runs the program as ``python -m`` would. This is how a test's
throwaway provider (its effect's step, its provider, its fake: ``harness/added_provider.py``) reaches
the workers, the fakes and the reconcile that a chaos run starts as processes of their own: before
the program builds anything (a worker its runtime and its effects' clients, the fakes their app).

:func:`command` builds such a command line when an environment asks for it, the plain one otherwise.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

VARIABLE = "HARNESS_PRELOAD"


def modules(env: Mapping[str, str]) -> list[str]:
    return [name for name in env.get(VARIABLE, "").split(",") if name.strip()]


def command(program: str, args: Sequence[str], env: Mapping[str, str], *, script: bool = False) -> list[str]:
    """``python -m program args`` (``script``: this interpreter's script of that name, ``faust``), through
    this module when ``env`` names modules to install first."""
    if modules(env):
        return [sys.executable, "-m", "harness.preload", "--", program, *args]
    if script:
        return [str(Path(sys.executable).with_name(program)), *args]
    return [sys.executable, "-m", program, *args]


@contextmanager
def installed(names: Sequence[str]) -> Iterator[None]:
    """Every module of ``names`` imported and its ``installed()`` entered while the block runs."""
    with ExitStack() as stack:
        for name in names:
            stack.enter_context(importlib.import_module(name.strip()).installed())
        yield


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m harness.preload -- PROGRAM [ARGS...]  (modules in $HARNESS_PRELOAD)")
    stack = ExitStack()
    stack.enter_context(installed(modules(os.environ)))     # for the life of the process: never left
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
