"""Bytes from elsewhere (a service's answer, a record's key) as text for a stored message.

A message is read by people and masked for viewers (``app.personal.masking``), which look for phone
numbers and addresses in it. ``repr`` of bytes hides exactly those: ``b'\\xe5\\x8c\\x97...'``
is an address nobody can read and no rule can find. So an excerpt is the text itself:

* decoded as UTF-8; bytes that are not UTF-8 are shown as ``\\xNN`` (the replacement that
  keeps them visible, so an operator still sees which bytes a record's key had);
* cut to at most ``limit`` bytes on a character boundary (never half a character), with
  ``…`` when there was more;
* control characters, and the invisible ones that reorder or hide text (bidi overrides,
  zero-width spaces), written as escapes (``\\n``, ``\\x1b``, ``\\u202e``): a message stays
  on one line and shows what it holds.
"""

from __future__ import annotations

import re

MORE = "…"
# C0 and C1 controls, DEL, line and paragraph separators, zero-width characters, bidi controls, BOM.
INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def excerpt(data: bytes | str, limit: int = 300) -> str:
    """``data`` as readable text of at most ``limit`` bytes of it (see the module docstring)."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    cut = len(raw)
    if cut > limit:
        cut = limit
        # Back off to the start of the character the limit falls in (UTF-8 continuation bytes are 10xxxxxx).
        while cut > 0 and limit - cut < 3 and raw[cut] & 0xC0 == 0x80:
            cut -= 1
    text = raw[:cut].decode("utf-8", "backslashreplace")
    return INVISIBLE.sub(_visible, text) + (MORE if cut < len(raw) else "")


def _visible(match: re.Match) -> str:
    char = match.group()
    if char in NAMED:
        return NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
