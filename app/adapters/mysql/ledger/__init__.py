"""The compensation ledger on MySQL (``t_compensation`` and what hangs off it): the statements on
its rows and their audit trail (``statements``), the compensator's ``Ledger`` port over the store
(``port``), the error groups its rows fall into (``grouping``), which rows a person picks
(``selection``) and the bulk jobs over many of them (``bulk_jobs``). The pipeline's transaction writes dead letters with ``statements`` too."""
