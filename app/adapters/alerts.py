"""Alerts out: a POST in Alertmanager's webhook format (version 4), so whatever already
receives Alertmanager's notifications (a chat bridge, an incident tool, Alertmanager's
own webhook receivers) takes ours unchanged.

One POST per alert name and sweep, or more: at most ``MAX_PER_POST`` alerts go in one
(nothing is truncated). Every alert carries ``endsAt``: a
sender that stops re-sending it (the row got unstuck) lets it resolve by itself. A POST
that fails is logged and counted; the sweep goes on (the logs and metrics still carry
every alert).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import groupby

import aiohttp

from app.observability.metrics import ALERT_POSTS

log = logging.getLogger(__name__)
MAX_PER_POST = 100


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    labels: dict[str, str]
    summary: str
    description: str
    starts_at: datetime
    url: str = ""               # where a person looks at it (a view of this app)
    annotations: dict[str, str] = field(default_factory=dict)

    def as_alertmanager(self, ends_at: datetime) -> dict:
        labels = {"alertname": self.name, "severity": self.severity, **self.labels}
        return {
            "status": "firing",
            "labels": labels,
            "annotations": {"summary": self.summary, "description": self.description, **self.annotations},
            "startsAt": _rfc3339(self.starts_at),
            "endsAt": _rfc3339(ends_at),
            "generatorURL": self.url,
            "fingerprint": hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16],
        }


def payload(alerts: list[Alert], *, receiver: str, external_url: str, ends_at: datetime) -> dict:
    """One Alertmanager webhook message for alerts of one name (at most ``MAX_PER_POST``)."""
    name = alerts[0].name
    shown = [alert.as_alertmanager(ends_at) for alert in alerts[:MAX_PER_POST]]
    common = dict(set.intersection(*(set(a["labels"].items()) for a in shown)))
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{name}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": {"alertname": name},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": external_url,
        "alerts": shown,
    }


class AlertWebhook:
    def __init__(self, session: aiohttp.ClientSession, url: str, *, receiver: str, external_url: str,
                 timeout_seconds: float, resend_seconds: float) -> None:
        self.session = session
        self.url = url
        self.receiver = receiver
        self.external_url = external_url
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.resend_seconds = resend_seconds

    async def send(self, alerts: list[Alert]) -> int:
        """POST ``alerts`` grouped by name; the number of POSTs that failed."""
        # Resolves by itself unless sent again: the sweep re-sends a firing alert every interval.
        ends_at = datetime.now(UTC) + timedelta(seconds=3 * self.resend_seconds)
        failed = 0
        for _, group in groupby(sorted(alerts, key=lambda a: a.name), key=lambda a: a.name):
            group = list(group)
            for start in range(0, len(group), MAX_PER_POST):
                failed += await self._post(payload(group[start:start + MAX_PER_POST], receiver=self.receiver,
                                                   external_url=self.external_url, ends_at=ends_at))
        return failed

    async def _post(self, body: dict) -> int:
        try:
            async with self.session.post(self.url, json=body, timeout=self.timeout) as response:
                problem = None if response.status < 300 else \
                    f"HTTP {response.status}: {(await response.text(errors='replace'))[:200]!r}"
        except Exception as exc:
            problem = repr(exc)
        if problem is not None:
            ALERT_POSTS.labels("failed").inc()
            log.warning("alert webhook POST of %d %s alert(s) to %s failed: %s", len(body["alerts"]),
                        body["groupLabels"]["alertname"], self.url, problem)
            return 1
        ALERT_POSTS.labels("ok").inc()
        return 0


def _rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
