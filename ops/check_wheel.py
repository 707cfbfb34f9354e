"""What a release's wheel must hold, and must not: ``python ops/check_wheel.py dist/<wheel>``.

A worker installed from the wheel alone runs and migrates its database: the code (``app``, ``agents``,
``tables``), the migrations with their template, the console's page and scripts. Nothing for the
demo or the tests: the demo and its fake providers (``demo``), ``harness``, ``tests``, ``bench``, ``ops``.
``make release`` runs it; ``tests/integration/test_wheel.py`` too.
"""

from __future__ import annotations

import sys
import zipfile

NEEDED = ("app/main.py", "app/version.py", "app/admin.py", "agents/order_events.py", "tables/schema.py",
          "migrations/env.py", "migrations/script.py.mako", "migrations/versions/0001_t_idem.py",
          "app/web/console.html", "app/web/console.js")
LEFT_OUT = ("demo/", "harness/", "tests/", "bench/", "ops/", "deploy/", "docs/")


def problems(names: list[str]) -> list[str]:
    found = [f"missing: {path}" for path in NEEDED if path not in names]
    found += [f"must not ship: {name}" for name in names if name.startswith(LEFT_OUT)]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python ops/check_wheel.py <wheel>", file=sys.stderr)
        return 2
    with zipfile.ZipFile(argv[0]) as wheel:
        names = wheel.namelist()
    found = problems(names)
    for line in found:
        print(f"{argv[0]}: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
