"""This release's version (semantic versioning: the CHANGELOG says what each one changed).

The one place it is written: ``pyproject.toml`` reads it from here (``[tool.setuptools.dynamic]``),
the worker logs it at start-up and exports it (``order_build_info``), ``python -m app.admin version``
prints it. ``make release`` checks it against the changelog and tags the commit ``v<VERSION>``.
"""

VERSION = "1.2.0.dev0"
