"""What every group of settings is made of: fields that know their environment variable.

A field is declared with :func:`setting`, which records the name of its environment variable
(and, for the reference, how to show a default that is not a plain value). The name is
spelled out on every field, so that a search for ``BATCH_SIZE`` finds where it is declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo


class SettingsError(ValueError):
    """Settings that cannot work, said without the values (a password must not reach a log)."""


def setting(env: str, default: Any = ..., *, description: str, shown: str | None = None, **constraints: Any) -> Any:
    """A field read from the environment variable ``env``; ``shown``: the default as the reference says it."""
    extra: dict[str, Any] = {"env": env}
    if shown is not None:
        extra["shown"] = shown
    if "default_factory" in constraints:
        return Field(description=description, json_schema_extra=extra, **constraints)
    return Field(default, description=description, json_schema_extra=extra, **constraints)


def env_name(field: FieldInfo) -> str:
    """The environment variable a field is read from."""
    extra = field.json_schema_extra
    assert isinstance(extra, dict) and isinstance(extra.get("env"), str), f"{field!r} names no variable"
    return str(extra["env"])


class Group(BaseModel):
    """One concern's settings. Unknown keys are refused, also by :meth:`model_copy` (which does not validate)."""

    model_config = ConfigDict(extra="forbid")

    TITLE: ClassVar[str] = ""        # the reference's heading of the group

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        unknown = sorted(set(update or ()) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no setting {', '.join(unknown)}")
        return super().model_copy(update=update, deep=deep)
