"""The CLI reference (``docs/cli.md``) is the CLI: every ``faust -A app`` command this project registers
has its section, with every option and every value its arguments take; every ``python -m app.admin``
command is there with its options; and the page shows no command or option the programs would refuse.
The commands are read from the app as ``faust -A app`` builds it (``harness.surface``)."""

from __future__ import annotations

import re
from pathlib import Path

from app.commands.bulk import BULK_COMMANDS
from harness import surface
from harness.surface import code_of, commands_in, refusal

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"


def sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections by title."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_command_of_ours_has_a_section_with_all_its_options_and_choices():
    page = sections(PAGE.read_text())
    commands = surface.our_commands()
    assert len(commands) >= 5
    missing = []
    for name, command in commands.items():
        body = page.get(name)
        if body is None:
            missing.append(f"a section '## {name}'")
            continue
        if f"faust -A app {name}" not in body:
            missing.append(f"{name}: an example `faust -A app {name} ...`")
        for param in command["params"]:
            if param["kind"] == "option":
                missing += [f"{name}: `{opt}`" for opt in param["opts"] if f"`{opt}`" not in body]
            for choice in param["choices"] or ():
                if f"`{choice}`" not in body:
                    missing.append(f"{name}: the value `{choice}` of {param['name']}")
    missing += [f"dlq: the bulk command `{c}`" for c in BULK_COMMANDS if f"`{c}`" not in page.get("dlq", "")]
    assert missing == [], f"docs/cli.md leaves out: {missing}"


def test_every_admin_command_is_on_the_page_with_its_options():
    body = sections(PAGE.read_text())["python -m app.admin"]
    missing = []
    for name, options in surface.admin_commands().items():
        if f"python -m app.admin {name}" not in body:
            missing.append(f"`python -m app.admin {name}`")
        if f"| `{name}` |" not in body:
            missing.append(f"the table's row of {name}")
        missing += [f"{name} {opt}" for opt in options if f"`{opt}" not in body]
    assert missing == [], f"docs/cli.md leaves out: {missing}"


def test_the_page_shows_only_commands_and_options_the_programs_take():
    shown = commands_in([("cli.md", span) for span in code_of(PAGE.read_text())])
    assert len(shown) > 25
    refused = [f"`{span}`: {why}" for _, span, words in shown for why in [refusal(words)] if why]
    assert refused == [], refused


def test_the_worker_is_on_the_page():
    body = sections(PAGE.read_text())["faust -A app worker"]
    assert "faust -A app worker -l info" in body and "STOP_TIMEOUT_SECONDS" in body
