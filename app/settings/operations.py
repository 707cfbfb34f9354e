"""Operations: the stuck sweep and its alerts, the metrics' refresh, t_idem's retention, monthly
partitions and capacity budget, and how the process runs (logging, event loop, working folder,
the chaos tests' kill switch).

The process's identity (``APP_ID``, ``WORKER_ID``) is not here but on the root
(``app.settings.Settings``): every concern uses it (the consumer group, the owner of a claim, the
key of the store's watermark, the headers of a dead letter).
"""

from __future__ import annotations

from typing import Literal

from app.settings._base import Group, setting

# Bytes per t_idem row, primary key and idx_status_modified included, as MariaDB reports them
# (information_schema DATA_LENGTH + INDEX_LENGTH / TABLE_ROWS) at 10 million rows (bench, cost row).
ROW_BYTES = 390


class OperationsSettings(Group):
    TITLE = "Operations"

    stuck_pending_seconds: float = setting("STUCK_PENDING_SECONDS", 600.0, gt=0,
        description='A pending `t_idem` row untouched this long is stuck: alerted on, listed by `GET /idem/stuck/`.')

    stuck_sweep_seconds: float = setting("STUCK_SWEEP_SECONDS", 300.0, gt=0,
        description='How often one worker (a database lease) sweeps for stuck rows and overdue dead letters.')

    stuck_sweep_limit: int = setting("STUCK_SWEEP_LIMIT", 1000, ge=1,
        description='The most stuck `t_idem` rows one sweep reports one by one (oldest first).')

    compensation_sweep_limit: int = setting("COMPENSATION_SWEEP_LIMIT", 1000, ge=1,
        description='The most dead letters one sweep reports one by one, those past their SLA (critical) first; a '
                    "limit of their own, so a mass outage's stuck rows never crowd them out.")

    idem_max_attempts: int = setting("IDEM_MAX_ATTEMPTS", 20, ge=2,
        description='Claims of one step key before it is left to a person: a pending row claimed this often is '
                    "alerted on and never claimed again automatically (a person's retry from the console or CLI still"
                    ' may).')

    alert_webhook_url: str | None = setting("ALERT_WEBHOOK_URL", None,
        description="The sweep POSTs its alerts here in Alertmanager's webhook format; unset: logs and metrics only.")

    alert_webhook_timeout_seconds: float = setting("ALERT_WEBHOOK_TIMEOUT_SECONDS", 5.0, gt=0,
        description='Timeout of one such POST.')

    controls_refresh_seconds: float = setting("CONTROLS_REFRESH_SECONDS", 2.0, gt=0, le=60,
        description="How often every worker reads the operator controls (effects held, partitions paused: "
                    "[Operator controls](operations.md#operator-controls)): a hold or a pause reaches every worker "
                    "within this long, and a hold ends this long after its planned end at most.")

    metrics_refresh_seconds: float = setting("METRICS_REFRESH_SECONDS", 30.0, gt=0,
        description="How often every worker reads the gauges that live in the database and the group's lag from the "
                    'broker.')

    idem_retention_days: int = setting("IDEM_RETENTION_DAYS", 90, ge=1,
        description='Monthly `t_idem` partitions wholly older than this are dropped (a day after the cutoff passed '
                    'them), and an event of an order dated before the cutoff is dead-lettered as '
                    '`beyond_dedup_retention`, never run again.')

    partitions_ahead: int = setting("PARTITIONS_AHEAD", 3, ge=1,
        description='Monthly `t_idem` partitions kept ready after the current one.')

    partition_timer_seconds: float = setting("PARTITION_TIMER_SECONDS", 3600.0, gt=0,
        description='How often one worker (a database lease) adds and drops partitions (also 5 s after start).')

    partition_lock_wait_seconds: int = setting("PARTITION_LOCK_WAIT_SECONDS", 2, ge=2, le=60,
        description="The longest a partition change may hold the pipeline's statements up while it waits for the "
                    "table's metadata lock; then it gives up and tries again (at least 2; keep it under "
                    '`DB_STATEMENT_TIMEOUT_SECONDS`, or a statement queued behind a change times out and is waited '
                    'out like a database outage).')

    capacity_events_per_second: float = setting("CAPACITY_EVENTS_PER_SECOND", 10.0, gt=0,
        description='Average event rate over a day: sizes `t_idem` for the capacity budget.')

    capacity_peak_events_per_second: float = setting("CAPACITY_PEAK_EVENTS_PER_SECOND", 50.0, gt=0,
        description="The group's rate at the busiest hour: sizes the replay window.")

    capacity_outage_sla_days: float = setting("CAPACITY_OUTAGE_SLA_DAYS", 7.0, ge=0,
        description='The longest stop of the consumers the service must survive.')

    kafka_offsets_retention_days: float = setting("KAFKA_OFFSETS_RETENTION_DAYS", 7.0, gt=0,
        description="The broker's `offsets.retention.minutes`, in days.")

    capacity_row_bytes: int = setting("CAPACITY_ROW_BYTES", ROW_BYTES, ge=1,
        description='Bytes per `t_idem` row, indexes included (measured at 10 million rows).')

    idem_capacity_budget_rows: int | None = setting("IDEM_CAPACITY_BUDGET_ROWS", None, ge=1,
        description="The rows `t_idem` is sized for (the watermark's divisor); unset: the budget command's model.")

    log_level: str = setting("LOG_LEVEL", "info",
        description='Level of the `app` loggers.')

    event_loop: Literal["uvloop", "asyncio"] = setting("EVENT_LOOP", "uvloop",
        description="`uvloop` or `asyncio` (uvloop makes Faust's per-event work about 15% cheaper; 400 start/stop "
                    'cycles each, `python -m bench.start_stop_cycles`: one SIGSEGV under uvloop when SIGTERM came a '
                    'second after start, none under asyncio: [The event loop](operations.md#self-healing)).')

    data_dir: str = setting("DATA_DIR", ".cache/faust",
        description="Faust's working folder (holds nothing we rely on).")

    chaos_kill_at: str | None = setting("CHAOS_KILL_AT", None,
        description='Tests only: SIGKILL the worker at a cut point (`before_a`, `a_b`, `b_c`, `after_c`).')

