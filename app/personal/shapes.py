"""Personal data by its shape in free text, and what a viewer sees of each.

A text's reading (``app.personal.decoded``) is scanned once, left to right, for these shapes,
the first that fits at each place winning:

* a token: 32 hex digits (every idempotency token, derived or the random ones before);
* kept as they are: order numbers (``ORD-YYYYMMDD-...``), ISO dates and times, UUIDs (event
  ids), IPv4 addresses with their port, other hex words of 16 or more digits with a letter in
  them (hashes, fingerprints), so no digits in them pass for a phone number;
* an e-mail address (``@``, ``＠`` or ``(at)``);
* a street address (the choice is ``app.personal.masking``'s docstring);
* a phone number or a long number: 7 or more digits with spaces, dots, dashes, brackets or
  slashes between them (a trailing ``X`` too: an ID number), not glued to letters or digits;
  and, glued to anything, ``+`` with 8 or more digits, or a mainland mobile number (11 digits
  from ``13``-``19``).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

MASK = "***"
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"

TOKEN = r"(?<![0-9A-Za-z])[0-9A-Fa-f]{32}(?![0-9A-Za-z])"
KEEP = "|".join((
    r"ORD-[0-9]{8}-[A-Za-z0-9]+",
    r"(?<![0-9])[12][0-9]{3}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    r"(?:[T ][0-2][0-9]:[0-5][0-9](?::[0-6][0-9](?:\.[0-9]+)?)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)?(?![0-9])",
    r"(?<![0-9A-Za-z])[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}(?![0-9A-Za-z])",
    r"(?<![0-9.])[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?::[0-9]{1,5})?(?![0-9.])",
    r"(?<![0-9A-Za-z])(?=[0-9]*[A-Fa-f])[0-9A-Fa-f]{16,}(?![0-9A-Za-z])"))
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
# Each shape needs a digit (a token lacks one once in 10^13), an "@" or a Chinese character: a
# text is scanned only for the shapes its characters allow (without a digit, no phone numbers).
DIGIT, AT, CHINESE = re.compile("[0-9]"), re.compile(r"@|[(\[][Aa][Tt][)\]]"), re.compile(f"[{CJK}]")


@cache
def _shapes(digit: bool, at: bool, chinese: bool) -> re.Pattern:
    alternatives = [f"(?P<token>{TOKEN})", f"(?P<keep>{KEEP})"] if digit else []
    alternatives += [f"(?P<email>{EMAIL})"] if at else []
    addresses = ([ADDRESS_EN] if digit else []) + ([ADDRESS_ZH] if chinese else [])
    alternatives += [f"(?P<address>{'|'.join(addresses)})"] if addresses else []
    alternatives += [f"(?P<phone>{PHONE})"] if digit else []
    return re.compile("|".join(alternatives))


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


MASKS = {"phone": mask_phone, "address": mask_address, "email": mask_email, "token": mask_token}


def shape_spans(reading: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """Where ``reading`` holds each shape, with what shows instead, and the spans kept as they are."""
    found, kept = [], []
    digit, at, chinese = (bool(hint.search(reading)) for hint in (DIGIT, AT, CHINESE))
    if not (digit or at or chinese):
        return found, kept
    for match in _shapes(digit, at, chinese).finditer(reading):
        if match.lastgroup == "keep":
            kept.append(match.span())
        else:
            found.append((match.start(), match.end(), MASKS[match.lastgroup](match.group())))
    return found, kept
