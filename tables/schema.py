"""The tables. Statuses are small integers; their meaning lives in ``app.pipeline.states``."""

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.mysql import DATETIME, MEDIUMBLOB, MEDIUMTEXT

metadata = MetaData()

NOW3 = text("CURRENT_TIMESTAMP(3)")
TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def _timestamps() -> list[Column]:
    return [Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
            Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3)]


# One row per idempotency key (one step of one event): the memory of "have I
# done this, and how far". part_date is derived from the business key itself
# (the date inside the order number), so partitioning by it later changes
# nothing and one key can never have two rows.
t_idem = Table(
    "t_idem",
    metadata,
    Column("biz_key", String(128), primary_key=True),
    Column("part_date", Date, primary_key=True),
    Column("step", String(32), nullable=False),
    Column("status", SmallInteger, nullable=False, comment="1 pending, 2 done, 3 failed"),
    Column("attempt", Integer, nullable=False, server_default=text("0"), comment="claims so far; the fencing token"),
    Column("owner", String(128), nullable=True, comment="worker incarnation holding the claim"),
    Column("lease_until", DATETIME(fsp=3), nullable=True, comment="claim is exclusive until then"),
    Column("idem_token", String(64), nullable=True, comment="sent as Idempotency-Key on every call"),
    Column("payload_hash", String(64), nullable=False, comment="sha256 of order_no, type and data"),
    Column("outcome", String(64), nullable=True, comment="applied/stale/waybill_issued/... or the failure reason"),
    Column("last_err", String(512), nullable=True),
    *_timestamps(),
    # A provider keeps a key for a while only: the key horizon counts from here (0019).
    Column("first_call_at", DATETIME(fsp=3), nullable=True,
           comment="when the first claim whose call may have reached the provider began; NULL: none did yet"),
    Index("idx_status_modified", "status", "gmt_modified"),
    **TABLE_ARGS,
)

t_order = Table(
    "t_order",
    metadata,
    Column("order_no", String(64), primary_key=True),
    Column("status", SmallInteger, nullable=False, comment="1 created, 2 paid, 3 confirmed, 4 cancelled"),
    Column("amount_cents", BigInteger, nullable=True),
    Column("phone", String(32), nullable=True),
    Column("address", String(512), nullable=True),
    Column("paid_cents", BigInteger, nullable=True),
    Column("cancel_reason", String(255), nullable=True),
    *_timestamps(),
    Column("has_dead_letters", Boolean, nullable=False, server_default=text("0"),
           comment="a dead letter of this order awaits the order's next move"),
    **TABLE_ARGS,
)

