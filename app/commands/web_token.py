"""``faust -A app web-token NAME ROLE``: a new token for one person, and its line for ``WEB_TOKENS_FILE``.

    faust -A app web-token alice operator
    faust -A app web-token vera viewer

The token is printed once, on standard output, and kept nowhere: give it to the person (who puts
it in the console, or a script's ``Authorization: Bearer`` header) and add the line, which holds
only its SHA-256, to the tokens file (``app.adapters.web_tokens``). The file is read again when it
changes: the token works at once, and removing the line revokes it at once.
"""

from __future__ import annotations

import click
import faust
from faust.cli import AppCommand, argument

from app.adapters.web_tokens import ROLES, new_line
from app.injection import Wire
from app.settings import Settings


async def web_token(cmd: AppCommand, name: str, role: str, *, settings: Settings) -> None:
    """A new random token for NAME as ROLE (operator or viewer), and its line for WEB_TOKENS_FILE."""
    try:
        token, line = new_line(name, role)
    except ValueError as exc:
        raise SystemExit(f"web-token: {exc}") from None
    where = settings.web.tokens_file or "the file WEB_TOKENS_FILE names"
    print(f"token for {name} (shown once, kept nowhere; give it to {name} alone):\n  {token}\n"
          f"line to add to {where}:\n  {line}")


def register(app: faust.App, wire: Wire) -> None:
    app.command(argument("name"), argument("role", type=click.Choice(ROLES)))(wire(web_token))
