"""Fake providers that keep the real ones' contracts, for ``make run``, the tests, the chaos run and
the benchmark: ``python -m demo.fakes`` serves them all on one port.

One module per fake provider (``waybill.py``: the logistics API; ``express.py``: the express
courier; ``sms.py``: the SMS gateway), each with its ``FAKE`` (``fake.py``: the provider it plays,
its routes, what the ledger records its calls as, what a worker needs to call it), listed once in
``registry.py``. What they share: ``faults.py`` (what each does wrong on purpose, set through
``POST /__config``), ``ledger.py`` (what they did, ``GET /__ledger``) and ``server.py`` (the
aiohttp app, and what every fake call goes through).
"""
