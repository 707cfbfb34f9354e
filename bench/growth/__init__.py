"""Rows g: what a worker and the operations queries cost as ``t_idem`` grows.

``g-empty`` runs one ``faust -A app worker`` over the ``mixed`` workload (waybill and
SMS calls) on an empty ``t_idem``. Then every table is emptied again, ``t_idem`` is
pre-filled with ``--growth-rows`` done rows spread over the past 365 days
(:func:`prefill`: ``INSERT ... SELECT`` from MariaDB's SEQUENCE engine, in chunks of a
million, in the order of the primary key, then ``ANALYZE TABLE``), and ``g-<rows>``
runs the same worker over the same topic with a consumer group of its own. The server
keeps its settings (the default 128 MiB buffer pool holds a few percent of 10 million
rows). Both workers run with ``IDEM_RETENTION_DAYS=400``, so the partition maintenance
they run 5 s after start drops none of the pre-filled months.

Then, at that size, with the app's own code against the scratch database (:func:`operations`):

* the ledger gets ``--growth-ledger-rows`` dead letters (mostly settled, the newest few
  hundred open) and a few rows for the sweep to report (open, retrying and manual
  rows past the SLA); ``t_idem`` gets 100 pending rows older than 10 minutes in the
  current month, 5 of them over the attempt cap;
* timed, each ``--growth-repeat`` times (the first try and p50/max in ms): the stuck
  sweep (``Sweep(...).run()``), ``Watch.gauges``, ``Queries.compensations`` (no
  filter, by status, by reason, the next page) and ``Queries.counts`` (which
  ``GET /compensation/`` runs with every list);
* ``Partitions.drop`` of the oldest three whole months of the pre-fill, one at a time
  (one try each: a month drops once), with the rows each held;
* ``EXPLAIN PARTITIONS`` and ``ANALYZE`` (which runs the statement and counts the rows
  it read, ``r_rows``) of each statement, captured from the app's code as it would run
  it (a recording store stands in for MySQL while the statement is built). A plan that
  reads the whole table (type ALL or index) or hundreds of thousands of rows is a finding.
"""

from bench.growth.operations import operations
from bench.growth.planted import STUCK_ROWS
from bench.growth.prefill import prefill, restore_partitions, rows_by_day, sequence_engine, table_size
from bench.growth.report import human, render

__all__ = ["STUCK_ROWS", "human", "operations", "prefill", "render", "restore_partitions", "rows_by_day",
           "sequence_engine", "table_size"]
