"""The demo and what it runs against, beside the product and never shipped with it (the wheel holds
``app``, ``agents``, ``tables`` and ``migrations`` only): ``python -m demo`` sends order lifecycles
to ``order-event``; ``python -m demo.fakes`` serves fake providers that keep the real ones'
contracts (the tests, the chaos run and the benchmark use them too)."""
