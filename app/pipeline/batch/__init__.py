"""A batch of records, phase by phase: the whole batch through the pipeline at once, then the records
that failed one by one, then dead letters; only then is a record finished (and may Faust ack and
commit it). One :class:`~app.pipeline.batch.state.Batch` value carries the batch from phase to phase.

reading       ``reading``: records become events, grouped by order; what is no event becomes a
              letter of its own (a run of unreadable records one letter for all); a type this
              worker does not handle is finished as it is
first try     ``first_try``: every order's records at once (multi-row statements, effect calls
              concurrent across orders); each order's results as soon as its calls are recorded.
              An order of an earlier batch still in flight waits for it (``gate``), and an order's
              records whose provider's breaker is open wait before their T1 (``holds``)
retries       ``retries``: each record that failed retriably, or was deferred behind a failed
              record of its order, on its own, in offset order, with backoff; a record waiting for
              another worker's lease, or its provider's "not yet", waits instead, without using up
              its retries. Records of an order asking for the same thing are one piece of work
dead letters  ``dead_letters``: non-retriable errors and exhausted retries: a t_compensation row,
              then the record on the dead-letter topic (``app.pipeline.letters``), in groups
finishing     ``finishing``: an order's part ends: its outcomes counted, its records told finished

``orders`` runs each order through those phases, ``handler`` the batch. The batch has a deadline
(``BatchPolicy.deadline``); a database that is unreachable is waited out, within a budget of
wall-clock time that does not count against the deadline (``app.pipeline.outage``): the batch gives
up (:class:`Fatal`) once it is spent. A bug met while handling one record is isolated: the first try
falls back to the retries, and a retry dead-letters that record as ``internal_error``.
"""

from app.pipeline.batch.handler import BatchHandler
from app.pipeline.batch.policy import BatchPolicy, Identity
from app.pipeline.batch.state import BatchReport
from app.pipeline.errors import Fatal

__all__ = ["BatchHandler", "BatchPolicy", "BatchReport", "Fatal", "Identity"]
