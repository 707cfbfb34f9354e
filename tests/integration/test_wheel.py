"""A release is a package: the wheel alone runs a worker and migrates its database.

The wheel is built as ``make release`` builds it (``python -m build``), checked for what it holds
(``ops/check_wheel.py``: the code, the migrations, the console; no fakes, no test machinery), and
installed into a virtualenv outside the repository. Then, from an empty folder, with only
environment settings: ``python -m app.admin migrate`` brings a new database to the schema from the
installed package, ``python -m app.admin version`` says the release, and ``faust -A app worker``
processes orders (against the fake providers, which the wheel does not ship) and exports
``order_build_info``; SIGTERM stops it cleanly.

The virtualenv's dependencies are installed once per set of dependencies (cached in
``.cache/wheel-venv/<hash>``, a fresh virtualenv that is not the repository's); the wheel itself is
installed anew every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from app.adapters.mysql.schema import revisions
from app.version import VERSION
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import LOGS, ROOT, ScratchDatabase, produce, wait_for, worker_env, worker_metric

CACHE = ROOT / ".cache" / "wheel-venv"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # The sdist first, then the wheel from it (as make release does): nothing left in the checkout by an
    # earlier build (its build/ folder) can reach the wheel.
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True,
                   capture_output=True, text=True)
    [built] = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel) -> Path:
    """A virtualenv outside the repository with the wheel installed; its bin folder."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    venv = CACHE / hashlib.sha256("\n".join(dependencies).encode()).hexdigest()[:12]
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                       check=True, capture_output=True, text=True)
        (venv / ".complete").touch()
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--force-reinstall", str(wheel)], check=True, capture_output=True, text=True)
    return venv / "bin"


def test_the_wheel_holds_what_a_worker_needs_and_no_demo_or_test_machinery(wheel):
    done = subprocess.run([sys.executable, str(ROOT / "ops" / "check_wheel.py"), str(wheel)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert wheel.name == f"order_event_processor-{VERSION}-py3-none-any.whl"
    # The demo and its fakes stay in the repository, and the check would say so if they did not.
    with zipfile.ZipFile(wheel) as built:
        assert not [name for name in built.namelist() if name.startswith(("demo/", "app/demo/"))]
    refused = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'ops'); import check_wheel; "
                              "print(check_wheel.problems(['demo/fakes/server.py']))"], cwd=ROOT, capture_output=True,
                             text=True)
    assert "must not ship: demo/fakes/server.py" in refused.stdout, refused.stderr


def test_an_installed_wheel_migrates_its_database_and_runs_a_worker_from_an_empty_folder(installed, settings, topics,
                                                                                          tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    db = ScratchDatabase(settings.database.url).create(migrated=False)
    pair = topics(partitions=2)
    fakes = FakesProcess()
    # Only environment settings: no PYTHONPATH, nothing of the repository on the path.
    env = {k: v for k, v in worker_env(MYSQL_URL=db.url, **pair.env(), **fakes.env()).items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        def admin(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(installed / "python"), "-m", "app.admin", *args], cwd=empty, env=env,
                                  capture_output=True, text=True, timeout=300)

        demo = subprocess.run([str(installed / "python"), "-c", "import demo.fakes"], cwd=empty, env=env,
                              capture_output=True, text=True)
        assert demo.returncode != 0 and "No module named 'demo'" in demo.stderr
        assert admin("version").stdout.startswith(f"order-event-processor {VERSION}\n")
        migrated = admin("migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert f"at revision {revisions()[0]} (was none)" in migrated.stderr
        assert db.scalar("SELECT version_num FROM alembic_version") == revisions()[0]
        assert admin("schema").returncode == 0

        LOGS.mkdir(parents=True, exist_ok=True)
        log_path = LOGS / f"wheel-worker-{os.getpid()}.log"
        with open(log_path, "ab") as log:
            worker = subprocess.Popen([str(installed / "faust"), "-A", "app", "worker", "-l", "info"], cwd=empty,
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            orders = [order_no(prefix="WHEEL") for _ in range(5)]
            asyncio.run(produce(settings, pair.events,
                                [record(event(o, t)) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID")]))

            def done() -> bool:
                assert worker.poll() is None, f"the worker exited ({worker.returncode}); log {log_path}"
                return db.scalar("SELECT COUNT(*) FROM t_order WHERE order_no LIKE %s AND status = 2", "%WHEEL%") == 5

            wait_for(done, timeout=120, what="the orders paid, by the worker of the installed wheel")
            port = int(env["WEB_PORT"])
            probe = type("Probe", (), {"web_port": port})
            labels = f'{{code_revision="{revisions()[0]}",schema_revision="{revisions()[0]}",version="{VERSION}"}}'
            assert worker_metric(probe, "order_build_info", labels) == 1
            text = log_path.read_text(errors="replace")
            assert f"order-event-processor {VERSION} (its migrations' head: {revisions()[0]})" in text
            assert str(ROOT) not in text.split("order-event-processor", 1)[1]   # nothing ran from the checkout
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(120) == 0
    finally:
        fakes.stop()
        db.drop()
