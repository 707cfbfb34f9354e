"""What the product shows its users, read from the product itself: the ``faust -A app`` commands with
their options, the ``python -m app.admin`` subcommands, the web server's routes, the metrics, the
settings, the console's pages. The reference pages and the runbooks are checked against these
(``tests/unit/test_cli_reference.py``, ``test_http_api_reference.py``, ``test_runbooks_match_the_code.py``).

The Faust app is built in a child process, as ``faust -A app`` builds it (``app.main`` reads the
settings and installs its replacements of Faust's internals when imported): nothing is started,
no service is reached.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_FAUST = """
import json
import click
from app.main import app
from faust.cli.faust import cli

commands = {}
for name, cmd in cli.commands.items():
    params = []
    for p in cmd.params:
        choices = list(p.type.choices) if isinstance(p.type, click.Choice) else None
        params.append({"name": p.name, "kind": p.param_type_name, "opts": list(p.opts) + list(p.secondary_opts),
                       "choices": choices})
    commands[name] = {"module": cmd.callback.__module__ if cmd.callback else None, "params": params,
                      "help": (cmd.callback.__doc__ or "").strip() if cmd.callback else ""}
web = app.web
web.init_server()
routes = sorted({(r.method, r.resource.canonical) for r in web.web_app.router.routes()})
print(json.dumps({"commands": commands, "routes": routes}))
"""


@cache
def _faust_app() -> dict:
    env = {**os.environ, "IDEM_TOKEN_SECRET": os.environ.get("IDEM_TOKEN_SECRET") or "reference-pages-only",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _FAUST], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def faust_commands() -> dict[str, dict]:
    """Every ``faust -A app <command>``, Faust's own included: ``{name: {module, params, help}}``, each
    param ``{name, kind ("option" or "argument"), opts, choices}``."""
    return _faust_app()["commands"]


def our_commands() -> dict[str, dict]:
    """The commands this project registers (``app/commands/``)."""
    return {name: c for name, c in faust_commands().items() if (c["module"] or "").startswith("app.")}


def web_routes() -> set[tuple[str, str]]:
    """Every (method, path) the worker's web server answers, ours and Faust's own, HEAD included."""
    return {(method, path) for method, path in _faust_app()["routes"]}


def admin_commands() -> dict[str, list[str]]:
    """``python -m app.admin``'s subcommands and the options of each."""
    from app.admin import parser

    found: dict[str, list[str]] = {}
    for action in parser()._subparsers._group_actions:          # argparse keeps them nowhere public
        for name, sub in action.choices.items():
            found[name] = [opt for a in sub._actions for opt in a.option_strings if opt not in ("-h", "--help")]
    return found


def metric_names() -> set[str]:
    """Every series name the collectors of ``app/observability/`` (``metrics.py``, ``monitor.py``) expose."""
    from prometheus_client.metrics import MetricWrapperBase

    import app.observability.metrics
    import app.observability.monitor

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    names: set[str] = set()
    collectors = [*vars(app.observability.metrics).values(), *vars(app.observability.monitor).values()]
    for collector in collectors:
        if not isinstance(collector, MetricWrapperBase):
            continue
        for family in collector.collect():
            names.add(family.name)
            names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
            names.update(sample.name for sample in family.samples)
    return names


