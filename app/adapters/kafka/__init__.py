"""Kafka's adapters: the topics, the dead-letter topic, the worker's consumer, whole fetches
handed to the order agent, the record-batch guard, the connection settings of every client,
the broker liveness the watchdog reads, and the operations (topics, groups, offsets, lag)."""