# Written in T3, in the same transaction as pending -> done. One per order.
t_waybill_receipt = Table(
    "t_waybill_receipt",
    metadata,
    Column("order_no", String(64), primary_key=True),
    Column("waybill_no", String(64), nullable=False),
    Column("idem_token", String(64), nullable=False),
    Column("biz_key", String(128), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("gmt_create", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    **TABLE_ARGS,
)


# The compensation ledger: one row per dead-lettered record and consumer group
# (unique by the group and the record's source coordinates, timestamp included
# because a topic created again reuses offsets; dead-lettering the same record
# twice adds nothing).
# status: 1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded.
t_compensation = Table(
    "t_compensation",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("src_topic", String(249), nullable=False),
    Column("src_partition", Integer, nullable=False),
    Column("src_offset", BigInteger, nullable=False),
    Column("consumer_group", String(255), nullable=False),
    Column("order_no", String(64), nullable=True),
    Column("event_id", String(64), nullable=True),
    Column("biz_key", String(128), nullable=True),
    Column("status", SmallInteger, nullable=False,
           comment="1 open, 2 retrying, 3 compensated, 4 manual, 5 discarded, 6 superseded, 7 resolved"),
    Column("reason", String(64), nullable=False),
    Column("message", String(1024), nullable=True),
    Column("retriable", Boolean, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_retry_at", DATETIME(fsp=3), nullable=True),
    Column("may_be_superseded", Boolean, nullable=False, server_default=text("0"),
           comment="later events of the same order ran after this one"),
    Column("worker_id", String(128), nullable=True),
    Column("first_failure_at", DATETIME(fsp=3), nullable=False),
    *_timestamps(),
    Column("src_timestamp", BigInteger, nullable=False, server_default=text("-1"),
           comment="the record's timestamp in ms, -1 if it had none"),
    Column("truncated", Boolean, nullable=False, server_default=text("0"),
           comment="the dead-letter record carries only the start of the original"),
    Column("record_key", MEDIUMBLOB, nullable=True, comment="the record's key as dead-lettered"),
    Column("record_value", MEDIUMBLOB, nullable=True, comment="the record's value as dead-lettered"),
    Column("record_headers", Text, nullable=True, comment="its own headers, JSON [[key, base64 value or null]]"),
    Column("redrives", Integer, nullable=False, server_default=text("0"),
           comment="times the compensator ran the event again"),
    Column("owner", String(128), nullable=True, comment="who is working the row now (status 2)"),
    Column("lease_until", DATETIME(fsp=3), nullable=True, comment="the claim of status 2 is exclusive until then"),
    Column("record_key_bytes", BigInteger, nullable=True,
           comment="the size of the record's key, when record_key holds only its start"),
    Column("record_key_sha256", String(64), nullable=True,
           comment="the SHA-256 of the whole key, when record_key holds only its start"),
    Column("record_value_bytes", BigInteger, nullable=True,
           comment="the size of the record's value, when record_value holds only its start"),
    Column("record_value_sha256", String(64), nullable=True,
           comment="the SHA-256 of the whole value, when record_value holds only its start"),
    Column("fingerprint", String(16), nullable=True,
           comment="the error group: a hash of the reason, the effect, the service's status or error class "
                   "and the normalised message"),
    UniqueConstraint("consumer_group", "src_topic", "src_partition", "src_offset", "src_timestamp",
                     name="uk_source"),
    Index("idx_status_next_retry", "status", "next_retry_at"),
    # an order's dead letters, newest first, and their count up to its cap, from the index alone
    Index("idx_order_group", "order_no", "consumer_group"),
    Index("idx_status_id", "status", "id"),
    Index("idx_reason_id", "reason", "id"),
    Index("idx_group_fingerprint", "consumer_group", "fingerprint", "id"),
    Index("idx_group_first_failure", "consumer_group", "first_failure_at"),
    # the gauges: each unsettled status's count up to its cap, and its oldest row (the first entry)
    Index("idx_group_status_first_failure", "consumer_group", "status", "first_failure_at"),
    # the unsettled part of every error group, read from the index alone (app.adapters.mysql.ledger.grouping)
    Index("idx_group_status_fingerprint", "consumer_group", "status", "fingerprint", "order_no", "first_failure_at"),
    **TABLE_ARGS,
)

# What happened to each ledger row, and who did it: every attempt of the compensator
# and every action of a person (the console, the CLI), in order.
t_compensation_audit = Table(
    "t_compensation_audit",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("compensation_id", BigInteger, nullable=False),
    Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("actor", String(128), nullable=False, comment="compensator, timer, web:<who>, cli:<who>"),
    Column("action", String(32), nullable=False, comment="attempt, retry, resolve, discard, opened"),
    Column("from_status", SmallInteger, nullable=True),
    Column("to_status", SmallInteger, nullable=True),
    Column("note", String(1024), nullable=True, comment="what the person wrote"),
    Column("detail", String(1024), nullable=True, comment="what happened: an outcome or an error"),
    Column("job_id", BigInteger, nullable=True, comment="the bulk job (t_bulk_job) that did it, if one did"),
    Index("idx_compensation", "compensation_id", "id"),
    Index("idx_job", "job_id"),
    **TABLE_ARGS,
)

# Named leases: one worker at a time runs a timer's work (``on_leader`` is no mutual exclusion).
t_lease = Table(
    "t_lease",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("lease_until", DATETIME(fsp=3), nullable=False),
    Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    **TABLE_ARGS,
)

# Recovery windows: while one is open, a fresh claim of a non-idempotent effect that its service
# can verify (the SMS) is looked up before it is sent, because the store may have forgotten an
# earlier claim (a failover, a restore from backup). Opened by a person (the CLI) or by a worker
# that finds itself on another database server than the store last recorded; each row is also
# the audit of who opened and ended it, and why.
t_recovery_window = Table(
    "t_recovery_window",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("opened_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("ends_at", DATETIME(fsp=3), nullable=False),
    Column("opened_by", String(128), nullable=False, comment="cli:<who>, or worker:<id> for a server change"),
    Column("reason", String(1024), nullable=False, comment="why: what the person wrote, or the server change seen"),
    Column("ended_at", DATETIME(fsp=3), nullable=True, comment="set when ended before ends_at"),
    Column("ended_by", String(128), nullable=True),
    Column("end_note", String(1024), nullable=True),
    Index("idx_ends_at", "ends_at"),
    **TABLE_ARGS,
)

# The database server the store last saw, and how far the store has come (one row): a worker
# connected to another server (a replica promoted by a failover, a server rebuilt from a backup),
# or that finds the watermark behind what Kafka remembers of it (a restore into the same server),
# opens a recovery window.
t_store_server = Table(
    "t_store_server",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("server", String(255), nullable=False, comment="server_uuid, or host:port#server_id"),
    Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("watermark", BigInteger, nullable=False, server_default=text("0"),
           comment="advanced by every worker and published to the watermark topic; lower than what Kafka "
                   "remembers: the store went back in time"),
    **TABLE_ARGS,
)

# The workers' heartbeats, one row per process (an incarnation: a worker id and a run of it). A
# claim whose owner stopped beating is taken over at the owner's presumed death, not at the end of
# its lease; the owner, for its part, starts no call unless its heartbeat got through recently.
t_worker = Table(
    "t_worker",
    metadata,
    Column("incarnation", String(160), primary_key=True,
           comment="<worker_id>/<run>: one process, from its start to its end; the owners of its claims"),
    Column("worker_id", String(64), nullable=False),
    Column("started_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("last_seen", DATETIME(fsp=3), nullable=False, server_default=NOW3,
           comment="its last heartbeat, the database clock"),
    Column("stopped_at", DATETIME(fsp=3), nullable=True,
           comment="set by a clean stop: it calls nothing more, its claims are free at once"),
    Index("idx_last_seen", "last_seen"),
    **TABLE_ARGS,
)

# Records of types this processor does not handle, skipped (UNHANDLED_EVENT_TYPES=skip): how many of
# each type, since when, and where the latest one is, so a person sees what the topic carries that
# no step reads. Each worker adds what it skipped at its gauges' refresh (METRICS_REFRESH_SECONDS).
t_skipped_type = Table(
    "t_skipped_type",
    metadata,
    Column("consumer_group", String(255), primary_key=True),
    Column("event_type", String(64), primary_key=True, comment="as the record names it; `other` past 100 a worker"),
    Column("skipped", BigInteger, nullable=False, server_default=text("0")),
    Column("first_seen", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("last_seen", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("last_topic", String(249), nullable=True, comment="where the latest one is"),
    Column("last_partition", Integer, nullable=True),
    Column("last_offset", BigInteger, nullable=True),
    **TABLE_ARGS,
)

# Who saw personal data whole: every unmasked view (an operator's look at a dead letter or an
# order's timeline, a download of a record, the CLI's ``dlq show --unmasked``). A viewer's masked
# answers are not written here. Kept apart from t_compensation_audit, which is a row's history of
# decisions: reads would bury it, and an order's timeline belongs to no ledger row.
t_view_audit = Table(
    "t_view_audit",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("consumer_group", String(255), nullable=False, comment="the app whose data was seen"),
    Column("actor", String(128), nullable=False, comment="web:<X-Actor>, cli:<--actor>"),
    Column("role", String(16), nullable=False, comment="operator"),
    Column("what", String(32), nullable=False, comment="dead_letter, timeline, download:value, download:envelope"),
    Column("path", String(512), nullable=False, comment="the path asked, or the CLI command"),
    Column("compensation_id", BigInteger, nullable=True),
    Column("order_no", String(64), nullable=True),
    Index("idx_group_id", "consumer_group", "id"),
    **TABLE_ARGS,
)

# Error groups (app.compensation.fingerprints): what each group of dead letters is, and how many
# letters it holds per hour of their first failure, kept in the same transaction as every
# ledger write that sets or changes a row's fingerprint (app.adapters.mysql.ledger.grouping).
t_error_group = Table(
    "t_error_group",
    metadata,
    Column("consumer_group", String(255), primary_key=True),
    Column("fingerprint", String(16), primary_key=True),
    Column("reason", String(64), nullable=False),
    Column("effect", String(32), nullable=False, comment="the effect the message names, - if none"),
    Column("detail", String(64), nullable=False, comment="the service's status or the error class, - if neither"),
    Column("sample", String(1024), nullable=True, comment="the message of the latest letter that joined the group"),
    *_timestamps(),
    **TABLE_ARGS,
)

t_error_group_hour = Table(
    "t_error_group_hour",
    metadata,
    Column("consumer_group", String(255), primary_key=True),
    Column("fingerprint", String(16), primary_key=True),
    Column("hour", DATETIME(fsp=0), primary_key=True, comment="the UTC hour of the letters' first failure"),
    Column("letters", Integer, nullable=False, comment="ledger rows of the group whose first failure is in the hour"),
    Column("first_at", DATETIME(fsp=3), nullable=False, comment="the earliest first failure that joined the bucket"),
    Column("last_at", DATETIME(fsp=3), nullable=False, comment="the latest first failure that joined the bucket"),
    Index("idx_group_hour", "consumer_group", "hour"),
    **TABLE_ARGS,
)

# Bulk actions on the dead-letter queue: a job retries, resolves or discards the ledger rows a
# filter selected when it was made (its items), in the background, a chunk at a time, by any
# worker that holds its lease. The row is also the audit of who made, paused and aborted it.
t_bulk_job = Table(
    "t_bulk_job",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("action", String(16), nullable=False, comment="retry, resolve or discard"),
    Column("status", SmallInteger, nullable=False, comment="1 running, 2 paused, 3 done, 4 aborted"),
    Column("filter", Text, nullable=False, comment="the queue filter that selected the rows, JSON"),
    Column("note", String(1024), nullable=True, comment="what the person wrote"),
    Column("created_by", String(128), nullable=False, comment="web:<who> or cli:<who>"),
    Column("expected_count", Integer, nullable=False, comment="the count the person saw in the dry run"),
    Column("total", Integer, nullable=False, comment="the rows the job took (its items)"),
    Column("done_count", Integer, nullable=False, server_default=text("0")),
    Column("changed_count", Integer, nullable=False, server_default=text("0")),
    Column("failed_count", Integer, nullable=False, server_default=text("0")),
    Column("rate_per_minute", Integer, nullable=True, comment="rows a minute, lately"),
    Column("owner", String(128), nullable=True, comment="the worker running it now"),
    Column("lease_until", DATETIME(fsp=3), nullable=True, comment="its run is exclusive until then"),
    Column("paused_by", String(128), nullable=True),
    Column("aborted_by", String(128), nullable=True),
    Column("finished_at", DATETIME(fsp=3), nullable=True),
    *_timestamps(),
    Index("idx_group_status", "consumer_group", "status", "id"),
    **TABLE_ARGS,
)

t_bulk_item = Table(
    "t_bulk_item",
    metadata,
    Column("job_id", BigInteger, primary_key=True, autoincrement=False),
    Column("compensation_id", BigInteger, primary_key=True, autoincrement=False),
    Column("state", SmallInteger, nullable=False, server_default=text("0"), comment="0 pending, 1 done"),
    Column("outcome", String(16), nullable=True, comment="changed, unchanged or failed"),
    Column("detail", String(1024), nullable=True, comment="why it failed, or what the action found"),
    Column("not_before", DATETIME(fsp=3), nullable=True, comment="busy elsewhere: tried again from then"),
    Column("gmt_modified", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Index("idx_job_state", "job_id", "state", "compensation_id"),
    **TABLE_ARGS,
)

# The reconcile's runs: over which range of the input, who ran it (the timer or a person), how
# every record ended and what was found (``app.reconcile``). The report keeps its first findings.
t_reconcile_run = Table(
    "t_reconcile_run",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("range_from", DATETIME(fsp=3), nullable=False, comment="records at or after (their timestamps, UTC)"),
    Column("range_to", DATETIME(fsp=3), nullable=False, comment="records before"),
    Column("started_by", String(128), nullable=False, comment="timer:<worker>, cli:<who>"),
    Column("started_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("finished_at", DATETIME(fsp=3), nullable=True),
    Column("status", String(16), nullable=False, comment="running, clean, findings, failed"),
    Column("records", BigInteger, nullable=False, server_default=text("0")),
    Column("findings", Integer, nullable=False, server_default=text("0")),
    Column("summary", String(1024), nullable=True, comment="the findings by kind, JSON: what the gauges read"),
    Column("report", MEDIUMTEXT, nullable=True, comment="the report as JSON (its first findings)"),
    Index("idx_group_id", "consumer_group", "id"),
    **TABLE_ARGS,
)

# Cases for a person from the comparison of our receipts with a provider's own records
# (``app.reconcile.providers``): a duplicate at the provider (the extra waybill), an orphan (a waybill
# we hold no receipt for) or a missing one (a receipt whose waybill the provider does not list). One
# case per (group, kind, effect, reference), however many runs find it: each run moves last_seen_at.
t_reconcile_case = Table(
    "t_reconcile_case",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("kind", String(16), nullable=False, comment="duplicate, orphan, missing"),
    Column("effect", String(32), nullable=False),
    Column("provider", String(32), nullable=False),
    Column("order_no", String(64), nullable=False),
    Column("reference", String(64), nullable=False,
           comment="the extra waybill (duplicate), the one we hold no receipt for (orphan), our receipt's (missing)"),
    Column("evidence", Text, nullable=False, comment="what the run saw, JSON"),
    Column("status", SmallInteger, nullable=False, comment="1 open, 2 adopted, 3 compensated, 4 dismissed"),
    Column("found_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("last_seen_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("found_by_run", BigInteger, nullable=True, comment="the reconcile run (t_reconcile_run) that found it"),
    Column("closed_at", DATETIME(fsp=3), nullable=True),
    Column("closed_by", String(128), nullable=True, comment="web:<who>, cli:<who>"),
    Column("note", String(1024), nullable=True, comment="what the person who closed it wrote"),
    UniqueConstraint("consumer_group", "kind", "effect", "reference", name="uk_case"),
    # the list, a status at a time, newest first; the open cases' count by kind
    Index("idx_group_status_id", "consumer_group", "status", "id"),
    **TABLE_ARGS,
)

# Every case's history: its opening by a run and each action of a person, with what the provider said.
t_reconcile_case_audit = Table(
    "t_reconcile_case_audit",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("case_id", BigInteger, nullable=False),
    Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("actor", String(128), nullable=False, comment="reconcile:<run>, web:<who>, cli:<who>"),
    Column("action", String(32), nullable=False, comment="opened, compensate, adopt, dismiss"),
    Column("from_status", SmallInteger, nullable=True),
    Column("to_status", SmallInteger, nullable=True),
    Column("note", String(1024), nullable=True, comment="what the person wrote"),
    Column("detail", String(1024), nullable=True, comment="what happened: the provider's answer, or why not"),
    Index("idx_case", "case_id", "id"),
    **TABLE_ARGS,
)

# Which releases the schema serves: one row (migrations/env.py writes it after each migration run).
t_schema_release = Table(
    "t_schema_release",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False, comment="always 1"),
    Column("revision", String(32), nullable=False, comment="the schema's revision (alembic_version)"),
    Column("oldest_release", String(32), nullable=False, comment="the oldest release whose workers run on this schema"),
    Column("migrated_by", String(32), nullable=False, comment="the release whose migrate command wrote it"),
    Column("migrated_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    **TABLE_ARGS,
)

# Operator controls: an effect held across the whole group, a partition paused (app.pipeline.controls),
# and who did what to them.
t_effect_hold = Table(
    "t_effect_hold",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("effect", String(32), nullable=False),
    Column("starts_at", DATETIME(fsp=3), nullable=False, comment="held from (UTC)"),
    Column("ends_at", DATETIME(fsp=3), nullable=False,
           comment="its planned end (UTC): the hold ends then by itself if auto_release, else a person ends it"),
    Column("auto_release", Boolean, nullable=False, comment="1: ends at ends_at by itself"),
    Column("reason", String(1024), nullable=False),
    Column("held_by", String(128), nullable=False),
    Column("created_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("released_at", DATETIME(fsp=3), nullable=True),
    Column("released_by", String(128), nullable=True),
    Column("release_note", String(1024), nullable=True),
    Index("idx_group_released", "consumer_group", "released_at", "effect"),
    **TABLE_ARGS,
)

t_partition_pause = Table(
    "t_partition_pause",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("partition_no", Integer, nullable=False),
    Column("reason", String(1024), nullable=False),
    Column("paused_by", String(128), nullable=False),
    Column("paused_at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("resumed_at", DATETIME(fsp=3), nullable=True),
    Column("resumed_by", String(128), nullable=True),
    Column("resume_note", String(1024), nullable=True),
    Index("idx_group_resumed", "consumer_group", "resumed_at", "topic", "partition_no"),
    **TABLE_ARGS,
)

t_control_audit = Table(
    "t_control_audit",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("consumer_group", String(255), nullable=False),
    Column("at", DATETIME(fsp=3), nullable=False, server_default=NOW3),
    Column("actor", String(128), nullable=False, comment="web:<who>, cli:<who>"),
    Column("action", String(16), nullable=False, comment="hold, release, pause, resume"),
    Column("target", String(300), nullable=False, comment="the effect, or topic:partition"),
    Column("control_id", BigInteger, nullable=False, comment="t_effect_hold.id or t_partition_pause.id"),
    Column("note", String(1024), nullable=True),
    Index("idx_group_at", "consumer_group", "at"),
    **TABLE_ARGS,
)

# Our waybill receipts over a time range (the providers' reconciliation reads them by gmt_create).
Index("idx_gmt_create", t_waybill_receipt.c.gmt_create)
