"""The one place that replaces internals of Faust, mode and aiokafka.

The worker relies on a few private methods of faust-streaming, mode-streaming and aiokafka
being replaced by ours. Each replacement is listed in :data:`REPLACEMENTS`: what it replaces
(``target``), by what (``by``, a function that stays in the module whose subject it is), which
upstream code it mirrors, why, and which upstream fix would let us drop it. Nothing else in
``app/`` assigns to an attribute of Faust, mode or aiokafka (``tests/unit/test_upstream.py``
scans the sources for it).

:func:`install`, called once by the composition root (``app.faust_app.create_app``), applies
every class- and module-level replacement. It first checks that the installed versions are
those each replacement was read against (:data:`CHECKED`) and that every target is there;
otherwise the process refuses to start (exit 78, one line naming the package, the installed
and the checked version). A replacement done on one object at run time (a wrap of one
coordinator's method) goes through :func:`replace_on_instance`, and is listed in the table too.

Moving to a new version of one of them: read each entry's ``mirrors`` in the new version's
code, revise the replacement where the upstream code changed (or drop it where the upstream fix
came), then update :data:`CHECKED` and the pins in ``pyproject.toml`` together.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any

from app import exits

log = logging.getLogger(__name__)

# The versions every replacement below was read against; pyproject.toml pins the same ones.
CHECKED: dict[str, str] = {
    "faust-streaming": "0.15.3",
    "mode-streaming": "0.7.1",
    "aiokafka": "0.14.0",
}

# The distribution each importable top-level package comes from.
_DISTRIBUTIONS = {"faust": "faust-streaming", "mode": "mode-streaming", "aiokafka": "aiokafka"}


@dataclass(frozen=True)
class Replacement:
    """One upstream attribute we replace.

    ``target`` and ``by`` are dotted paths (module, then attributes). With ``wraps``, ``by`` is
    called with the upstream original and returns the replacement. With ``per_instance``, the
    target is replaced on single objects at run time, by the code ``by`` names, through
    :func:`replace_on_instance`; :func:`install` only checks that the target exists."""

    target: str
    by: str
    mirrors: str
    why: str
    retire: str
    wraps: bool = False
    per_instance: bool = False
    needs: tuple[str, ...] = ()          # other attributes of the target's owner the replacement relies on

    @property
    def package(self) -> str:
        return _DISTRIBUTIONS[self.target.split(".", 1)[0]]

    @property
    def attribute(self) -> str:
        return self.target.rsplit(".", 1)[1]


REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(
        target="aiokafka.consumer.fetcher.MemoryRecords",
        by="app.adapters.kafka.records.GuardedRecords",
        mirrors="aiokafka: aiokafka/record/memory_records.py MemoryRecords (the C one, "
                "aiokafka/record/_crecords/memory_records.pyx), as used by aiokafka/consumer/fetcher.py "
                "Fetcher._proc_fetch_request",
        why="a record batch that decompresses past MAX_BATCH_BYTES, or that aiokafka cannot parse (header keys "
            "that are not UTF-8), must become placeholder records (dead letters), not stop the fetcher",
        retire="aiokafka: a max_decompressed_bytes option on DefaultRecordBatch raising a typed error with the "
               "batch's offsets, header keys decoded with surrogateescape (or as bytes), and a per-batch "
               "error handler in the fetcher",
    ),
    Replacement(
        target="faust.transport.drivers.aiokafka.AIOKafkaConsumerThread._create_worker_consumer",
        by="app.adapters.kafka.consumer._with_isolation",
        wraps=True,
        mirrors="faust-streaming: faust/transport/drivers/aiokafka.py AIOKafkaConsumerThread._create_worker_consumer",
        why="Faust's worker consumer reads read_uncommitted unless Faust's own exactly-once mode is on: records "
            "of aborted transactions would be acted on; KAFKA_ISOLATION_LEVEL (read_committed) is set instead",
        retire="faust-streaming: a consumer_isolation_level setting",
    ),
    Replacement(
        target="aiokafka.consumer.consumer.AIOKafkaConsumer._isolation_level",
        by="app.adapters.kafka.consumer._with_isolation",
        per_instance=True,
        mirrors="aiokafka: aiokafka/consumer/consumer.py AIOKafkaConsumer.__init__ (isolation_level), read "
                "when the consumer starts and builds its fetcher",
        why="the isolation level of the consumer Faust just made, before it starts (see "
            "AIOKafkaConsumerThread._create_worker_consumer above); its subscription state is read to tell its "
            "fetches from other consumers' (FetchResult.getall below)",
        retire="faust-streaming: a consumer_isolation_level setting",
        needs=("_subscription",),
    ),
    Replacement(
        target="aiokafka.consumer.fetcher.FetchResult.getall",
        by="app.adapters.kafka.consumer._watching_holes",
        wraps=True,
        mirrors="aiokafka: aiokafka/consumer/fetcher.py FetchResult.getall",
        why="the offsets a fetch skipped (transaction markers, aborted or compacted records) are known exactly "
            "only there; Faust guesses them later as gaps, and misses some. Only the worker's group consumer's "
            "fetches are watched (app.adapters.kafka.consumer.watch): another consumer of the process reads the "
            "same partitions at other positions",
        retire="faust-streaming: commit offsets computed from the fetch position (as Kafka's Java consumer "
               "commits position()), not from acknowledged offsets plus guessed gaps",
        needs=("_assignment", "_topic_partition"),
    ),
    Replacement(
        target="faust.transport.consumer.Consumer._new_offset",
        by="app.adapters.kafka.consumer._new_offset",
        mirrors="faust-streaming: faust/transport/consumer.py Consumer._new_offset",
        why="commit through acknowledged offsets and known holes only: past trailing transaction markers (no "
            "lag of 1 for ever), not stuck after a hole right after offset 0, never over an unacknowledged "
            "offset (faust-streaming#606)",
        retire="faust-streaming: commit offsets computed from the fetch position (faust-streaming#606 fixed)",
        needs=("_acked", "_acked_index", "_committed_offset", "_gap"),
    ),
    Replacement(
        target="faust.transport.consumer.Consumer.on_partitions_revoked",
        by="app.adapters.kafka.consumer._forgetting_holes",
        wraps=True,
        mirrors="faust-streaming: faust/transport/consumer.py Consumer.on_partitions_revoked",
        why="Faust forgets the revoked partitions' acknowledged offsets before the app commits: work acknowledged "
            "since the last commit tick ran again after every rebalance; it is committed first here",
        retire="faust-streaming: a commit before the revoked partitions' bookkeeping is dropped",
        needs=("commit",),
    ),
    Replacement(
        target="faust.transport.consumer.Consumer._drain_messages",
        by="app.adapters.kafka.drain._drain_messages",
        mirrors="faust-streaming: faust/transport/consumer.py Consumer._drain_messages and Consumer.getmany",
        why="topics with a Feed take whole fetches as batches instead of Faust's per-record path (four futures, "
            "the conductor, a queue and an ack per record); other topics and an app without feeds run "
            "Faust's own loop",
        retire="faust-streaming: a batch-mode channel (a fetch's records handed to one subscriber at once, bulk "
               "track and ack on the consumer), and wait_first in the drain loop only when a delivery cannot "
               "complete at once",
        needs=("_wait_next_records", "perform_seek", "_to_message", "ack", "_add_gap"),
    ),
    Replacement(
        target="faust.transport.drivers.aiokafka.Producer._settings_extra",
        by="app.adapters.kafka.connection.idempotent_producer_settings",
        wraps=True,
        mirrors="faust-streaming: faust/transport/drivers/aiokafka.py Producer._settings_extra",
        why="every producer of the project is idempotent with acks=all; Faust's is so only in its own "
            "exactly-once mode, and a retry through a leader change must never write twice",
        retire="faust-streaming: a producer_enable_idempotence setting (or idempotence on by default, as in "
               "Kafka's Java producer since 3.0)",
    ),
    Replacement(
        target="faust.worker.Worker.install_signal_handlers",
        by="app.exits.arming_the_stop_bound",
        wraps=True,
        mirrors="mode-streaming: mode/worker.py Worker.install_signal_handlers (Faust's Worker inherits it)",
        why="the bound on a stop after SIGTERM (STOP_TIMEOUT_SECONDS) is armed from a SIGTERM handler that wraps "
            "the event loop's, put in place right after the worker installs its own",
        retire="mode-streaming: a timeout on ServiceThread.stop's join of the thread, and a bound on the "
               "worker's stop (its consumer's and producer's stops wait on a broker that may never answer)",
    ),
    Replacement(
        target="aiokafka.consumer.group_coordinator.GroupCoordinator._do_heartbeat",
        by="app.adapters.kafka.liveness.ConsumerProbe._watch",
        per_instance=True,
        mirrors="aiokafka: aiokafka/consumer/group_coordinator.py GroupCoordinator._do_heartbeat, called by "
                "_heartbeat_routine",
        why="the time of the last successful heartbeat is a local variable of _heartbeat_routine; the watchdog "
            "needs it (wrapped on the worker's coordinator only)",
        retire="aiokafka: the last successful heartbeat's time kept on the coordinator (as the Java consumer's "
               "last-heartbeat-seconds-ago metric)",
    ),
    Replacement(
        target="aiokafka.consumer.group_coordinator.GroupCoordinator._do_rejoin_group",
        by="app.adapters.kafka.liveness.ConsumerProbe._watch",
        per_instance=True,
        mirrors="aiokafka: aiokafka/consumer/group_coordinator.py GroupCoordinator._do_rejoin_group",
        why="since when a join has been in flight, and a join that succeeded (a heartbeat of its own), for the "
            "watchdog (wrapped on the worker's coordinator only)",
        retire="aiokafka: the group's state and the start of a join in flight exposed on the coordinator",
    ),
)

_ORIGINALS: dict[str, Any] = {}      # target -> the upstream attribute it replaced, once installed


def install() -> None:
    """Apply every class- and module-level replacement (a second call does nothing); refuse to
    start (exit 78) on versions other than :data:`CHECKED` or with a target gone."""
    if _ORIGINALS:
        return
    problem = _version_problem() or _target_problem()
    if problem:
        exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {problem}")
        return
    planned = []
    for entry in REPLACEMENTS:
        if entry.per_instance:
            continue
        owner = _owner(entry.target)
        original = getattr(owner, entry.attribute)
        new = _load(entry.by)
        planned.append((entry, owner, original, new(original) if entry.wraps else new))
    for entry, owner, original, new in planned:
        setattr(owner, entry.attribute, new)
        _ORIGINALS[entry.target] = original
    log.debug("replaced %d internals of %s", len(planned), ", ".join(f"{p} {v}" for p, v in CHECKED.items()))


def original(target: str) -> Any:
    """The upstream attribute ``target`` had before :func:`install` replaced it."""
    return _ORIGINALS[target]


def replace_on_instance(obj: object, name: str, value: Any) -> None:
    """Replace ``name`` on ``obj`` alone; the pair must be a ``per_instance`` entry of
    :data:`REPLACEMENTS`, and the attribute must exist."""
    if not any(isinstance(obj, _owner(entry.target)) for entry in _PER_INSTANCE.get(name, ())):
        raise RuntimeError(f"{type(obj).__qualname__}.{name} is no per-instance entry of "
                           "app.adapters.kafka.upstream.REPLACEMENTS: list it there first")
    if not hasattr(obj, name):
        raise RuntimeError(f"{type(obj).__qualname__}.{name} is gone: the replacement listed in "
                           "app.adapters.kafka.upstream.REPLACEMENTS must be revised for this version")
    setattr(obj, name, value)


_PER_INSTANCE: dict[str, list[Replacement]] = {}
for _entry in REPLACEMENTS:
    if _entry.per_instance:
        _PER_INSTANCE.setdefault(_entry.attribute, []).append(_entry)


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_problem() -> str | None:
    for package, checked in CHECKED.items():
        found = installed_version(package)
        if found is None:
            return (f"{package} is not installed, and the replacements of its internals were checked against "
                    f"{package} {checked}: install {package}=={checked}")
        if found != checked:
            return (f"{package} {found} is installed, but the replacements of its internals were checked against "
                    f"{package} {checked}: check each replacement in app/adapters/kafka/upstream.py against "
                    f"{package} {found}'s code, then update CHECKED there and the pin in pyproject.toml "
                    f"(or install {package}=={checked})")
    return None


def _target_problem() -> str | None:
    for entry in REPLACEMENTS:
        owner_path, attribute = entry.target.rsplit(".", 1)
        try:
            owner = _owner(entry.target)
        except (ImportError, AttributeError):
            owner = None
        missing = [name for name in (attribute, *entry.needs) if owner is None or not _has(owner, name)]
        if missing:
            where = owner_path if owner is None else f"{owner_path}.{missing[0]}"
            return (f"{where} does not exist in {entry.package} {installed_version(entry.package)}, and {entry.by} "
                    f"replaces or relies on it: revise that replacement (app/adapters/kafka/upstream.py) for this "
                    "version")
    return None


def _has(owner: Any, name: str) -> bool:
    """``owner`` has ``name``: as an attribute, or (a class) as one its ``__init__`` sets."""
    if hasattr(owner, name):
        return True
    init = getattr(owner, "__init__", None) if isinstance(owner, type) else None
    return name in getattr(getattr(init, "__code__", None), "co_names", ())


@functools.cache
def _owner(target: str) -> Any:
    """The module or class that holds ``target``'s attribute."""
    return _load(target.rsplit(".", 1)[0])


def _load(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for name in parts[n:]:
            found = getattr(found, name)
        return found
    raise ImportError(f"nothing to import in {path}")


__all__ = ["CHECKED", "REPLACEMENTS", "Replacement", "install", "original", "replace_on_instance"]
