"""What the tests and the benchmark both stand on: real services (the shared Kafka and MariaDB,
and servers of a test's own: TLS, SASL, three nodes, a GTID replica, ones it may SIGKILL), real
processes (workers, the fake services), TCP proxies, Kafka's Java client, events and dead letters
as other clients write them, an in-memory store, the scenario table run on both stores, and the
chaos run (``harness.chaos``: its driver, storm, workload and checker)."""
