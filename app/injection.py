"""Entry points name what they use: an agent, a timer, a web view or a command is a module-level
``async def`` whose keyword-only parameters name the collaborators it calls, and the composition root
(``app.main``) hands each its own, by name, from one table (``Runtime.collaborators``), as
cosmicpython's bootstrap injects its handlers' dependencies by signature.

    async def sweep_stuck(*, settings: Settings, leases: MySqlLeases, watch: Watch) -> None: ...

    wire = Collaborators(runtime.collaborators())
    app.timer(interval=60)(wire(sweep_stuck))       # Faust calls it with nothing: sweep_stuck()

Most collaborators exist only once the worker has opened its runtime (a Faust service, opened before
the agents, timers and views run), long after they are handed over at import: the table holds an
:class:`Opened` for each, which finds the runtime's object at each use. A view asked before the
runtime is open, or after it closed, therefore fails where it did when it held the runtime: at its
first use of one (``RuntimeNotOpen``), after its input was checked; a timer's tick after the stop
checks that the worker is stopping before it uses anything. An agent, which runs from the worker's
start to its stop, is handed the objects themselves when it starts (:meth:`Collaborators.resolved`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

Handler = Callable[..., Awaitable[Any]]


class UnknownCollaborator(TypeError):
    """An entry point names a collaborator the table does not have: refused when it is wired, at import."""


class Opened:
    """Stands for an object the runtime makes when it opens: each use (an attribute read or set) finds
    it anew with ``find``, which raises while the runtime is not open."""

    __slots__ = ("_find",)

    def __init__(self, find: Callable[[], object]) -> None:
        object.__setattr__(self, "_find", find)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._find(), name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self._find(), name, value)

    def __repr__(self) -> str:
        return f"Opened({self._find!r})"


def _found(value: object) -> object:
    """The object an :class:`Opened` stands for, found now; anything else as it is."""
    return value._find() if isinstance(value, Opened) else value


def collaborators_of(handler: Callable) -> tuple[str, ...]:
    """The names ``handler`` asks for: its keyword-only parameters."""
    return tuple(name for name, p in inspect.signature(handler).parameters.items() if p.kind is p.KEYWORD_ONLY)


class Wire(Protocol):
    """What an entry point's ``register`` is handed: ``wire(handler, **given)``, the handler with its
    collaborators bound (``given`` first, then the table's), a function of its other parameters."""

    def __call__(self, handler: Handler, /, **given: object) -> Handler: ...

    def resolved(self, handler: Handler, /, **given: object) -> Handler: ...


class Collaborators:
    """The table of collaborators by name, and the wiring of a handler to those it names."""

    def __init__(self, table: Mapping[str, object]) -> None:
        self.table = dict(table)

    def __call__(self, handler: Handler, /, **given: object) -> Handler:
        """``handler`` with what it names bound; an :class:`Opened` is handed over as it is (found at
        each use)."""
        return self._bind(handler, given, resolve=False)

    def resolved(self, handler: Handler, /, **given: object) -> Handler:
        """``handler`` with what it names bound, each :class:`Opened` found when the handler is called:
        for an agent, called once the runtime is open, whose objects must outlive it (a gauge's
        function reads the batch handler after the runtime closed)."""
        return self._bind(handler, given, resolve=True)

    def _bind(self, handler: Handler, given: Mapping[str, object], *, resolve: bool) -> Handler:
        names = collaborators_of(handler)
        where = f"{handler.__module__}.{handler.__qualname__}"
        unknown = sorted(set(names) - set(given) - set(self.table))
        if unknown:
            raise UnknownCollaborator(f"{where} names {', '.join(unknown)}: no collaborator by that name "
                                      f"(app.bootstrap's Runtime.collaborators and app.main hold them)")
        unused = sorted(set(given) - set(names))
        if unused:
            raise UnknownCollaborator(f"{where} was given {', '.join(unused)}, which it does not name")
        values = {name: given[name] if name in given else self.table[name] for name in names}

        async def call(*args: Any, **kwargs: Any) -> Any:
            if resolve:
                return await handler(*args, **kwargs, **{name: _found(value) for name, value in values.items()})
            return await handler(*args, **kwargs, **values)

        # Faust reads a handler's signature (a task or timer without parameters is called without the
        # app; a command's first parameter is the command) and names its timers, tasks, agents and
        # commands after it: the handler's own, its collaborators left out. No __wrapped__, which
        # inspect.signature would follow back to the collaborators.
        signature = inspect.signature(handler)
        call.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for p in signature.parameters.values() if p.kind is not p.KEYWORD_ONLY])
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(call, attribute, getattr(handler, attribute))
        return call
