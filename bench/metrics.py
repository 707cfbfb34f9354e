"""Reading the worker's ``/metrics`` (Prometheus text format) into the figures of the report.

Batch-time quantiles come from the ``order_batch_seconds`` histogram, by
linear interpolation inside the bucket that holds the rank (what PromQL's
``histogram_quantile`` does): exact only to the bucket bounds. A quantile
that falls in the ``+Inf`` bucket is reported as the last finite bound.
A metric the worker does not export (yet) comes back as ``None``.
"""

from __future__ import annotations

import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def scrape(http: aiohttp.ClientSession, url: str) -> dict:
    """The report's figures from one scrape; ``{"error": ...}`` if the worker does not answer."""
    try:
        async with http.get(url) as resp:
            text = await resp.text()
            if resp.status != 200:
                return {"error": f"HTTP {resp.status}"}
    except (TimeoutError, aiohttp.ClientError) as exc:
        return {"error": f"{exc.__class__.__name__}: {exc}"}
    return summarize(text)


def summarize(text: str) -> dict:
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    buckets = sorted((float(s.labels["le"]), s.value) for s in samples if s.name == "order_batch_seconds_bucket")
    batches = _value(samples, "order_batches_total")
    round_trips = _value(samples, "order_db_round_trips_total")
    events_sum, events_count = _value(samples, "order_batch_events_sum"), _value(samples, "order_batch_events_count")
    return {
        "batches": batches,
        "db_round_trips": round_trips,
        "db_round_trips_per_batch": round_trips / batches if round_trips is not None and batches else None,
        "events_per_batch": events_sum / events_count if events_sum is not None and events_count else None,
        "batch_ms_p50": _ms(quantile(buckets, 0.50)),
        "batch_ms_p99": _ms(quantile(buckets, 0.99)),
        "batch_seconds_buckets": {("+Inf" if math.isinf(le) else f"{le:g}"): count for le, count in buckets},
        "events_by_outcome": _by_label(samples, "order_events_total", "outcome"),
        "dead_letters_by_reason": _by_label(samples, "order_dead_letters_total", "reason"),
        "retries_by_reason": _by_label(samples, "order_record_retries_total", "reason"),
        "effect_calls": {f"{s.labels.get('effect')}/{s.labels.get('result')}": s.value
                         for s in samples if s.name == "order_effect_calls_total"},
    }


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """``q``-quantile of a cumulative histogram ``[(upper bound, count <= bound), ...]``, sorted by bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _value(samples: list, name: str) -> float | None:
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


def _by_label(samples: list, name: str, label: str) -> dict[str, float]:
    return {s.labels.get(label, ""): s.value for s in samples if s.name == name}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
