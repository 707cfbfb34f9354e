"""A pytest plugin loaded into an earlier release's test run (``-p newer_schema``, this folder on its
PYTHONPATH, nothing else of ours): every scratch database that release's tests migrate to their head
is migrated on, to the current code's head, by the current code's own command. The release's tests
then run against the schema the current code leaves behind: what its workers meet during a rolling
upgrade (``tests/integration/test_schema_rule.py``).

The current code is named by two variables: ``NEWER_SCHEMA_PYTHON`` (its interpreter) and
``NEWER_SCHEMA_ROOT`` (its source tree).
"""

from __future__ import annotations

import os
import subprocess


def pytest_configure(config) -> None:
    from harness import services  # the release's own harness: its scratch databases

    python, root = os.environ["NEWER_SCHEMA_PYTHON"], os.environ["NEWER_SCHEMA_ROOT"]
    migrate = services.ScratchDatabase.migrate

    def migrate_on(self, revision: str = "head", *, down: bool = False) -> None:
        migrate(self, revision, down=down)
        if revision != "head" or down:
            return
        env = {**os.environ, "MYSQL_URL": self.url, "PYTHONPATH": root}
        if self.sql_mode:
            env["DB_SQL_MODE"] = self.sql_mode
        done = subprocess.run([python, "-m", "app.admin", "migrate"], cwd=root, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the current code's migrations failed on {self.name}:\n{done.stderr}")

    services.ScratchDatabase.migrate = migrate_on
