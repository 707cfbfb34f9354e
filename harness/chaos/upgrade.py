"""A rolling upgrade under load, and its rollback, played as the storm's big faults
(``make chaos MODE=upgrade``; the short one in ``make test``).

The run's workers start on the previous release (``harness.releases``: built from its commit,
a virtualenv of its own) on a database its own migrations brought to its head. While the
records flow (and, in the long run, the storm blows), the big faults' slots hold, in order:

    migrate_online     the current code's migrations to head (``python -m app.admin migrate``),
                       while the previous release writes
    upgrade_worker     once every worker is ready (``/readyz``), the group Stable and caught up with
                       its input, as a rollout that takes one worker down at a time waits (and no
                       kill's replay is counted): a worker of the previous release
                       SIGTERMed and waited for, one of the current code started in its slot; then
                       the group waited for: Stable with every member, every partition consumed
                       again (its committed offset moved on) and the new worker consuming
    roll_back_worker   the same the other way round: a current worker replaced by the previous
                       release, the new schema left in place

No kill lands while a replacement runs (the storm is paused), so what it measures is its own, and
the storm's gates hold no record back meanwhile: the input flows all along.
Each replacement records, for the manifest's ``upgrade`` section (harness/chaos/CONTRACT.md):
when the SIGTERM went, when and how the worker exited, the group's committed offsets then and at
its exit, when the group was Stable again and every partition consumed, and how much the workers'
replay counter rose meanwhile. The checker works out from the tables what the stopped worker
finished and did not commit, the replay window of the replacement (harness/chaos/upgrade_check.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from typing import Any

import pymysql
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import connection_of
from app.adapters.mysql import schema
from harness.chaos.fleet import Fleet
from harness.releases import Release
from harness.services import ROOT

STEPS = ("migrate_online", "upgrade_worker", "roll_back_worker")
SETTLE_WITHIN = 180.0        # seconds a replacement may take to be Stable and consuming again (a bound)
POLL = 0.25
# A SIGKILLed worker stays a member of the group until its session times out: a replacement waits
# that long (and a second) after the storm's last kill, or "Stable with every member" could count it.
DEFAULT_SESSION_SECONDS = 30.0


def migrate_to_current(url: str) -> None:
    """The current code's migrations to head on the database at ``url`` (direct, not the proxy), as an
    operator runs them during a rolling upgrade (``python -m app.admin migrate``, docs/upgrading.md):
    the one place the run migrates with the new code."""
    env = {**os.environ, "MYSQL_URL": url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "app.admin", "migrate"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"python -m app.admin migrate exited {done.returncode}: {done.stderr[-1500:]}")


def current_head() -> str:
    """The current code's newest revision."""
    return schema.revisions()[0]


def schema_revision(mysql: dict) -> str | None:
    """The database's revision (``alembic_version``), read directly."""
    conn = pymysql.connect(host=mysql["host"], port=int(mysql["port"]), user=mysql["user"],
                           password=mysql["password"], database=mysql["database"], connect_timeout=10)
    with closing(conn), conn.cursor() as cur:
        cur.execute("SELECT version_num FROM alembic_version")
        row = cur.fetchone()
    return row[0] if row else None


def current_commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


