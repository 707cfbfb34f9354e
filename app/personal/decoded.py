"""A text as it reads once its escapes are undone, mapped back to the text as stored.

An address or a phone number reaches a stored message in whatever form the service or the log
that echoed it wrote: plain (``北京市``), Python's repr of bytes (``\\xe5\\x8c\\x97``), JSON's
or Python's ``\\u5317`` (``\\U0001f600``, surrogate pairs), a URL or a form (``%E5%8C%97``,
``%2B86``), HTML (``&#21271;``, ``&#x5317;``, ``&amp;``), quoted-printable mail
(``=E5=8C=97``), full-width characters (``１３８``, read by NFKC), an escape escaped again
(``\\\\u5317``), or a mix of them. Masking searches :attr:`Decoded.text` and replaces the span
of the stored text each match came from (:meth:`Decoded.span`), escapes and all.

Left as they are: an escape that would give an ASCII letter or digit (no encoder writes those
as escapes, so ``%34`` in ``id%3456789`` is text, and reading it would split a run of digits),
and bytes that are not UTF-8, except ``\\xNN`` and ``%NN`` of 0xA0-0xFF, read as Latin-1
(Python's repr of ``é`` is ``\\xe9``). Zero-width and other format characters are left out of
the reading, so they cannot hide a value from the search.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from html.entities import html5

ESCAPE = re.compile(
    r"\\+(?:x(?P<x>[0-9A-Fa-f]{2})|u(?P<u>[0-9A-Fa-f]{4})|U(?P<U>[0-9A-Fa-f]{8})|(?P<c>[ntr\"'/]))"
    r"|%(?P<pct>[0-9A-Fa-f]{2})"
    r"|=(?P<qp>[89A-F][0-9A-F])"
    r"|&#(?:(?P<dec>[0-9]{1,7})|[xX](?P<hex>[0-9A-Fa-f]{1,6}));"
    r"|&(?P<name>[A-Za-z][A-Za-z0-9]{1,31});")
# Format characters (Unicode's Cf, the ones met in text): left out of a reading.
FORMAT = "\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
HIDDEN = re.compile(f"[{FORMAT}]")
# What makes the slow path necessary: an escape's first character, or a format character.
MAYBE = re.compile(f"[\\\\%=&{FORMAT}]")
NAMED = {"n": "\n", "t": "\t", "r": "\r"}
# What a cut (a message's length limit, an excerpt's "…") leaves at the end of a text: bytes of a
# character it did not finish, an escape it split, the "…" (read as "..." by NFKC).
CUT = re.compile(r"(?:\\+x[0-9A-Fa-f]{2}|%[0-9A-Fa-f]{2}|=[89A-F][0-9A-F])*"
                 r"(?:\\+[xuU]?[0-9A-Fa-f]{0,7}|%[0-9A-Fa-f]?|&#?[xX]?[0-9A-Fa-f]{0,6}|=[89A-F]?)?(?:…|\.\.\.)?\s*\Z")


@dataclass(frozen=True, slots=True)
class Decoded:
    original: str
    text: str                          # what a person reads
    starts: list[int] | None = None    # per character of ``text``: where it came from (None: the same place)
    ends: list[int] | None = None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of :attr:`original` that ``text[start:end]`` was read from."""
        if self.starts is None:
            return start, end
        return self.starts[start], self.ends[end - 1]


def decoded(text: str) -> Decoded:
    """``text`` as it reads (see the module docstring)."""
    if not MAYBE.search(text) and unicodedata.is_normalized("NFKC", text):
        return Decoded(text, text)
    reading = _Reading(text)
    pos = 0
    units = [_unit(m) for m in ESCAPE.finditer(text)]
    i = 0
    while i < len(units):
        start, _, kind, _ = units[i]
        reading.plain(pos, start)
        j = i + 1
        if kind in ("byte", "latin1"):
            while j < len(units) and units[j][2] in ("byte", "latin1") and units[j][0] == units[j - 1][1]:
                j += 1
            reading.bytes(units[i:j])
        elif kind == "utf16" and 0xD800 <= units[i][3] < 0xDC00 and j < len(units) and units[j][2] == "utf16" \
                and units[j][0] == units[i][1] and 0xDC00 <= units[j][3] < 0xE000:
            high, low = units[i][3], units[j][3]
            reading.char(chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)), start, units[j][1])
            j += 1
        else:
            reading.unit(units[i])
        pos = units[j - 1][1]
        i = j
    reading.plain(pos, len(text))
    return Decoded(text, "".join(reading.chars), reading.starts, reading.ends)


