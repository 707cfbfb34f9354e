"""The dead-letter lifecycle, pure like the pipeline it runs events through again: what
becomes of a dead letter (``rules``), the compensator that works the ledger's rows
(``compensator``), the error groups letters fall into (``fingerprints``), bulk jobs over many
rows (``bulk``, their lease ``bulk_lease``) and the headers a dead letter carries on its topic
(``headers``).

It may import ``app.pipeline``; the pipeline imports nothing of it. The ledger's rows, their
state machine and the ``Ledger`` port stand in the pipeline (``model``, ``states``, ``ports``),
since the batch writes the rows when it gives a record up.
"""
