"""The run's worker processes: started, SIGKILLed, stopped, restarted, watched and scraped.

A *slot* is a place for one worker (``w1`` .. ``w4``); each process started in it is an
*incarnation* with an id of its own (``w2.3``: the third process of slot 2), which is
its ``WORKER_ID`` and names it in ``t_idem.owner``. Every exit is recorded with who
caused it: the test (SIGKILL, SIGTERM) or nobody the test knows of. An exit the test did
not cause is reported with the end of the worker's log, and the slot is started again,
as a supervisor would (``restart: on-failure``), so the run goes on and says so.

Each live worker's ``/metrics`` is read every second; the last reading of every process
is kept, so what a worker counted before it was killed is not lost with it.

A slot runs the current code unless it is given an earlier release (``runs(slot, release)``,
``harness.releases``): every process started in it from then on runs that release, a restart
after a kill too, as a deployment's pods run the image they were given.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness.releases import Release
from harness.services import ROOT, Worker, free_port

# The counters the manifest sums over processes: name -> the label its samples are keyed by.
COUNTERS = {
    "order_events_replayed_total": None,
    "order_idem_claims_total": "result",
    "order_dead_letters_total": "reason",
    "order_events_total": "outcome",
    "order_events_malformed_total": "reason",
    "order_compensations_total": "result",
    "order_effect_calls_total": "effect,result",
    "order_kafka_rebalances_total": None,
    "order_infra_wait_seconds_total": None,
    "order_lease_waits_total": None,
    "order_record_retries_total": "reason",
    "order_batches_total": None,
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Incarnation:
    id: str
    slot: str
    worker: Worker
    started_at: float
    ended_at: float | None = None
    returncode: int | None = None
    killed_by_test: bool = False
    stopped_by_test: bool = False
    metrics: dict = field(default_factory=dict)        # the last reading of /metrics
    scraped_at: float | None = None

    def entry(self) -> dict:
        return {"id": self.id, "version": self.worker.version, "pid": self.worker.proc.pid,
                "started_at": self.started_at, "ended_at": self.ended_at,
                "returncode": self.returncode, "killed_by_test": self.killed_by_test,
                "stopped_by_test": self.stopped_by_test, "log": str(self.worker.log_path.relative_to(ROOT)),
                "scraped_at": self.scraped_at}


class Fleet:
    def __init__(self, env: dict[str, str], logs: Path, say=print) -> None:
        self.env = env
        self.logs = logs
        self.say = say
        self.live: dict[str, Incarnation] = {}
        self.history: list[Incarnation] = []
        self.unexpected: list[Incarnation] = []
        self._count: dict[str, int] = defaultdict(int)
        self._release: dict[str, Release | None] = {}       # slot -> the release it runs (None: current)
        self._lock = threading.RLock()
        self._scraping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life and death ------------------------------------------------------------
    def runs(self, slot: str, release: Release | None) -> None:
        """The slot's next processes run ``release`` (None: the current code)."""
        with self._lock:
            self._release[slot] = release

    def release_of(self, slot: str) -> Release | None:
        return self._release.get(slot)

    def start(self, slot: str) -> Incarnation:
        with self._lock:
            self._count[slot] += 1
            ident = f"{slot}.{self._count[slot]}"
            worker = Worker({**self.env, "WORKER_ID": ident, "WEB_PORT": str(free_port())}, ident,
                            release=self._release.get(slot))
            worker.log_path = self.logs / f"{ident}.log"
            worker.start()
            incarnation = Incarnation(ident, slot, worker, time.time())
            self.live[slot] = incarnation
            self.history.append(incarnation)
            return incarnation

    def kill(self, slot: str) -> Incarnation:
        """SIGKILL the slot's worker (the test's own kill)."""
        with self._lock:
            incarnation = self.live.pop(slot)
            incarnation.killed_by_test = True
            incarnation.worker.kill(signal.SIGKILL)
        self._ended(incarnation, incarnation.worker.wait_exit(30))
        return incarnation

    def stop(self, slot: str, timeout: float = 90.0) -> Incarnation:
        """SIGTERM the slot's worker and wait for it (the test's own stop: a scale-down)."""
        with self._lock:
            incarnation = self.live.pop(slot)
            incarnation.stopped_by_test = True
        self._scrape_one(incarnation)          # what it counted until now, in case the stop hangs
        incarnation.worker.proc.send_signal(signal.SIGTERM)
        try:
            code = incarnation.worker.wait_exit(timeout)
        except Exception:
            incarnation.worker.kill(signal.SIGKILL)
            code = incarnation.worker.wait_exit(30)
            self.say(f"worker {incarnation.id} ignored SIGTERM for {timeout:.0f}s and was SIGKILLed; "
                     f"log {incarnation.worker.log_path.relative_to(ROOT)}")
        self._ended(incarnation, code)
        return incarnation

    def stop_all(self) -> None:
        for slot in list(self.live):
            self.stop(slot)

    def kill_all(self) -> None:
        """The end of a run that failed: nothing may be left running."""
        for incarnation in self.history:
            if incarnation.worker.alive:
                incarnation.worker.kill(signal.SIGKILL)
                incarnation.worker.wait_exit(30)
                if incarnation.returncode is None:
                    incarnation.killed_by_test = True
                    self._ended(incarnation, incarnation.worker.proc.returncode)

    def _ended(self, incarnation: Incarnation, code: int) -> None:
        incarnation.returncode = code
        incarnation.ended_at = time.time()

    def watch(self, restart: bool = True) -> list[Incarnation]:
        """Exits nobody asked for since the last look; each slot is started again (unless the
        caller does that itself)."""
        found = []
        with self._lock:
            for slot, incarnation in list(self.live.items()):
                if incarnation.worker.alive:
                    continue
                self._ended(incarnation, incarnation.worker.proc.returncode)
                del self.live[slot]
                self.unexpected.append(incarnation)
                found.append(incarnation)
                tail = "\n    ".join(incarnation.worker.logs().splitlines()[-25:])
                self.say(f"UNEXPECTED EXIT: worker {incarnation.id} exited with {incarnation.returncode}; log "
                         f"{incarnation.worker.log_path.relative_to(ROOT)}; its end:\n    {tail}")
                if restart:
                    self.start(slot)
        return found

    # -- metrics -------------------------------------------------------------------
    def scrape_every(self, seconds: float = 1.0) -> None:
        def loop():
            while not self._scraping.wait(seconds):
                for incarnation in list(self.live.values()):
                    self._scrape_one(incarnation)
        self._thread = threading.Thread(target=loop, name="chaos-scraper", daemon=True)
        self._thread.start()

    def scrape_now(self) -> None:
        for incarnation in list(self.live.values()):
            self._scrape_one(incarnation)

    def stop_scraping(self) -> None:
        self._scraping.set()
        if self._thread is not None:
            self._thread.join(10)

    def _scrape_one(self, incarnation: Incarnation) -> None:
        try:
            url = f"http://127.0.0.1:{incarnation.worker.web_port}/metrics"
            text = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            return                  # not up yet, or going down: the last reading stands
        incarnation.metrics = parse(text)
        incarnation.scraped_at = time.time()

    def totals(self) -> dict:
        """The last reading of every process, summed."""
        return summed(i.metrics for i in self.history)


def parse(text: str) -> dict:
    """The counters of COUNTERS from a Prometheus text page: a number, or a dict by label."""
    found: dict = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None or match.group(1) not in COUNTERS:
            continue
        name, labels, value = match.groups()
        keyed_by = COUNTERS[name]
        if keyed_by is None:
            found[name] = float(value)
            continue
        values = dict(LABEL.findall(labels or ""))
        key = ":".join(values.get(label, "") for label in keyed_by.split(","))
        found.setdefault(name, {})[key] = float(value)
    return found


def summed(readings) -> dict:
    total: dict = {}
    for reading in readings:
        for name, value in reading.items():
            if isinstance(value, dict):
                into = total.setdefault(name, {})
                for key, v in value.items():
                    into[key] = into.get(key, 0.0) + v
            else:
                total[name] = total.get(name, 0.0) + value
    return total
