"""The configuration reference, rendered from the fields: their variable, default, type and description.

``python -m app.settings.reference --write`` writes it as the documentation site's page
``docs/configuration.md`` (without ``--write`` it prints the page); a unit test fails when the
page differs from what this renders, or when a field has no description. Secrets never show a
default.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from app.settings import GROUPS, EffectSettings, Settings
from app.settings._base import env_name

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMAND = "python -m app.settings.reference --write"


def _kind(annotation: Any) -> str:
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _kind(args[0]) if len(args) == 1 else " or ".join(_kind(arg) for arg in args)
    if typing.get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    return {bool: "`true`/`false`", int: "integer", float: "number", str: "text",
            SecretStr: "secret text"}.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bounds(field: FieldInfo) -> str:
    said = []
    for item in field.metadata:
        for kind, attribute, sign in ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
                                      (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<")):
            if isinstance(item, kind):
                said.append(f"{sign} {getattr(item, attribute):g}")
        if isinstance(item, annotated_types.MaxLen):
            said.append(f"at most {item.max_length} characters")
    return f" ({', '.join(said)})" if said else ""


def _default(field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "shown" in extra:
        return str(extra["shown"])
    if _secret(field.annotation) or field.default is None:
        return "unset"
    value = field.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "empty"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def missing_descriptions() -> list[str]:
    """The variables whose field has no description."""
    return [env_name(field) for _, field in fields() if not (field.description or "").strip()]


def fields() -> list[tuple[str, FieldInfo]]:
    """(group title, field) of every setting, in the reference's order."""
    found = [("Identity", field) for name, field in Settings.model_fields.items() if name not in GROUPS]
    for group in GROUPS.values():
        found += [(group.TITLE, field) for field in group.model_fields.values()]
    found += [(EffectSettings.TITLE, field) for field in EffectSettings.model_fields.values()]
    return found


def render() -> str:
    """The whole page docs/configuration.md."""
    lines = ["# Configuration", "",
             f"<!-- Rendered by `{COMMAND}` from the fields' descriptions in app/settings/: edit those, "
             "not this page. -->", "",
             "Every setting is an environment variable (any case), grouped here as in the code: "
             "`APP_ID` and `WORKER_ID` on `app.settings.Settings`, the others in one group each "
             "(`settings.kafka`, `settings.database`, ...; `app/settings/`)."]
    title = None
    for group, field in fields():
        if group != title:
            title = group
            lines += ["", f"## {_heading(title)}", "", "| variable | default | type | meaning |", "|---|---|---|---|"]
        text = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{env_name(field)}` | {_default(field)} | {_kind(field.annotation)}{_bounds(field)} "
                     f"| {text} |")
    lines += ["", "All `DATETIME` columns hold UTC (each connection sets `time_zone = '+00:00'`)."]
    return "\n".join(lines) + "\n"


def _heading(title: str) -> str:
    """A group's title as a heading. A variable's pattern in it (``EFFECTS__<EFFECT>__...``) goes in
    code, so that it shows as written and is no HTML tag, and the heading's anchor is made of the words
    before it (``#one-effect``)."""
    words, pattern = re.fullmatch(r"(.*?)(?: \((\S*<\S*)\))?", title).groups()  # type: ignore[union-attr]
    if pattern is None:
        return title
    return f"{words} (`{pattern}`) {{ #{'-'.join(words.lower().split())} }}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"]):
        print(f"usage: {COMMAND} (without --write: print the page)", file=sys.stderr)
        return 2
    if not args:
        print(render(), end="")
        return 0
    PAGE.write_text(render())
    print(f"{PAGE.parent.name}/{PAGE.name}: the configuration reference is rendered from app/settings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