def _unit(m: re.Match) -> tuple[int, int, str, int | str]:
    """(start, end, kind, value) of one escape: a byte (``latin1`` when Latin-1 may read it), a
    UTF-16 code unit, a code point, or the text of a named escape."""
    if m["x"] or m["pct"]:
        return m.start(), m.end(), "latin1", int(m["x"] or m["pct"], 16)
    if m["qp"]:
        return m.start(), m.end(), "byte", int(m["qp"], 16)
    if m["u"]:
        return m.start(), m.end(), "utf16", int(m["u"], 16)
    if m["U"] or m["dec"] or m["hex"]:
        number = int(m["U"], 16) if m["U"] else int(m["dec"]) if m["dec"] else int(m["hex"], 16)
        return m.start(), m.end(), "point", number
    if m["c"]:
        return m.start(), m.end(), "text", NAMED.get(m["c"], m["c"])
    return m.start(), m.end(), "text", html5.get(m["name"] + ";", "")


class _Reading:
    def __init__(self, original: str) -> None:
        self.original = original
        self.chars: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []

    def plain(self, start: int, end: int) -> None:
        segment = self.original[start:end]
        if not HIDDEN.search(segment) and unicodedata.is_normalized("NFKC", segment):
            self.chars.append(segment)
            self.starts.extend(range(start, end))
            self.ends.extend(range(start + 1, end + 1))
            return
        for at, char in enumerate(segment, start):
            self.char(char, at, at + 1)

    def char(self, chars: str, start: int, end: int) -> None:
        """``chars``, read from ``original[start:end]``: NFKC, without format characters."""
        if not chars.isascii():
            chars = unicodedata.normalize("NFKC", chars)
        for char in chars:
            if unicodedata.category(char) != "Cf":
                self.chars.append(char)
                self.starts.append(start)
                self.ends.append(end)

    def unit(self, unit: tuple[int, int, str, int | str]) -> None:
        start, end, kind, value = unit
        if kind == "text":
            text = value
        elif kind == "point" and 0 < value <= 0x10FFFF and not 0xD800 <= value < 0xE000:
            text = chr(value)
        elif kind == "utf16" and not 0xD800 <= value < 0xE000:
            text = chr(value)
        else:
            text = None
        if text and not (text.isascii() and text.isalnum()):
            self.char(text, start, end)
        else:
            self.plain(start, end)              # not an escape after all: read as written

    def bytes(self, run: list[tuple[int, int, str, int]]) -> None:
        """A run of adjacent byte escapes: UTF-8 where it is, else each byte alone."""
        k = 0
        while k < len(run):
            first = run[k][3]
            size = 2 if 0xC2 <= first <= 0xDF else 3 if 0xE0 <= first <= 0xEF else 4 if 0xF0 <= first <= 0xF4 else 1
            if size > 1 and k + size <= len(run):
                try:
                    char = bytes(unit[3] for unit in run[k:k + size]).decode("utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    self.char(char, run[k][0], run[k + size - 1][1])
                    k += size
                    continue
            if size > 1 and k + size > len(run) and CUT.match(self.original, run[-1][1]):
                self.plain(run[k][0], run[-1][1])         # a character the cut did not finish
                return
            start, end, kind, value = run[k]
            if value < 0x80 and not chr(value).isalnum() or value >= 0xA0 and kind == "latin1":
                self.char(chr(value), start, end)
            else:
                self.plain(start, end)
            k += 1
