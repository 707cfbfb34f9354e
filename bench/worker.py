"""(c) the real pipeline: one ``faust -A app worker`` process over a pre-filled topic.

Clock: starts when the worker's ``/health`` first answers (its web server is
up, so the app has started; the consumer group join and partition assignment
still fall inside the clock) and stops when the group's committed offsets
equal the topic's end offsets on every partition. Both are polled every
100 ms. Faust commits every ``BROKER_COMMIT_INTERVAL_SECONDS`` (2.8 s by
default), so the stop is late by up to one interval; the steady-state rate
(first commit seen -> the last commit seen below 95 % of the records, over the
records between them: :func:`steady_window`) leaves out the startup and the
tail (partial batches waiting to fill, and the commits that wait for the commit
timer: ``broker_commit_every`` commits only while records arrive) and is
reported next to it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.ops import CommittedOffsets, admin
from bench.metrics import scrape

POLL_SECONDS = 0.1
STEADY_SHARE = 0.95     # the steady window ends at the last commit below this share of the records


@dataclass
class WorkerRun:
    events: int
    seconds: float | None = None            # /health answered -> all offsets committed
    startup_seconds: float | None = None    # spawned -> /health answered
    first_commit_seconds: float | None = None  # /health answered -> first committed offset seen
    steady_events_per_second: float | None = None
    peak_rss_mb: float | None = None
    # The worker process's CPU (user + system, every thread) between the first and the last
    # commit seen, and the events committed in between: its cost per event, whatever the load.
    steady_cpu_seconds: float | None = None
    steady_events: int | None = None
    metrics: dict = field(default_factory=dict)
    # Each commit seen: (seconds since /health answered, records committed).
    commits: list = field(default_factory=list)
    error: str | None = None
    log: str = ""

    @property
    def events_per_second(self) -> float | None:
        return self.events / self.seconds if self.seconds else None

    @property
    def cpu_us_per_event(self) -> float | None:
        if self.steady_cpu_seconds is None or not self.steady_events:
            return None
        return self.steady_cpu_seconds / self.steady_events * 1e6


def worker_command(profile_to: Path | None, app_module: str = "app") -> list[str]:
    # Faust spells the level "warn" (it refuses "warning").
    command = ["-A", app_module, "worker", "-l", "warn"]
    if profile_to is None:
        return [str(Path(sys.executable).with_name("faust")), *command]
    # Show Faust's, mode's and aiokafka's frames too: most of a worker's time is theirs.
    return [sys.executable, "-m", "pyinstrument", "-r", "text", "-o", str(profile_to),
            "--show-regex", r".*/(faust|mode|aiokafka)/.*", "-m", "faust", *command]


async def run_worker(env: dict[str, str], *, root: Path, log_path: Path, bootstrap: KafkaConnection | str, group: str, topic: str,
                     ends: dict[int, int], timeout: float, stall: float,
                     profile_to: Path | None = None, app_module: str = "app") -> WorkerRun:
    run = WorkerRun(events=sum(ends.values()), log=str(log_path.relative_to(root)))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{env['WEB_PORT']}"
    with open(log_path, "ab") as log:
        spawned = time.perf_counter()
        proc = subprocess.Popen(worker_command(profile_to, app_module), cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                try:
                    await _measure(run, proc, http, base, spawned, bootstrap, group, topic, ends, timeout, stall)
                except (TimeoutError, RuntimeError) as exc:
                    run.error = str(exc)      # reported, not raised: the other runs still count
                run.metrics = await scrape(http, f"{base}/metrics")
            run.peak_rss_mb = peak_rss_mb(proc.pid)
        finally:
            stop(proc)
    return run


async def _measure(run: WorkerRun, proc: subprocess.Popen, http: aiohttp.ClientSession, base: str,
                   spawned: float, bootstrap: KafkaConnection | str, group: str, topic: str, ends: dict[int, int],
                   timeout: float, stall: float) -> None:
    healthy = await _wait_health(proc, http, f"{base}/health", spawned, timeout)
    run.startup_seconds = healthy - spawned
    async with admin(bootstrap) as client:
        committed = CommittedOffsets(client, group, topic)
        seen: list[tuple[float, int, float | None]] = []     # (time, records committed, worker CPU seconds)
        progress_at, progress = healthy, 0
        while True:
            now = time.perf_counter()
            done = sum(min(offset, ends[p]) for p, offset in (await committed.read()).items() if offset > 0)
            if done > progress:
                progress_at, progress = now, done
                run.commits.append((round(now - healthy, 3), done))
                if not seen:
                    run.first_commit_seconds = now - healthy
                seen.append((now, done, cpu_seconds(proc.pid)))
            if done >= run.events:
                break
            _check(proc, now, spawned, progress_at, timeout, stall, f"committing {done} of {run.events} records")
            await asyncio.sleep(POLL_SECONDS)
    run.seconds = seen[-1][0] - healthy
    window = steady_window(seen, run.events)
    if window is not None:
        first, end = window
        run.steady_events_per_second = (end[1] - first[1]) / (end[0] - first[0])
        if first[2] is not None and end[2] is not None:
            run.steady_cpu_seconds, run.steady_events = end[2] - first[2], end[1] - first[1]


def steady_window(commits: list[tuple], events: int, share: float = STEADY_SHARE) -> tuple[tuple, tuple] | None:
    """The first and last of ``commits`` (``(time, records committed, ...)``, in the order seen)
    that bound the steady window, or None when there is no window (one commit).

    It starts at the first commit (the group join and the first fetch are behind it) and ends at
    the last commit seen below ``share`` of ``events``. What comes after is the tail: the last
    records come from the partitions that are left, in partial batches that wait
    ``BATCH_WITHIN_SECONDS``, and Faust commits by count (``broker_commit_every``) only while
    records keep arriving, so once the fetches run dry the next commit waits for the commit timer
    (2.8 s) with the work done. The first commit *at or past* the share, the end this window used
    to have, is that timer's commit whenever the last commit by count fell just below the share:
    run after run of the same worker came out at 19,4xx or 25,5xx events/s by that alone (a
    2.6 s wait in a 10 s window). If no commit falls between the first and the share (a run too
    short for commits by count), the window ends at the first commit at or past it, else the last."""
    if len(commits) < 2:
        return None
    first = commits[0]
    below = [c for c in commits[1:] if c[1] < share * events and c[0] > first[0]]
    if below:
        return first, below[-1]
    end = next((c for c in commits[1:] if c[1] >= share * events and c[0] > first[0]), commits[-1])
    return (first, end) if end[0] > first[0] else None


async def _wait_health(proc: subprocess.Popen, http: aiohttp.ClientSession, url: str, spawned: float,
                       timeout: float) -> float:
    while True:
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                if resp.status == 200:
                    return time.perf_counter()
        except (TimeoutError, aiohttp.ClientError):
            pass
        _check(proc, time.perf_counter(), spawned, spawned, timeout, timeout, "waiting for /health")
        await asyncio.sleep(POLL_SECONDS)


def _check(proc: subprocess.Popen, now: float, spawned: float, progress_at: float, timeout: float, stall: float,
           doing: str) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"worker exited with {proc.returncode} while {doing}")
    if now - spawned > timeout:
        raise TimeoutError(f"timeout: {timeout:.0f}s after the worker started, still {doing}")
    if now - progress_at > stall:
        raise TimeoutError(f"stalled: no committed offset moved for {stall:.0f}s, still {doing}")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (all its threads), in seconds; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: the fields counted from the last ")".
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def stop(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM (Faust finishes and commits the batch in flight), SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
