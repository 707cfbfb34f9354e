"""The demo and what it runs against: ``python -m app.demo`` sends order lifecycles to
``order-event``; ``python -m app.demo.fakes`` serves a fake logistics API and SMS gateway that
keep the real services' contracts (the tests, the chaos run and the benchmark use them too)."""
