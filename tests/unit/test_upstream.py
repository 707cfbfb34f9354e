"""Faust's, mode's and aiokafka's internals are replaced in one place: app/adapters/kafka/upstream.py.

* :func:`install` applies every entry of ``REPLACEMENTS``, once;
* it refuses to start (exit 78, one line naming the package and both versions) on a version
  other than ``CHECKED``, and when a target is gone;
* every entry says what it mirrors, why, and which upstream fix would retire it;
* no other module of the product assigns to an attribute of Faust, mode or aiokafka.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from app import exits
from app.adapters.kafka import upstream
from app.adapters.kafka.upstream import CHECKED, REPLACEMENTS, Replacement

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_PACKAGES = ("faust", "mode", "aiokafka")
CLASS_LEVEL = [entry for entry in REPLACEMENTS if not entry.per_instance]


@pytest.fixture
def fresh(monkeypatch):
    """Nothing installed yet; every target put back as it was after the test."""
    monkeypatch.setattr(upstream, "_ORIGINALS", {})
    for entry in CLASS_LEVEL:
        owner = upstream._owner(entry.target)
        monkeypatch.setattr(owner, entry.attribute, getattr(owner, entry.attribute))
    return {entry.target: getattr(upstream._owner(entry.target), entry.attribute) for entry in CLASS_LEVEL}


@pytest.fixture
def exit_code(monkeypatch):
    """``os._exit`` raises SystemExit instead of ending the test run."""
    def fake_exit(code: int) -> None:
        raise SystemExit(code)
    monkeypatch.setattr(exits.os, "_exit", fake_exit)


def current(entry: Replacement):
    return getattr(upstream._owner(entry.target), entry.attribute)


def test_install_applies_every_entry_once(fresh):
    upstream.install()
    for entry in CLASS_LEVEL:
        original, now = fresh[entry.target], current(entry)
        assert now is not original, entry.target
        assert upstream.original(entry.target) is original
        if entry.wraps:
            assert getattr(now, "__wrapped__", None) is original, f"{entry.by} wraps what it replaces"
        else:
            assert now is upstream._load(entry.by)
    installed = {entry.target: current(entry) for entry in CLASS_LEVEL}
    upstream.install()
    assert {entry.target: current(entry) for entry in CLASS_LEVEL} == installed, "a second install changed something"
    assert all(upstream.original(entry.target) is fresh[entry.target] for entry in CLASS_LEVEL)


def test_another_version_refuses_to_start(fresh, exit_code, monkeypatch, caplog):
    real = upstream.installed_version
    monkeypatch.setattr(upstream, "installed_version",
                        lambda package: "0.16.0" if package == "faust-streaming" else real(package))
    with caplog.at_level(logging.CRITICAL, logger="app.exits"), pytest.raises(SystemExit) as stopped:
        upstream.install()
    assert stopped.value.code == exits.EXIT_CONFIG == 78
    message = caplog.text
    assert "faust-streaming 0.16.0 is installed" in message
    assert f"faust-streaming {CHECKED['faust-streaming']}" in message
    assert "app/adapters/kafka/upstream.py" in message and "CHECKED" in message
    assert all(current(entry) is fresh[entry.target] for entry in CLASS_LEVEL), "nothing is replaced"


@pytest.mark.parametrize("gone", ["target", "needed"])
def test_a_missing_target_refuses_to_start(fresh, exit_code, monkeypatch, caplog, gone):
    from faust.transport.consumer import Consumer

    name = "_new_offset" if gone == "target" else "_add_gap"     # replaced / relied on by _drain_messages
    monkeypatch.delattr(Consumer, name)
    with caplog.at_level(logging.CRITICAL, logger="app.exits"), pytest.raises(SystemExit) as stopped:
        upstream.install()
    assert stopped.value.code == 78
    assert f"faust.transport.consumer.Consumer.{name} does not exist in faust-streaming" in caplog.text
    assert not upstream._ORIGINALS


def test_an_unknown_module_refuses_to_start(fresh, exit_code, monkeypatch, caplog):
    entry = Replacement(target="aiokafka.no_such_module.Thing.method", by="app.exits.arming_the_stop_bound",
                        mirrors="-", why="-", retire="-")
    monkeypatch.setattr(upstream, "REPLACEMENTS", (*REPLACEMENTS, entry))
    with caplog.at_level(logging.CRITICAL, logger="app.exits"), pytest.raises(SystemExit) as stopped:
        upstream.install()
    assert stopped.value.code == 78 and "aiokafka.no_such_module.Thing does not exist in aiokafka" in caplog.text


def test_the_checked_versions_are_the_installed_ones_and_the_pins():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package, version in CHECKED.items():
        assert upstream.installed_version(package) == version
        assert f'"{package}=={version}"' in pyproject, f"pyproject.toml pins {package} to CHECKED"


def test_every_entry_says_what_it_mirrors_why_and_what_would_retire_it():
    assert len({entry.target for entry in REPLACEMENTS}) == len(REPLACEMENTS)
    for entry in REPLACEMENTS:
        assert entry.target.split(".")[0] in UPSTREAM_PACKAGES
        assert entry.package in CHECKED
        for text in (entry.mirrors, entry.why, entry.retire):
            assert text.strip() and len(text) > 20, entry.target
        assert entry.mirrors.split(": ", 1)[0] in CHECKED, "mirrors names the package, then file and function"
        assert ".py " in entry.mirrors, entry.mirrors
        assert callable(upstream._load(entry.by)), entry.by
        assert upstream._has(upstream._owner(entry.target), entry.attribute), entry.target
        assert not (entry.wraps and entry.per_instance)


def test_replace_on_instance_only_for_listed_attributes_that_exist():
    from aiokafka.consumer.consumer import AIOKafkaConsumer
    from aiokafka.consumer.group_coordinator import GroupCoordinator

    one, other = object.__new__(GroupCoordinator), object.__new__(GroupCoordinator)

    async def wrapped() -> bool:
        return True

    upstream.replace_on_instance(one, "_do_heartbeat", wrapped)
    assert one._do_heartbeat is wrapped and other._do_heartbeat is not wrapped
    assert GroupCoordinator._do_heartbeat is not wrapped
    with pytest.raises(RuntimeError, match="no per-instance entry"):
        upstream.replace_on_instance(one, "_send_heartbeat_request", wrapped)
    with pytest.raises(RuntimeError, match="no per-instance entry"):
        upstream.replace_on_instance(object(), "_do_heartbeat", wrapped)
    # Set by AIOKafkaConsumer.__init__: an object that skipped it does not have it.
    with pytest.raises(RuntimeError, match="_isolation_level is gone"):
        upstream.replace_on_instance(object.__new__(AIOKafkaConsumer), "_isolation_level", "read_committed")


# -- no assignment onto Faust, mode or aiokafka anywhere else ------------------------------

REPLACED_NAMES = {entry.attribute for entry in REPLACEMENTS}
# Upstream classes by name (Consumer, Worker, FetchResult, ...): the owners of the targets.
UPSTREAM_CLASSES = {part for entry in REPLACEMENTS for part in entry.target.split(".")[:-1] if part[:1].isupper()}


def _root(node: ast.AST) -> str | None:
    """The name an expression like ``a.b[c].d`` starts from."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def assignments_onto_upstream(source: str) -> list[str]:
    """Where ``source`` assigns to an attribute of Faust, mode or aiokafka: onto a name imported from
    them (or a local name bound to one), onto a name like an upstream class, or to an attribute
    named like one ``REPLACEMENTS`` replaces; ``setattr`` too."""
    tree = ast.parse(source)
    upstream_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            upstream_names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                               if alias.name.split(".")[0] in UPSTREAM_PACKAGES}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UPSTREAM_PACKAGES:
            upstream_names |= {alias.asname or alias.name for alias in node.names}
    grew = True
    while grew:                          # thread = faust_aiokafka.AIOKafkaConsumerThread; thread.x = ...
        grew = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _root(node.value) in upstream_names:
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id not in upstream_names:
                        upstream_names.add(target.id)
                        grew = True
    suspects = upstream_names | UPSTREAM_CLASSES

    def onto_upstream(target: ast.AST) -> bool:
        return isinstance(target, ast.Attribute) and (_root(target.value) in suspects or target.attr in REPLACED_NAMES)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2):
            name = node.args[1]
            if _root(node.args[0]) in suspects or (isinstance(name, ast.Constant) and name.value in REPLACED_NAMES):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
            continue
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store) and onto_upstream(part):
                    found.append(f"{node.lineno}: {ast.unparse(part)} = ...")
    return found


