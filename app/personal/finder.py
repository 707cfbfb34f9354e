"""Free text masked: what a reading of it (``decoded``) holds of the known values (``known``)
and of the shapes (``shapes``), each replaced in the stored text, escapes and all.

Where a known value and a shape overlap (an address whose number reads as digits, a phone
inside a cut address), the two are one span, shown as the one that starts first. A known
value inside what is kept as it is (an order number, a date) is left there: identifiers
stay readable; one that is the whole of it (a token written as a UUID) is not.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping

from app.personal.decoded import decoded
from app.personal.known import KnownValues
from app.personal.shapes import shape_spans


class Finder:
    """Masks free text: every value in ``known`` (value -> kind: phone, address, email, token),
    however it is encoded, and, unless ``shapes`` is off, every shape of ``app.personal.shapes``."""

    def __init__(self, known: Mapping[str, str] | None = None) -> None:
        self.known = KnownValues(known or {})

    def mask(self, text: str, *, shapes: bool = True) -> str:
        if not text or not (shapes or self.known):
            return text
        reading = decoded(text)
        spans = self.known.spans(reading.text)
        if shapes or spans:                  # what is kept as it is, an identifier's order number too
            found, kept = shape_spans(reading.text)
            spans = _outside(spans, kept) + (found if shapes else [])
        out, pos = [], 0
        for start, end, shown in _merged(spans):
            at, until = reading.span(start, end)
            out += [text[pos:max(at, pos)], shown]
            pos = len(text) if end == len(reading.text) else until     # with what the reading left out at the end
        out.append(text[pos:])
        return "".join(out)


def _outside(spans: list[tuple[int, int, str]], kept: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """``spans`` without those inside a kept span (``kept`` in order, apart); one that is the
    whole kept span stays (a known token written as a UUID)."""
    starts = [low for low, _ in kept]
    outside = []
    for span in spans:
        i = bisect_right(starts, span[0]) - 1
        if i < 0 or span[1] > kept[i][1] or span[:2] == kept[i]:
            outside.append(span)
    return outside


def _merged(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """``spans`` in order, overlapping ones joined and shown as the first."""
    merged: list[tuple[int, int, str]] = []
    for start, end, shown in sorted(spans, key=lambda span: (span[0], -span[1])):
        if merged and start < merged[-1][1]:
            first = merged[-1]
            merged[-1] = (first[0], max(first[1], end), first[2])
        else:
            merged.append((start, end, shown))
    return merged


def mask_text(text: str) -> str:
    """Free text with every shape of ``app.personal.shapes`` masked."""
    return Finder().mask(text)
