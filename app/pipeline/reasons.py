"""The reasons of dead letters, retries and malformed records as metrics and error groups see them:
a closed vocabulary, so that no producer can create series or groups.

A dead letter keeps its whole reason (its ``dlq.error.type`` header, its ledger row), which may carry
a detail the record chose: ``unsupported_version:<v>`` names the version a producer wrote (up to 16
characters of its choice). A label and an error group's key take the reason without that detail
(:func:`kind_of`: ``unsupported_version``), and a label only a reason of the vocabulary
(:func:`label_of`; anything else is ``other``, a bug to fix rather than a series to create). The
detail stays where a person reads it: the letter's reason and message, and the log line.
"""

from __future__ import annotations

from app.pipeline.envelopes import FIELDS
from app.pipeline.errors import PipelineError
from app.pipeline.events import DATA_FIELDS

# Reasons followed by ``:<a detail the record chose>``.
DETAILED = frozenset({"unsupported_version"})
OTHER = "other"
# Reasons written as literals: the decoder's and the record-batch guard's (app.adapters.kafka.records),
# a t_idem row's outcome rebuilt as an error (effect_cases._terminal_error), a batch's deferral.
LITERALS = frozenset({"not_utf8", "not_json", "not_object", "empty_value", "oversized", "unreadable_record",
                      "header_not_utf8", "bad_order_no", "missing_key", "key_mismatch", "failed", "stale",
                      "deferred"})


def _error_reasons() -> frozenset[str]:
    """Every reason of the error tree (``app.pipeline.errors``), subclasses of subclasses included."""
    reasons, todo = set(), [PipelineError]
    while todo:
        error = todo.pop()
        reasons.add(error.reason)
        todo += error.__subclasses__()
    return frozenset(reasons)


def _field_reasons() -> frozenset[str]:
    """``missing_field:<f>`` and ``bad_field:<f>`` of every field of the event contract."""
    labels = {*FIELDS, *(f"data.{name}" for fields in DATA_FIELDS.values() for name in fields)}
    return frozenset(f"{kind}:{label}" for kind in ("missing_field", "bad_field") for label in labels)


VOCABULARY = _error_reasons() | LITERALS | _field_reasons() | DETAILED


def kind_of(reason: str) -> str:
    """``reason`` without the detail a record chose (``unsupported_version:2`` -> ``unsupported_version``)."""
    head, sep, _ = reason.partition(":")
    return head if sep and head in DETAILED else reason


def label_of(reason: str) -> str:
    """The label value of ``reason``: its kind when that is in the vocabulary, else ``other``."""
    kind = kind_of(reason)
    return kind if kind in VOCABULARY else OTHER
