"""Is this worker still part of its consumer group and moving? The watchdog's decision, pure.

What it watches (read from the consumer by ``app.adapters.kafka.liveness`` once a tick):

* **membership**: the group gave this worker an assignment (possibly of no partitions: more
  workers than partitions is fine) -- aiokafka keeps none while it is (re)joining;
* **heartbeats**: when a heartbeat (or a join) last succeeded;
* **fetching**: while the worker knows of records it has not fetched (lag), the fetch position
  moves, or a batch is being worked on (a batch has bounds of its own: its deadline, the
  database's retry budget, each of which stops the worker when it runs out).

Any of them failing for ``stall_seconds`` (default: ``BROKER_SESSION_TIMEOUT_SECONDS``; the
broker has given the partitions to another member by then anyway) makes the worker unhealthy:
``/readyz`` answers 503 with the reason, and the watchdog forces a rejoin of the group. If it
is still unhealthy ``rejoin_grace_seconds`` later (default: a third of the session timeout: a
rejoin that can reach the coordinator is a join in flight within a second or two), the worker
exits 70 without committing and its supervisor starts a fresh one:

    t=0 last success ... t=stall: unhealthy, rejoin ... t=stall+grace: exit 70 (40 s by default)

While no broker of ``KAFKA_BROKER`` accepts a connection at all, the worker stays (unhealthy):
a fresh one could do no better, and aiokafka finds a broker that comes back at its old address
by itself within a second or two; the grace then counts from when one answers again. A broker
that answers there while the consumer still cannot work (it came back at another address, which
aiokafka never learns: it asks only the brokers it already knows) is what the exit is for.

A join in flight is no failure for up to ``join_seconds`` (the rebalance timeout): the
coordinator holds it until every member rejoined, which may take another member's longest batch.

aiokafka's own recovery is not enough: ``GroupCoordinator.coordinator_dead()`` only forgets the
coordinator ("will not force a group rejoin"), and a worker was seen to loop on looking it up
every 100 ms for minutes without ever consuming again (faust-streaming#594, #523).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Action(str, Enum):
    NONE = "none"          # healthy, or unhealthy and waiting for the rejoin to work
    REJOIN = "rejoin"      # just became unhealthy: force a rejoin of the group
    EXIT = "exit"          # the rejoin did not help within the grace: exit 70


@dataclass(frozen=True, slots=True)
class Bounds:
    stall_seconds: float            # how long a check may fail before the worker is unhealthy
    rejoin_grace_seconds: float     # how long a forced rejoin may take before the worker exits
    join_seconds: float             # how long one join may wait for the group (the rebalance timeout)


@dataclass(frozen=True, slots=True)
class Observation:
    """One look at the consumer; ``None`` fields are not known (yet)."""

    member: bool                     # the group gave us an assignment (perhaps of no partitions)
    heartbeat_ok_at: float | None    # monotonic time of the last successful heartbeat or join
    position: int                    # sum of the fetch positions of our partitions
    lag: int                         # records known to be behind the positions (last fetched end offsets)
    batch_in_flight: bool
    joining_for: float | None = None  # seconds the join in flight has waited for the group (None: none)
    bootstrap_answers: bool = True    # a broker of KAFKA_BROKER accepts a connection (asked when unhealthy)


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    reason: str                      # "ok" or why not, for /readyz and the log
    action: Action = Action.NONE
    check: str = "ok"                # which check failed: membership, heartbeat, fetch (a metric label)


HEALTHY = Verdict(True, "ok")


class Watch:
    """The watchdog's memory between ticks: since when each check has been failing."""

    def __init__(self, bounds: Bounds, now: float) -> None:
        self.bounds = bounds
        self.started = now
        self.member_since: float | None = None
        self.not_member_since: float | None = now
        self.progress_at = now               # the position last moved (or there was nothing to fetch)
        self.position: int | None = None
        self.rejoined_at: float | None = None
        self.verdict = HEALTHY

    def observe(self, obs: Observation, now: float) -> Verdict:
        failing = self._failing(obs, now)
        if failing is None:
            self.rejoined_at = None
            self.verdict = HEALTHY
        elif self.rejoined_at is None:
            self.rejoined_at = now
            self.verdict = Verdict(False, failing[1], Action.REJOIN, failing[0])
        elif not obs.bootstrap_answers:
            # No broker answers at all: a fresh worker could do no better, and this one recovers
            # by itself in a second when one is back. The grace counts from then.
            self.rejoined_at = now
            self.verdict = Verdict(False, f"{failing[1]}; no broker of KAFKA_BROKER answers", Action.NONE,
                                   failing[0])
        elif now - self.rejoined_at >= self.bounds.rejoin_grace_seconds:
            self.verdict = Verdict(False, f"{failing[1]}; a rejoin {now - self.rejoined_at:.0f} s ago did not help",
                                   Action.EXIT, failing[0])
        else:
            self.verdict = Verdict(False, failing[1], Action.NONE, failing[0])
        return self.verdict

    def _failing(self, obs: Observation, now: float) -> tuple[str, str] | None:
        stall = self.bounds.stall_seconds
        if obs.joining_for is not None:
            # The coordinator answered and holds our join until every member has rejoined, which
            # may take a member's longest batch: legitimate up to the rebalance timeout.
            # The other clocks keep running: joins that fail at once, over and over (#594), must
            # not look like progress. Fetching cannot progress during a join, so its clock waits.
            if obs.joining_for < self.bounds.join_seconds:
                self.progress_at = now
                return None
            return "membership", f"a join has waited {obs.joining_for:.0f} s for the group"
        if not obs.member:
            self.member_since = None
            if self.not_member_since is None:
                self.not_member_since = now
            self.position = None
            if now - self.not_member_since >= stall:
                return "membership", f"no assignment from the group for {now - self.not_member_since:.0f} s"
            return None
        if self.member_since is None:
            self.member_since, self.not_member_since = now, None
            self.progress_at, self.position = now, obs.position
        # A join counts as a heartbeat; before the first one, the clock runs from the join.
        last_ok = max(obs.heartbeat_ok_at or self.member_since, self.member_since)
        if now - last_ok >= stall:
            return "heartbeat", f"no successful heartbeat for {now - last_ok:.0f} s"
        if obs.position != self.position or obs.lag <= 0 or obs.batch_in_flight:
            self.progress_at, self.position = now, obs.position
        elif now - self.progress_at >= stall:
            return "fetch", f"no fetch progress for {now - self.progress_at:.0f} s with a lag of {obs.lag}"
        return None


# The latest verdict of this process's watchdog, for /readyz (set by app.timers.watchdog).
_latest: Verdict = HEALTHY


def report(verdict: Verdict) -> None:
    global _latest
    _latest = verdict


def latest() -> Verdict:
    return _latest
