"""The values an answer was told about (the phone numbers, addresses, e-mail addresses and tokens
in its fields, and the contacts of the orders it names), found in a text's reading
(``app.personal.decoded``) however they were written there.

A value and a reading are compared by their keys: lower case, without the spaces and the
punctuation a writer or an encoder puts between words and digits (``+`` of a form, ``-`` of a
phone number or of a token written as a UUID, brackets, dots, commas, quotes). So
``+86 139-1234-5678`` is ``+8613912345678`` and ``12+MAIN+STREET`` is ``12 Main Street``. An
address also stands for its parts (between commas, after a Chinese street number: a service may
echo the street or the building alone), and a text that ends in the start of one (cut there by
a column's limit or an excerpt) has that start masked.

The search costs about the same however many values there are: a value is looked for only in
the texts whose key holds its first three characters. A list of 200 dead letters is masked
knowing the contacts of 200 orders.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Mapping

from app.personal.decoded import CUT
from app.personal.shapes import MASKS, mask_address

SEPARATORS = re.compile(r"[\s+_\-().,/\\:;'\"|]+")
# Where an address splits into parts that stand alone: its commas, and after a Chinese street number.
ADDRESS_PARTS = re.compile(r"[,;，；、\n]|(?<=[号號])")
HEAD = 3              # the characters of a key a text is first checked for
LEAST_ASCII, LEAST_CJK = 8, 5      # an address's part, or its start at the end of a text, stands for it
CUT_DEBRIS = 64       # the most a cut leaves after its last whole character (``decoded.CUT``)
FEW_HEADS = 32        # up to this many, each is looked for in the key; beyond, the key's triples are listed


def keyed(text: str) -> Keyed:
    """``text``'s key, and where each of its characters stands in ``text``."""
    lowered = text.lower()
    if len(lowered) != len(text):             # a character whose lower case is longer (İ): keep the places
        lowered = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
    return Keyed(lowered)


class Keyed:
    """A text's key; the places in the text of its characters are worked out only when asked
    (most texts hold no known value)."""

    def __init__(self, lowered: str) -> None:
        self.lowered = lowered
        self.key = SEPARATORS.sub("", lowered)
        self._starts: tuple[list[int], list[int]] | None = None

    def place(self, index: int) -> int:
        """Where the key's character ``index`` stands in the text."""
        if self._starts is None:
            # The stretches between separators: where each starts in the key and in the text.
            in_key, in_text, removed = [0], [0], 0
            for match in SEPARATORS.finditer(self.lowered):
                removed += match.end() - match.start()
                in_key.append(match.end() - removed)
                in_text.append(match.end())
            self._starts = in_key, in_text
        in_key, in_text = self._starts
        stretch = bisect_right(in_key, index) - 1
        return in_text[stretch] + index - in_key[stretch]


def parts(kind: str, value: str) -> list[str]:
    """What stands for ``value`` alone: itself, and an address's parts of 8 characters or more
    (5 when not ASCII)."""
    if kind != "address":
        return [value]
    return [value] + [part.strip() for part in ADDRESS_PARTS.split(value)
                      if len(part.strip()) >= _least(part.strip()) and part.strip() != value]


class KnownValues:
    """``known`` (value -> kind: phone, address, email, token), ready to be found."""

    def __init__(self, known: Mapping[str, str]) -> None:
        self.by_head: dict[str, list[tuple[str, str]]] = {}          # a key's start -> (key, what shows)
        self.address_starts: dict[str, list[str]] = {}              # an address's first characters -> addresses
        self.longest = 0
        for value, kind in known.items():
            value = unicodedata.normalize("NFKC", value).strip()
            for part in parts(kind, value):
                key = keyed(part).key
                if len(key) >= HEAD:
                    self.by_head.setdefault(key[:HEAD], []).append((key, MASKS[kind](part)))
            if kind == "address" and len(value) >= _least(value):
                self.address_starts.setdefault(value[:_least(value)], []).append(value)
                self.longest = max(self.longest, len(value))
        for keys in self.by_head.values():
            keys.sort(key=lambda entry: -len(entry[0]))

    def __bool__(self) -> bool:
        return bool(self.by_head)

    def spans(self, reading: str) -> list[tuple[int, int, str]]:
        """Where ``reading`` holds a known value (overlapping spans included), with what shows instead."""
        if not self.by_head:
            return []
        keyed_reading = keyed(reading)
        key = keyed_reading.key
        if len(self.by_head) <= FEW_HEADS:
            heads = [head for head in self.by_head if head in key]
        else:
            heads = self.by_head.keys() & {key[i:i + HEAD] for i in range(len(key) - HEAD + 1)}
        found = []
        for head in heads:
            for value_key, shown in self.by_head[head]:
                at = key.find(value_key)
                while at != -1:
                    found.append((keyed_reading.place(at), keyed_reading.place(at + len(value_key) - 1) + 1, shown))
                    at = key.find(value_key, at + 1)
        cut = self._cut_address(reading)
        if cut is not None:
            found.append(cut)
        return found

    def _cut_address(self, reading: str) -> tuple[int, int, str] | None:
        """The end of ``reading`` if it is the start of a known address (a message or an excerpt
        cut short in it), with what shows instead; None if it is not."""
        if not self.address_starts:
            return None
        end = CUT.search(reading, max(0, len(reading) - CUT_DEBRIS)).start()
        low = max(0, end - self.longest + 1)
        if len(self.address_starts) <= FEW_HEADS:          # where any of the starts is, found in C
            places = sorted(at for start in self.address_starts for at in _places(reading, start, low, end))
        else:
            places = range(low, end - LEAST_CJK + 1)
        for at in places:
            for least in (LEAST_CJK, LEAST_ASCII):
                for address in self.address_starts.get(reading[at:at + least], ()):
                    if end - at >= _least(address) and address.startswith(reading[at:end]):
                        return at, len(reading), mask_address(reading[at:end])
        return None


def _places(text: str, part: str, low: int, high: int) -> list[int]:
    """Where ``part`` starts in ``text[low:high]``."""
    places, at = [], text.find(part, low, high)
    while at != -1:
        places.append(at)
        at = text.find(part, at + 1, high)
    return places


def _least(address: str) -> int:
    """The fewest first characters of ``address`` that stand for it at the end of a text."""
    return LEAST_ASCII if address.isascii() else LEAST_CJK
