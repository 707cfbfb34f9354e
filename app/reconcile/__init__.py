"""Reconciliation: the product proves, on its own data, that every record of ``order-event`` over a
time range reached an end, and (``providers``) that every effect happened once at the provider.

    input.py      how one record ended, from what the tables hold about it (pure)
    report.py     a run's counts and findings, as JSON and as text
    run.py        a run: the topic over a time range, the tables, the verdict, stored and counted
"""
