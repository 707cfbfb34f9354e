"""Prometheus metrics of the processor (served at ``/metrics`` by the web server)."""

from prometheus_client import Counter

EVENTS = Counter("order_events_total", "Events consumed from order-event, by outcome.", ["outcome"])
MALFORMED = Counter("order_events_malformed_total", "Events that break the contract, by reason.", ["reason"])
