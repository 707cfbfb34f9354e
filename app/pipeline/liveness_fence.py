"""Claims of a worker that died are taken over at its presumed death, not at their lease's end;
and a worker that may have been presumed dead calls nothing under the claims it held.

Every process beats (``t_worker.last_seen``, every ``WORKER_HEARTBEAT_SECONDS``). Another
claimant that meets a live lease of an owner whose last heartbeat is older than
``WORKER_DEAD_AFTER_SECONDS`` (or that stopped cleanly) ends that lease at the owner's presumed
death, ``last_seen + WORKER_DEAD_AFTER_SECONDS``; from there the usual rules apply (an
idempotent call is made again with its token; an SMS with an unknown outcome is looked up once
its settle has passed, counted from that death). A lease is an upper bound of a claim; the
heartbeat lets it end sooner when its owner is gone::

    claim (T1)    last heartbeat       presumed dead                  lease's end
       |--------------|======================|-----------------------------|
                       WORKER_DEAD_AFTER      the takeover may start here    (not waited for)

For that to be safe, the owner must have made its last call by then, as a claim's calls end
within its lease: :class:`SelfFence` lets a call start only while the owner's last heartbeat
that got through is recent enough for the call to end before anybody may presume it dead, and
never under a claim made before a gap in its heartbeats long enough for somebody to have
presumed it dead (its claims may have been taken over meanwhile, even if it beats again now).
Durations on both sides: the database's between heartbeats, this process's monotonic clock.
"""

from __future__ import annotations

# Kept between what this process measured and what the database may have seen: the time a
# heartbeat's statement takes to be executed after it was sent is not known.
MARGIN_SECONDS = 0.5


def incarnation_of(owner: str | None) -> str | None:
    """The process that made a claim: ``<worker_id>/<role>/<run>[#n]`` -> ``<worker_id>/<run>``
    (``app.bootstrap.Runtime`` names its owners so); None for an owner of another shape."""
    if not owner:
        return None
    head, sep, last = owner.rpartition("/")
    worker, sep2, _role = head.rpartition("/")
    run = last.split("#", 1)[0]
    if not (sep and sep2 and worker and run):
        return None
    return f"{worker}/{run}"


class SelfFence:
    """Whether this process may start a call under a claim made at ``claimed_at`` (its
    monotonic clock). Fed with every heartbeat that got through (:meth:`beat`)."""

    def __init__(self, dead_after: float) -> None:
        self.dead_after = dead_after
        self._sent_ok: float | None = None          # when the last heartbeat that got through was sent
        self._acked_ok: float | None = None         # when the last heartbeat got through
        self._taken_before = float("-inf")          # claims made before this may have been taken over

    @property
    def last_beat(self) -> float | None:
        """When the last heartbeat that got through was sent (None: none yet)."""
        return self._sent_ok

    def beat(self, sent: float, acked: float) -> None:
        """A heartbeat sent at ``sent`` got through by ``acked``."""
        if self._sent_ok is not None and acked - self._sent_ok >= self.dead_after - MARGIN_SECONDS:
            # Between the last beat and this one, somebody may have found this process dead and
            # ended its leases: none of the claims it made until now may be called any more.
            self._taken_before = acked
        if self._sent_ok is None or sent > self._sent_ok:
            self._sent_ok = sent
        if self._acked_ok is None or acked > self._acked_ok:
            self._acked_ok = acked

    def answering(self, now: float) -> bool:
        """Whether heartbeats still get through, however late: the last one landed less than
        ``dead_after`` ago. A refusal then means a slow database, not a gone one."""
        return self._acked_ok is not None and now - self._acked_ok < self.dead_after

    def refusal(self, claimed_at: float, needs: float, now: float) -> str | None:
        """Why a call that may take ``needs`` seconds must not start now, or None when it may."""
        if self._sent_ok is None:
            return "this worker's heartbeat has not reached the database yet"
        if claimed_at < self._taken_before:
            return ("this worker's heartbeats stopped long enough after the claim for another worker to take it "
                    "over")
        age = now - self._sent_ok
        if age + needs >= self.dead_after - MARGIN_SECONDS:
            return (f"this worker's last heartbeat got through {age:.1f}s ago, and a call of up to {needs:.1f}s "
                    f"could outlast the {self.dead_after:g}s after which other workers take its claims over")
        return None
