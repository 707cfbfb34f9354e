"""Every fake provider, listed once: what the fakes' app serves (``demo.fakes.server``), what sends
a worker's calls to the fakes (:func:`worker_settings`, which every test, benchmark and chaos run
uses through ``harness.fakes``), which fakes a chaos storm faults, and which services the chaos
manifest says each provider's calls are recorded as.

A fake is its module (``demo/fakes/<provider>.py`` with a ``FAKE``) and one line in :data:`FAKES`;
a provider declared outside the product (a test's throwaway one) is listed for a while with
:func:`added`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from app.pipeline.steps import Effect, effects_used
from demo.fakes import express, sms, waybill
from demo.fakes.fake import Fake

# In this order the chaos run seeds each fake's random faults (its seed + the fake's place), so a
# seed draws today what it drew before the fakes were listed here: a new fake goes at the end.
FAKES: tuple[Fake, ...] = (waybill.FAKE, sms.FAKE, express.FAKE)


def of(provider: str, fakes: Iterable[Fake] | None = None) -> Fake | None:
    """The fake of the provider named ``provider``, if there is one."""
    return next((f for f in (FAKES if fakes is None else fakes) if f.provider == provider), None)


def names(fakes: Iterable[Fake] | None = None) -> tuple[str, ...]:
    """Every fake's name, as ``POST /__config`` takes them: what a chaos storm faults."""
    return tuple(f.name for f in (FAKES if fakes is None else fakes))


def each(faults: Mapping[str, object], fakes: Iterable[Fake] | None = None) -> dict[str, dict]:
    """``faults`` for every fake, as ``POST /__config`` takes them (a benchmark's latency)."""
    return {name: dict(faults) for name in names(fakes)}


def worker_settings(url: str, effects: Iterable[Effect] | None = None,
                    fakes: Iterable[Fake] | None = None) -> dict[str, str]:
    """The settings that send every effect a pipeline declares to the fakes at ``url``, whichever of
    its providers a worker picks: each effect's URL, and what each of its providers' fakes needs (the
    express courier's account)."""
    listed = tuple(FAKES if fakes is None else fakes)
    found: dict[str, str] = {}
    for effect in (effects_used().values() if effects is None else effects):
        prefix = f"EFFECTS__{effect.name.upper()}__"
        found[f"{prefix}URL"] = url
        for fake in listed:
            if fake.effect == effect.name:
                found.update({f"{prefix}{key}": value for key, value in fake.settings.items()})
    return found


@contextmanager
def added(*fakes: Fake) -> Iterator[None]:
    """``fakes`` listed too while the block runs (a test's throwaway provider; a process of a test's
    enters it for its whole life: ``harness.preload``)."""
    global FAKES
    before = FAKES
    FAKES = (*FAKES, *fakes)
    try:
        yield
    finally:
        FAKES = before