def test_no_module_but_upstream_assigns_to_faust_mode_or_aiokafka():
    bad = {}
    for folder in ("app", "agents"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "app/adapters/kafka/upstream.py":
                continue
            hits = assignments_onto_upstream(path.read_text())
            if hits:
                bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"only app/adapters/kafka/upstream.py replaces upstream internals (add an entry there): {bad}"


@pytest.mark.parametrize("source", [
    "from faust.transport import consumer as faust_consumer\n"
    "consumer = faust_consumer.Consumer\nconsumer._drain_messages = f\n",
    "from aiokafka.consumer import fetcher\nfetcher.MemoryRecords = GuardedRecords\n",
    "def f():\n    import faust\n    faust.Worker.install_signal_handlers = g\n",
    "def f():\n    from faust.transport.drivers import aiokafka as driver\n    driver.Producer._settings_extra = g\n",
    "def f(coordinator):\n    coordinator._do_heartbeat = g\n",
    "def f(made):\n    made._isolation_level = 'read_committed'\n",
    "import mode\nmode.Service.x += 1\n",
    "import aiokafka\nsetattr(aiokafka.AIOKafkaConsumer, 'x', 1)\n",
    "def f(obj):\n    setattr(obj, '_do_rejoin_group', g)\n",
    "def f():\n    Consumer.ack = g\n",
])
def test_the_scan_finds_the_assignments_it_is_meant_to(source):
    assert assignments_onto_upstream(source), source


def test_the_scan_leaves_our_own_objects_alone():
    source = ("from faust.types import TP\n"
              "def f(message, consumer, report):\n"
              "    message.acked = True\n    consumer._n_acked += 1\n    report.dead_letters = 2\n"
              "    setattr(report, 'x', TP('t', 0))\n")
    assert assignments_onto_upstream(source) == []