class RollingUpgrade:
    """The upgrade's steps, for the storm (``steps()``), and what they did (``record``)."""

    def __init__(self, previous: Release, *, kafka, group: str, topic: str, partitions: int, mysql: dict, url: str,
                 planned: tuple[str, ...]) -> None:
        """``kafka``: the run's connection; ``mysql``: the database directly, ``url`` the same as a
        SQLAlchemy URL (the migration's); ``planned``: the profile's big faults, in order."""
        self.previous, self.kafka = previous, kafka
        self.group, self.topic, self.partitions, self.mysql, self.url = group, topic, partitions, mysql, url
        self.storm: Any = None
        self.fleet: Any = None
        self.record: dict = {
            "previous": {"version": previous.version, "commit": previous.commit},
            "current": {"version": "current", "commit": current_commit()},
            "schema": {"previous_head": None, "current_head": current_head()},
            "planned": {step: planned.count(step) for step in STEPS},
            "migration": None, "replacements": [],
        }

    def prepare(self) -> None:
        """The database where the previous release left it: migrated by its own migrations."""
        self.previous.migrate(self.url)
        self.record["schema"]["previous_head"] = schema_revision(self.mysql)

    def steps(self, storm) -> dict:
        """The steps by name, played by ``storm`` (a ``harness.chaos.storm.Storm``) on its fleet."""
        self.storm, self.fleet = storm, storm.fleet
        return {"migrate_online": self.migrate_online, "upgrade_worker": self.upgrade_worker,
                "roll_back_worker": self.roll_back_worker}

    # -- the steps ----------------------------------------------------------------------
    async def migrate_online(self) -> None:
        entry: dict = {"started_at": time.time(), "from": schema_revision(self.mysql), "error": None,
                       "workers": {i.id: i.worker.version for i in list(self.fleet.live.values())}}
        self.record["migration"] = entry
        committed = await self._committed()
        clock = time.monotonic()
        try:
            await asyncio.to_thread(migrate_to_current, self.url)
        except Exception as exc:             # the checker fails the run on it (upgrade_incomplete)
            entry["error"] = repr(exc)[:2000]
        entry["seconds"] = round(time.monotonic() - clock, 3)
        entry["ended_at"] = time.time()
        entry["to"] = schema_revision(self.mysql)
        moved = sum((await self._committed()).values()) - sum(committed.values())
        entry["committed_meanwhile"] = moved
        self.storm.log("migrate_online", detail=f"{entry['from']} -> {entry['to']} in {entry['seconds']:.2f}s while "
                                                f"{len(entry['workers'])} workers wrote ({moved} records committed "
                                                "meanwhile)" + (f"; FAILED: {entry['error']}" if entry["error"] else ""))

    async def upgrade_worker(self) -> None:
        await self._replace("upgrade", self.previous, None)

    async def roll_back_worker(self) -> None:
        await self._replace("roll_back", None, self.previous)

    # -- one replacement --------------------------------------------------------------------
    async def _replace(self, kind: str, old: Release | None, new: Release | None) -> None:
        storm, fleet = self.storm, self.fleet
        storm.paused = True                  # no kill while it runs: what it measures is its own
        slot = None
        entry: dict = {"kind": kind, "from_version": _version(old), "to_version": _version(new), "error": None}
        self.record["replacements"].append(entry)
        try:
            while storm.busy:                # a kill or a start in progress ends first
                await asyncio.sleep(0.2)
            slot = next((s for s in sorted(fleet.live) if fleet.release_of(s) is old), None)
            if slot is None:
                raise LookupError(f"no live worker runs {_version(old)}")
            storm.busy.add(slot)
            entry["slot"] = slot
            async with GroupProbe(self.kafka, self.group, self.topic, self.partitions) as probe:
                # As a rollout that may take one worker down at a time: all of them ready, the group stable;
                # and caught up with its input, so that what a kill just before replays is not counted here.
                await self._no_ghosts()
                await asyncio.to_thread(self._all_ready)
                await probe.settled(len(fleet.live))
                await probe.caught_up()
                await asyncio.to_thread(fleet.scrape_now)
                before = _replayed(fleet)
                entry["committed_at_sigterm"] = await probe.committed()
                # From the SIGTERM until the group consumes again the input flows, past the next steps'
                # gates if it must; not before (the waits above), so the records the later steps need
                # are not spent on them.
                storm.producer.unheld.set()
                entry["sigterm_at"] = time.time()
                stopped = await asyncio.to_thread(fleet.stop, slot)
                entry["committed_at_exit"] = await probe.committed()
                entry.update(stopped=stopped.id, stopped_version=stopped.worker.version,
                             exited_at=stopped.ended_at, returncode=stopped.returncode)
                fleet.runs(slot, new)
                started = await storm.start_worker(slot)
                entry.update(started=started.id, started_version=started.worker.version,
                             started_at=started.started_at, joining_at=time.time())
                entry["stable_at"], entry["committed_when_stable"] = await probe.settled(len(fleet.live))
                entry["consuming_at"], entry["committed_when_consuming"] = await probe.consuming(
                    started, entry["committed_when_stable"], lambda: storm.producer.done)
                entry["input_flowing"] = not storm.producer.done
            await asyncio.to_thread(fleet.scrape_now)
            entry["replayed_counter"] = _replayed(fleet) - before
            storm.log(f"{kind}_worker", started.id, detail=_summary(entry))
        except Exception as exc:             # the checker fails the run on it (upgrade_incomplete)
            entry["error"] = repr(exc)[:2000]
            storm.log(f"{kind}_worker_failed", detail=entry["error"])
            if slot is not None and slot not in fleet.live:    # the run goes on with every slot filled
                await storm.start_worker(slot)
        finally:
            if slot is not None:
                storm.busy.discard(slot)
            storm.producer.unheld.clear()
            storm.paused = False

    async def _committed(self) -> dict[int, int]:
        return await kafka_ops.committed_offsets(self.kafka, self.group, self.topic, self.partitions)

    def _all_ready(self) -> None:
        """Every live worker answers ``/readyz`` (a bound, not a wait)."""
        def ready(incarnation) -> bool:
            try:
                url = f"http://127.0.0.1:{incarnation.worker.web_port}/readyz"
                return urllib.request.urlopen(url, timeout=5).status == 200
            except OSError:
                return False
        deadline = time.monotonic() + SETTLE_WITHIN
        while not all(ready(i) for i in list(self.fleet.live.values())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every worker ready within {SETTLE_WITHIN:g}s")
            time.sleep(POLL)

    async def _no_ghosts(self) -> None:
        session = float(self.fleet.env.get("BROKER_SESSION_TIMEOUT_SECONDS") or DEFAULT_SESSION_SECONDS)
        killed = [i.ended_at for i in self.fleet.history if i.killed_by_test and i.ended_at]
        if killed:
            await asyncio.sleep(max(0.0, max(killed) + session + 1.0 - time.time()))


class GroupProbe:
    """The group's state, committed offsets and the topic's ends, read over one admin client and one
    consumer of the run's own for as long as a replacement is watched."""

    def __init__(self, kafka, group: str, topic: str, partitions: int) -> None:
        self.options = connection_of(kafka).client_options()
        self.group, self.topic, self.partitions = group, topic, partitions

    async def __aenter__(self) -> GroupProbe:
        self.admin = AIOKafkaAdminClient(request_timeout_ms=10_000, **self.options)
        self.consumer = AIOKafkaConsumer(request_timeout_ms=10_000, **self.options)
        await self.admin.start()
        await self.consumer.start()
        self.offsets = kafka_ops.CommittedOffsets(self.admin, self.group, self.topic)
        return self

    async def __aexit__(self, *_) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def state(self) -> tuple[str, int]:
        """As the broker sees it ("Stable", "PreparingRebalance", ...) and the member count."""
        [described] = await self.admin.describe_consumer_groups([self.group])
        _, _, state, _, _, members = described.groups[0][:6]
        return state, len(members)

    async def committed(self) -> dict[int, int]:
        found = await self.offsets.read()
        return {p: found.get(p, 0) for p in range(self.partitions)}

    async def ends(self) -> dict[int, int]:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        return {tp.partition: end for tp, end in (await self.consumer.end_offsets(tps)).items()}

    async def settled(self, members: int) -> tuple[float, dict[int, int]]:
        """When the group is Stable with ``members`` members (a bound, not a wait), and its offsets then."""
        deadline = time.monotonic() + SETTLE_WITHIN
        last = None
        while time.monotonic() < deadline:
            try:
                last = await self.state()
            except Exception as exc:         # the coordinator moving: ask again
                last = repr(exc)
            if last == ("Stable", members):
                return time.time(), await self.committed()
            await asyncio.sleep(POLL)
        raise TimeoutError(f"the group not Stable with {members} members within {SETTLE_WITHIN:g}s (last: {last})")

    async def caught_up(self) -> None:
        """Until the group has committed every record on the topic now (a bound, not a wait)."""
        ends, deadline = await self.ends(), time.monotonic() + SETTLE_WITHIN
        while any(offset < ends[p] for p, offset in (await self.committed()).items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the group not caught up with its input within {SETTLE_WITHIN:g}s")
            await asyncio.sleep(POLL)

    async def consuming(self, started, stable: dict[int, int], input_done) -> tuple[float, dict[int, int]]:
        """When every partition with records past ``stable`` has had its committed offset move past it,
        and the ``started`` worker has finished a batch (or the input has ended: ``input_done()``, and
        with it what the new worker could be seen doing; the checker fails the run on that)."""
        deadline = time.monotonic() + SETTLE_WITHIN
        behind: list[int] = []
        while time.monotonic() < deadline:
            committed, ends = await self.committed(), await self.ends()
            behind = [p for p in range(self.partitions) if ends[p] > stable[p] and committed[p] <= stable[p]]
            if not behind and ((started.metrics.get("order_batches_total") or 0) > 0 or input_done()):
                return time.time(), committed
            if not started.worker.alive:
                raise RuntimeError(f"worker {started.id} exited ({started.worker.proc.returncode}); "
                                   f"log {started.worker.log_path}")
            await asyncio.sleep(POLL)
        raise TimeoutError(f"not consumed again within {SETTLE_WITHIN:g}s: partitions {behind} still at their "
                           f"offsets when the group was stable; {started.id} finished "
                           f"{started.metrics.get('order_batches_total') or 0:g} batches")


def _version(release: Release | None) -> str:
    return release.version if release is not None else "current"


def _replayed(fleet: Fleet) -> float:
    return fleet.totals().get("order_events_replayed_total", 0.0)


def _summary(entry: dict) -> str:
    at = entry["sigterm_at"]
    return (f"{entry['stopped']} ({entry['stopped_version']}) SIGTERM, exit {entry['returncode']} after "
            f"{entry['exited_at'] - at:.1f}s; {entry['started']} ({entry['started_version']}) in its slot; the group "
            f"Stable {entry['stable_at'] - at:.1f}s and every partition consumed {entry['consuming_at'] - at:.1f}s "
            f"after the SIGTERM; the replay counter +{entry['replayed_counter']:g}")

