"""The stuck sweep: pending ``t_idem`` rows that nobody finished, and dead letters
nobody settled, raised to a person.

Every ``STUCK_SWEEP_SECONDS`` every worker ticks; one at a time sweeps, the one holding
the database lease ``stuck-sweep:<consumer group>`` (Faust's ``on_leader`` is not mutual
exclusion, and this app disables the leader topic). A sweeper that dies lets its lease run out, and
another worker's tick takes over.

A sweep reports, oldest first and in pages, the critical alerts first:

* each dead letter open (or being retried) for longer than ``COMPENSATION_SLA_SECONDS``:
  ``CompensationSlaBreached`` (critical); each one waiting for a person that long:
  ``CompensationManualWaiting``; at most ``COMPENSATION_SWEEP_LIMIT`` of them, those past
  their SLA first. A mass outage, with thousands of stuck rows, leaves them their room;
* each pending row untouched for ``STUCK_PENDING_SECONDS``: an ERROR line (key, step,
  attempts, owner, age) and the alert ``IdemPendingStuck``; a row claimed
  ``IDEM_MAX_ATTEMPTS`` times is ``IdemAttemptCapReached`` instead: the pipeline
  never claims it again, a person retries or resolves it from the console; at most
  ``STUCK_SWEEP_LIMIT`` rows.

Alerts are counted (``order_alerts_total``) and, with ``ALERT_WEBHOOK_URL`` set, POSTed
in Alertmanager's webhook format. The sweep changes nothing in the database.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from urllib.parse import quote

import aiohttp
import faust

from app.adapters.alerts import Alert, AlertWebhook
from app.adapters.mysql.leases import MySqlLeases, lease_name
from app.adapters.mysql.reads.backlog import Watch
from app.background import BackgroundWork
from app.injection import Wire
from app.observability import metrics
from app.pipeline.states import LedgerStatus
from app.settings import Settings

log = logging.getLogger(__name__)
LEASE = "stuck-sweep"
PAGE = 200


@dataclass
class SweepReport:
    stuck: int = 0
    over_cap: int = 0
    sla_breached: int = 0
    manual: int = 0
    alerts: list[Alert] = field(default_factory=list)
    webhook_failures: int = 0


class Sweep:
    def __init__(self, watch: Watch, *, group: str, stuck_after: float, attempt_cap: int, sla: float, limit: int,
                 console_url: str, webhook: AlertWebhook | None = None, sweeper: str = "",
                 letter_limit: int = 1000) -> None:
        self.watch = watch
        self.group = group
        self.stuck_after = stuck_after
        self.attempt_cap = attempt_cap
        self.sla = sla
        self.limit = limit                  # stuck t_idem rows reported one by one
        self.letter_limit = letter_limit    # dead letters reported one by one (those past their SLA first)
        self.console_url = console_url.rstrip("/")
        self.webhook = webhook
        self.sweeper = sweeper          # who swept: every alert says so

    async def run(self) -> SweepReport:
        report = SweepReport()
        await self._late_letters(report)       # critical first: they go out in the first POST
        await self._stuck(report)
        for alert in report.alerts:
            alert.annotations["sweeper"] = self.sweeper
            metrics.ALERTS.labels(alert.name).inc()
        if report.alerts and self.webhook is not None:
            report.webhook_failures = await self.webhook.send(report.alerts)
        return report

    async def _stuck(self, report: SweepReport) -> None:
        after = None
        while report.stuck + report.over_cap < self.limit:
            page = await self.watch.stuck(self.stuck_after, min(PAGE, self.limit - report.stuck - report.over_cap),
                                          after)
            for row in page:
                capped = row.attempt >= self.attempt_cap
                log.error("%s t_idem row: key=%s step=%s attempts=%d owner=%s age=%.0fs lease_until=%s "
                          "last_err=%s", "over the attempt cap, never claimed again automatically:" if capped
                          else "stuck pending", row.biz_key, row.step, row.attempt, row.owner, row.age_seconds,
                          row.lease_until, (row.last_err or "")[:200])
                if capped:
                    report.over_cap += 1
                else:
                    report.stuck += 1
                report.alerts.append(Alert(
                    "IdemAttemptCapReached" if capped else "IdemPendingStuck", "warning",
                    {"biz_key": row.biz_key, "step": row.step},
                    f"t_idem {row.biz_key} pending for {row.age_seconds:.0f}s after {row.attempt} claims",
                    (f"Claimed {row.attempt} times (IDEM_MAX_ATTEMPTS={self.attempt_cap}): the pipeline will not "
                     "claim it again; find its dead letter and retry or resolve it." if capped else
                     f"Pending longer than {self.stuck_after:g}s; owner {row.owner}, lease until "
                     f"{row.lease_until}. Last error: {(row.last_err or 'none')[:300]}"),
                    row.gmt_modified.replace(tzinfo=UTC) + timedelta(seconds=self.stuck_after),
                    f"{self.console_url}/idem/{quote(row.biz_key, safe='')}",
                    {"attempts": str(row.attempt), "owner": row.owner or "", "age_seconds": f"{row.age_seconds:.0f}"}))
            if len(page) < PAGE:
                break
            after = (page[-1].gmt_modified, page[-1].biz_key)

    async def _late_letters(self, report: SweepReport) -> None:
        room = self.letter_limit
        open_ = await self.watch.late_letters(self.group, (LedgerStatus.OPEN, LedgerStatus.RETRYING), self.sla, room)
        manual = await self.watch.late_letters(self.group, (LedgerStatus.MANUAL,), self.sla, room - len(open_)) \
            if room > len(open_) else []
        for letter in open_:
            log.error("dead letter %d (%s, order %s) unsettled for %.0fs, over COMPENSATION_SLA_SECONDS=%g: %s",
                      letter.id, letter.reason, letter.order_no, letter.age_seconds, self.sla,
                      (letter.message or "")[:200])
        if manual:
            log.warning("%d dead letter(s) wait for a person longer than %gs; oldest: %d (%s, order %s, %.0fs)",
                        len(manual), self.sla, manual[0].id, manual[0].reason, manual[0].order_no,
                        manual[0].age_seconds)
        for letter, name, severity in ([(x, "CompensationSlaBreached", "critical") for x in open_]
                                       + [(x, "CompensationManualWaiting", "info") for x in manual]):
            report.alerts.append(Alert(
                name, severity, {"compensation_id": str(letter.id), "reason": letter.reason},
                f"dead letter {letter.id} ({letter.reason}) {letter.status.name.lower()} for "
                f"{letter.age_seconds:.0f}s",
                f"Order {letter.order_no}, {letter.redrives} redrives. {(letter.message or '')[:300]}",
                letter.first_failure_at.replace(tzinfo=UTC) + timedelta(seconds=self.sla),
                f"{self.console_url}/compensation/{letter.id}",
                {"order_no": letter.order_no or "", "age_seconds": f"{letter.age_seconds:.0f}"}))
        report.sla_breached, report.manual = len(open_), len(manual)


def build(watch: Watch, alert_http: aiohttp.ClientSession, settings: Settings) -> Sweep:
    webhook = None
    if settings.operations.alert_webhook_url:
        webhook = AlertWebhook(alert_http, settings.operations.alert_webhook_url, receiver=settings.app_id,
                               external_url=settings.web.base_url, timeout_seconds=settings.operations.alert_webhook_timeout_seconds,
                               resend_seconds=settings.operations.stuck_sweep_seconds)
    return Sweep(watch, group=settings.app_id, stuck_after=settings.operations.stuck_pending_seconds,
                 attempt_cap=settings.operations.idem_max_attempts, sla=settings.compensation.sla_seconds,
                 limit=settings.operations.stuck_sweep_limit, console_url=settings.web.base_url, webhook=webhook,
                 sweeper=settings.worker_id, letter_limit=settings.operations.compensation_sweep_limit)


async def sweep_stuck(*, settings: Settings, background: BackgroundWork, leases: MySqlLeases, owner: str,
                      watch: Watch, alert_http: aiohttp.ClientSession) -> None:
    if background.stopping:
        return
    try:
        if not await leases.acquire(lease_name(LEASE, settings.app_id), owner, 2 * settings.operations.stuck_sweep_seconds):
            return
        report = await build(watch, alert_http, settings).run()
    except Exception:
        log.exception("the stuck sweep could not run this tick")
        return
    metrics.SWEEPS.inc()
    if report.alerts:
        log.info("stuck sweep: %d stuck, %d over the attempt cap, %d dead letters over their SLA, %d waiting "
                 "for a person", report.stuck, report.over_cap, report.sla_breached, report.manual)


def register(app: faust.App, settings: Settings, wire: Wire):
    return app.timer(interval=settings.operations.stuck_sweep_seconds, name="stuck_sweep")(wire(sweep_stuck))
