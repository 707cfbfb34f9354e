"""The runtime is opened once, as a Faust service of the worker's app: before Faust's own
clients, the agents, the timers and the web views, and closed after them; a command's app
opens nothing of it, and no agent, timer or view opens it on its own."""

from __future__ import annotations

import re
from pathlib import Path

from app.faust_app import OpenedWithTheApp, ProcessorApp

ROOT = Path(__file__).resolve().parents[2]


async def _nothing() -> None:
    return None


def _app(**mode) -> ProcessorApp:
    app = ProcessorApp("test-opened-with-the-app", broker="kafka://127.0.0.1:1")
    for name, value in mode.items():       # what a command sets (faust.cli.base)
        setattr(app, name, value)
    app.opened_first.append(("runtime", _nothing, _nothing))
    return app


def test_the_worker_opens_the_runtime_before_anything_of_faust_and_closes_it_after():
    dependencies = list(_app().on_init_dependencies())
    first, rest = dependencies[0], dependencies[1:]
    assert isinstance(first, OpenedWithTheApp) and first.name == "runtime"
    assert rest and not any(isinstance(d, OpenedWithTheApp) for d in rest)    # mode stops children in reverse


def test_a_command_s_app_opens_nothing_of_it():
    for kind in ({"producer_only": True}, {"client_only": True}):
        assert not any(isinstance(d, OpenedWithTheApp) for d in _app(**kind).on_init_dependencies())


def test_no_agent_timer_or_view_opens_the_runtime_itself():
    opens = re.compile(r"\bruntime\.start\(|\bself\.start\(")
    found = {str(path.relative_to(ROOT)): n for folder in ("agents", "app/web", "app/timers", "app/bootstrap.py")
             for path in ([ROOT / folder] if folder.endswith(".py") else (ROOT / folder).rglob("*.py"))
             if (n := len(opens.findall(path.read_text())))}
    assert found == {}, f"only the worker (app.main) and the commands open the runtime: {found}"
