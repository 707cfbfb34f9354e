"""A type this processor does not handle, but that looks like one it does: a handled type in disguise.

Skipping is right for a type another team publishes on the same topic (``ORDER_SHIPPED``), and
silently wrong for one of ours written another way (``order_paid``, ``ORDER_PAID ``, an upstream's
rename ``ORDER_CONFIRM`` -> ``ORDER_CONFIRMED``): every such record would be acked and forgotten.
So before a type is skipped, it is compared with every name this processor reads (the handled
types and the upstream names of ``EVENT_TYPES``) in a **squashed** form:

* NFKC-normalised (full-width letters and compatibility forms become plain ones),
* case-folded,
* every character that is not an ASCII letter or digit dropped (spaces around and inside,
  ``_ - . / :``, anything else);
* a record's type by its first ``LONGEST`` (256) characters.

``ORDER_PAID``, ``order_paid``, ``ORDER_PAID ``, ``Order-Paid``, ``ORDER.PAID``, ``OrderPaid`` and
``ｏｒｄｅｒ＿ｐａｉｄ`` all squash to ``orderpaid``. A type **resembles** a handled one when its
squashed form

* **equals** that of a name read: the same type but for case, spaces or separators; or
* **contains** it: ``ORDER_CONFIRMED`` and ``ORDER_CONFIRM_V2`` (starts with),
  ``com.shop.order.confirm`` (ends with), ``shop.order.paid.v1`` (inside).

Either is dead-lettered (``lookalike_type``, naming the handled type), never skipped. Containment
is the wider net on purpose: a record of ours skipped is lost without a trace (the offset commits,
nothing is left to redrive), while a record of another team's dead-lettered costs a person one look
and one setting (``FOREIGN_EVENT_TYPES`` names it: skipped from then on, and its letters discarded).
A handled type's squashed name is 9 to 12 letters (``orderpaid``, ``ordercreated``), so a foreign
type contains one only when it talks about that very event (``ORDER_CANCEL_REQUESTED``): exactly
when a person should decide once.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# A record's type is compared by its first characters: a type is a name, not a document, and a
# record of a megabyte of "type" must not cost a megabyte of work (or of a cache).
LONGEST = 256


def squash(name: str) -> str:
    """``name`` compared without case, spaces or separators (see the module docstring)."""
    return "".join(c for c in unicodedata.normalize("NFKC", name).casefold() if c.isascii() and c.isalnum())


@lru_cache(maxsize=64)
def _squashed(names: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str, str], ...]:
    """The names this processor reads (the settings': a few), squashed once."""
    return tuple((squash(name), name, handled) for name, handled in names if squash(name))


@dataclass(frozen=True, slots=True)
class Resemblance:
    """What an unhandled type looks like: the name it resembles, the handled type that name is read as,
    and whether it is that name but for case, spaces and separators (else it contains it)."""

    name: str              # a handled type (ORDER_PAID) or an upstream name of one (EVENT_TYPES)
    handled: str           # the handled type it is read as
    equal: bool

    def says(self) -> str:
        """How, in a dead letter's message."""
        read_as = "" if self.name == self.handled else f" (read as {self.handled}, EVENT_TYPES)"
        if self.equal:
            return f"is {self.name}{read_as} but for case, spaces or separators"
        return f"contains {self.name}{read_as}: a rename or a new version of it?"


def resembled(raw: str, names: tuple[tuple[str, str], ...]) -> Resemblance | None:
    """The name among ``names`` (name read, handled type) that ``raw`` resembles, or None. An equal
    one before one contained; among those contained, the longest (the most specific), then by name."""
    mine = squash(raw[:LONGEST])
    if not mine:
        return None
    found = [(mine == theirs, len(theirs), name, handled)
             for theirs, name, handled in _squashed(names) if theirs in mine]
    if not found:
        return None
    equal, _, name, handled = min(found, key=lambda f: (not f[0], -f[1], f[2]))
    return Resemblance(name=name, handled=handled, equal=equal)
