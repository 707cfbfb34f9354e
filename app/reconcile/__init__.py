"""Reconciliation: the product proves, on its own data, that every record of ``order-event`` over a
time range reached an end, and (``providers``) that every effect happened once at the provider.

    ports.py      what it reads and calls: the topic over a range, the tables, the providers, the cases
    input.py      how one record ended, from what the tables hold about it (pure)
    report.py     a run's counts and findings, as JSON and as text
    run.py        a run: the topic over a time range, the tables, the verdict, stored and counted
    providers.py  the providers' records against our receipts: duplicates, orphans, missing (pure)
    cases.py      a case for a person, as data: its statuses, actions and checks (pure)
    casework.py   cases filed by a run, read and acted on by people

It imports no adapter and no adapter imports it: the adapters implement ``ports`` and the
composition root (``app.bootstrap``) hands them over.
"""
