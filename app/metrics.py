"""Prometheus metrics of the processor, served at ``/metrics`` with Faust's own.

Durations are in seconds (Prometheus convention); the batch buckets are fine
below 100 ms because that is where a healthy batch lives.
"""

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("order_events_total", "Events consumed from order-event, by outcome.", ["outcome"])
MALFORMED = Counter("order_events_malformed_total", "Events that break the contract, by reason.", ["reason"])
DEAD_LETTERS = Counter("order_dead_letters_total", "Records sent to the dead-letter topic, by reason.", ["reason"])
RETRIES = Counter("order_record_retries_total", "Per-record retries in phase 2, by reason.", ["reason"])
BATCHES = Counter("order_batches_total", "Batches finished (their offsets may be committed).")
BATCH_SECONDS = Histogram(
    "order_batch_seconds", "Wall time of one batch, from take() to finished.",
    buckets=(0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30, 60))
BATCH_EVENTS = Histogram("order_batch_events", "Records per batch.",
                         buckets=(1, 10, 50, 100, 200, 300, 400, 500, 1000))
DB_ROUND_TRIPS = Counter("order_db_round_trips_total", "Statements and commits sent to the database.")
EFFECT_CALLS = Counter("order_effect_calls_total", "External calls, by effect and result.", ["effect", "result"])
LEASE_WAITS = Counter("order_lease_waits_total", "Records that waited for another worker's lease.")
INFRA_WAIT_SECONDS = Counter("order_infra_wait_seconds_total", "Time batches spent waiting for the database.")
IN_FLIGHT_BATCH = Gauge("order_batch_in_flight", "1 while a batch is being processed.")
COMPENSATIONS = Counter("order_compensations_total",
                        "Dead letters the compensator handled, by what became of them.", ["result"])