def setting_names() -> set[str]:
    """Every variable of the configuration reference (generated from the settings, and held to them by
    ``tests/unit/test_settings.py``); ``EFFECTS__<EFFECT>__X`` as written there."""
    page = (DOCS / "configuration.md").read_text()
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_<>]*)` \|", page, re.MULTILINE))


def console_pages() -> list[str]:
    """The pages the console's router knows (``PAGES`` of ``app/web/console.js``)."""
    script = (ROOT / "app" / "web" / "console.js").read_text()
    found = re.search(r"const PAGES = \[([^\]]*)\]", script)
    assert found, "console.js no longer declares its PAGES"
    return re.findall(r'"([a-z]+)"', found.group(1))


def console_queue_filters() -> set[str]:
    """The fields of the console's queue filter (``<form id="filters">`` of ``console.html``): what a
    ``#/queue?...`` link may set."""
    page = (ROOT / "app" / "web" / "console.html").read_text()
    form = page[page.index('<form id="filters">'):]
    form = form[:form.index("</form>")]
    return set(re.findall(r'name="([a-z_]+)"', form))


def code_of(text: str) -> list[str]:
    """What a page shows as code: each line of a fenced block (a shell comment taken off), each inline span."""
    found = []
    fences = re.split(r"^[ \t]*```[a-z]*\n", text, flags=re.MULTILINE)
    for i, part in enumerate(fences):
        if i % 2:           # inside a fence
            found += [re.sub(r"\s+# .*$", "", line) for line in part.splitlines() if line.strip()]
        else:
            found += re.findall(r"`([^`\n]+)`", part)
    return found


def commands_in(spans: list[tuple[str, str]]) -> list[tuple[str, str, list[str]]]:
    """Each command shown: (page, the span, its words after the program), for ``faust -A app ...`` and
    ``python -m ...``."""
    found = []
    for page, span in spans:
        for program in ("faust -A app ", "python -m "):
            at = span.find(program)
            if at < 0:
                continue
            rest = span[at + len(program):]
            if rest.strip() == "...":       # "the CLI is faust -A app ...": no command shown
                continue
            try:
                words = shlex.split(rest)
            except ValueError:
                words = rest.split()
            found.append((page, span, [program.strip(), *words]))
    return found


def _placeholder(word: str) -> bool:
    """``<command>``, ``[JOB]``, ``ACTION``: a word the reader fills in."""
    return word.startswith(("<", "[")) or (word.isupper() and len(word) > 1)


def refusal(words: list[str]) -> str | None:
    """Why the command ``words`` would be refused (None: it runs, or a placeholder stands for its command)."""
    words = [words[0], *(w for w in words[1:] if not _placeholder(w))]
    if len(words) < 2 and words[0] == "faust -A app":
        return None
    if words[0] == "python -m":
        module = words[1]
        if module == "app.admin":
            subs = admin_commands()
            if len(words) < 3 or words[2:] == ["--version"]:
                return None
            if words[2] not in subs:
                return f"python -m app.admin has no command {words[2:3]}: {sorted(subs)}"
            bad = [w.split("=")[0] for w in words[3:] if w.startswith("--") and w.split("=")[0] not in subs[words[2]]]
            return f"python -m app.admin {words[2]} has no option {bad}" if bad else None
        path = ROOT.joinpath(*module.split("."))
        return None if path.with_suffix(".py").exists() or (path / "__main__.py").exists() else f"no module {module}"
    commands = faust_commands()
    if len(words) < 2 or words[1] not in commands:
        return f"faust -A app has no command {words[1:2]}"
    command = commands[words[1]]
    options = {opt for p in command["params"] if p["kind"] == "option" for opt in p["opts"]}
    bad = [w.split("=")[0] for w in words[2:] if w.startswith("--") and w.split("=")[0] not in options]
    if bad:
        return f"faust -A app {words[1]} has no option {bad}"
    positional = [w for w in words[2:] if not w.startswith("-")]
    arguments = [p for p in command["params"] if p["kind"] == "argument"]
    if arguments and arguments[0]["choices"] and positional and positional[0] not in arguments[0]["choices"]:
        return f"faust -A app {words[1]} takes {arguments[0]['choices']}, not {positional[0]!r}"
    if words[1] == "dlq" and positional[:1] == ["bulk"]:
        from app.commands.bulk import BULK_COMMANDS
        if len(positional) < 2 or positional[1] not in BULK_COMMANDS:
            return f"faust -A app dlq bulk takes {list(BULK_COMMANDS)}"
    return None
