"""Personal data by its shape in free text, and what a viewer sees of each.

:class:`Finder` scans a text's reading (``app.personal.decoded``) once, left to right, for the
values it was told (the phone numbers, addresses, e-mail addresses and tokens of the answer
and of its orders) and for these shapes, the first that fits at each place winning:

* a token: 32 hex digits (every idempotency token, derived or the random ones before);
* kept as they are: order numbers (``ORD-YYYYMMDD-...``), ISO dates and times, UUIDs (event
  ids), IPv4 addresses with their port, other hex words of 16 or more digits (hashes,
  fingerprints), so no digits in them pass for a phone number;
* an e-mail address (``@``, ``＠`` or ``(at)``);
* a street address (the choice is ``app.masking``'s docstring);
* a phone number or a long number: 7 or more digits with spaces, dots, dashes, brackets or
  slashes between them (a trailing ``X`` too: an ID number), not glued to letters or digits;
  and, glued to anything, ``+`` with 8 or more digits, or a mainland mobile number (11 digits
  from ``13``-``19``).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Mapping

from app.personal.decoded import CUT, decoded

MASK = "***"
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"

TOKEN = r"(?<![0-9A-Za-z])[0-9A-Fa-f]{32}(?![0-9A-Za-z])"
KEEP = "|".join((
    r"ORD-[0-9]{8}-[A-Za-z0-9]+",
    r"(?<![0-9])[12][0-9]{3}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    r"(?:[T ][0-2][0-9]:[0-5][0-9](?::[0-6][0-9](?:\.[0-9]+)?)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)?(?![0-9])",
    r"(?<![0-9A-Za-z])[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}(?![0-9A-Za-z])",
    r"(?<![0-9.])(?:(?:25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(?::[0-9]{1,5})?"
    r"(?![0-9.])",
    r"(?<![0-9A-Za-z])(?=[0-9A-Fa-f]*[A-Fa-f])(?=[0-9A-Fa-f]*[0-9])[0-9A-Fa-f]{16,}(?![0-9A-Za-z])"))
EMAIL = (rf"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+(?:@|\s?[(\[]at[)\]]\s?)"
         rf"[A-Za-z0-9{CJK}](?:[A-Za-z0-9{CJK}-]*[A-Za-z0-9{CJK}])?(?:\.[A-Za-z0-9{CJK}-]+)*\.(?:[A-Za-z]{{2,}}|[{CJK}]{{2,}})"
         rf"(?![A-Za-z0-9])")
# A number, up to four words, a street word; a flat or unit after it. The words that are also
# common English (Way, Place, Drive...) count only capitalised, the others in any case.
STREET_WORDS = (r"(?i:street|road|avenue|lane|boulevard|highway|parkway|crescent|terrace|alley)"
                r"|St|Rd|Ave|Ln|Blvd|Hwy|Dr|Drive|Way|Ct|Court|Pl|Place|Sq|Square")
ADDRESS_EN = (rf"(?<![0-9A-Za-z])[0-9]{{1,5}}[A-Za-z]?(?:[ \t]+[A-Za-z][A-Za-z'.-]*){{0,4}}?[ \t]+(?:{STREET_WORDS})"
              r"(?![A-Za-z])\.?(?:,?[ \t]*(?i:flat|apt|apartment|suite|unit|room|floor|block)\.?[ \t]*[0-9A-Za-z-]{1,6})*")
# Chinese: a road and its number (建国路88号), or a city or province and its district (北京市朝阳区),
# with the characters before them and the rest of the address after (华贸中心3座1203室). It starts
# only where a run of Chinese characters starts: a long text without an address is read once.
NUMERAL = r"[0-9一二三四五六七八九十百千零〇]"
ADDRESS_ZH = (rf"(?<![{CJK}])[{CJK}]*(?:[{CJK}](?:路|街|道|巷|弄|里|胡同){NUMERAL}+[号號]|(?:省|市|自治区)[{CJK}]{{1,8}}?(?:区|县|市|旗))"
              rf"(?:(?!ORD-)[0-9A-Za-z#-]*[{CJK}])*")
PHONE = (r"(?<![0-9A-Za-z+])\+?[0-9](?:[ ().\-/]{0,2}[0-9]){6,}[Xx]?(?![0-9A-Za-z])"
         r"|\+[0-9](?:[ .\-]?[0-9]){7,}(?![0-9])|(?<![0-9])1[3-9][0-9]{9}(?![0-9])")
SHAPES = (f"(?P<token>{TOKEN})|(?P<keep>{KEEP})|(?P<email>{EMAIL})|(?P<address>{ADDRESS_EN}|{ADDRESS_ZH})"
          f"|(?P<phone>{PHONE})")
ONLY_SHAPES = re.compile(SHAPES)


def mask_phone(phone: str) -> str:
    digits = re.sub(r"[^0-9]", "", unicodedata.normalize("NFKC", phone))
    return MASK + digits[-4:] if len(digits) >= 8 else MASK


def mask_address(address: str) -> str:
    address = address.strip()
    return address[:3] + MASK if len(address) > 6 else MASK


def mask_email(email: str) -> str:
    local = re.split(r"@|\s?[(\[]at[)\]]", email.strip(), maxsplit=1)[0]
    return f"{local[:1]}{MASK}@{MASK}"


def mask_token(token: str) -> str:
    return MASK + token.strip()[-4:] if len(token.strip()) >= 16 else MASK


# Where an address splits into parts that stand alone: its commas, and after a Chinese street number.
ADDRESS_PARTS = re.compile(r"[,;，；、\n]|(?<=[号號])")
MASKS = {"phone": mask_phone, "address": mask_address, "email": mask_email, "token": mask_token}


def _known(kind: str, value: str) -> list[tuple[str, str]]:
    """(pattern, what it stands for) pairs that find ``value`` (a ``kind``) in a reading, however
    it was written there."""
    value = unicodedata.normalize("NFKC", value).strip()
    if kind == "phone":
        digits = re.sub(r"[^0-9]", "", value)
        found = [(re.escape(value), value)]
        if len(digits) >= 4:
            found.append((r"(?<![0-9])(?:\+[ ]?)?" + r"[ ().\-/]{0,2}".join(digits) + r"(?![0-9])", value))
        return found
    if kind == "token":                          # any case, and with dashes (as a UUID)
        return [(r"(?<![0-9A-Za-z])(?i:" + "-?".join(re.escape(c) for c in value) + r")(?![0-9A-Za-z])", value)]
    parts = [value]
    if kind == "address":           # its parts too: a service may echo the street or the building alone
        parts += [part.strip() for part in ADDRESS_PARTS.split(value)
                  if len(part.strip()) >= (8 if part.isascii() else 5) and part.strip() != value]
    # Spaces as any run of spaces (or +, _ of a form), letters in any case.
    return [("(?i:" + r"[\s+_]+".join(re.escape(word) for word in part.split()) + ")", part) for part in parts]


class Finder:
    """Masks free text: every value in ``known`` (value -> kind: phone, address, email, token),
    however it is encoded, the start of a known address that a text ends in (cut short there),
    and, unless ``shapes`` is off, every shape of the module docstring."""

    def __init__(self, known: Mapping[str, str] | None = None) -> None:
        self.masks: list[str] = []
        alternatives = []
        for value, kind in sorted((known or {}).items(), key=lambda item: -len(item[0])):
            for pattern, part in _known(kind, value):
                alternatives.append(f"(?P<k{len(self.masks)}>{pattern})")
                self.masks.append(MASKS[kind](part))
        self.values = re.compile("|".join(alternatives)) if alternatives else None
        self.everything = re.compile("|".join([*alternatives, SHAPES])) if alternatives else ONLY_SHAPES
        self.addresses = [unicodedata.normalize("NFKC", value).strip() for value, kind in (known or {}).items()
                          if kind == "address"]

    def mask(self, text: str, *, shapes: bool = True) -> str:
        pattern = self.everything if shapes else self.values
        if pattern is None or not text:
            return text
        reading = decoded(text)
        spans: list[tuple[int, int, str]] = []          # of the stored text, with what shows instead
        for match in pattern.finditer(reading.text):
            kind = match.lastgroup
            if kind == "keep":
                continue
            start, end = reading.span(match.start(), match.end())
            if spans and start < spans[-1][1]:           # one stored character read as two matches
                continue
            spans.append((start, end, MASKS[kind](match.group()) if kind in MASKS else self.masks[int(kind[1:])]))
        cut = self._cut_address(reading.text)
        if cut is not None:
            start = reading.span(cut[0], cut[0] + 1)[0]
            while spans and spans[-1][1] > start:        # what was found in it gives way to it
                start = min(start, spans.pop()[0])
            spans.append((start, len(text), cut[1]))
        out, pos = [], 0
        for start, end, shown in spans:
            out += [text[pos:start], shown]
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def _cut_address(self, reading: str) -> tuple[int, str] | None:
        """Where ``reading`` ends in the start of a known address (a message or an excerpt cut
        short in it), with what shows instead; None if it does not."""
        end = CUT.search(reading).start()
        for address in self.addresses:
            least = 8 if address.isascii() else 5
            at = reading.find(address[:least], max(0, end - len(address) + 1))
            while at != -1:
                if address.startswith(reading[at:end]):
                    return at, mask_address(reading[at:end])
                at = reading.find(address[:least], at + 1)
        return None


def mask_text(text: str) -> str:
    """Free text with every shape of the module docstring masked."""
    return Finder().mask(text)
