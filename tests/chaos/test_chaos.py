"""The chaos run, short: every kind of fault once (kills all along), then the checker.

Its own Kafka broker and MariaDB (never the shared ones), the fake APIs with their faults,
three real workers; a few thousand events over a thousand orders, with duplicates,
re-publications, events out of order and malformed records; a worker SIGKILLed every
7-11 s, a worker added and one removed, MariaDB and the broker SIGKILLed and started
again, the database cut for 8 s, the APIs answering 503 for 8 s. The same on three Kafka
nodes over SASL_SSL with the cluster's faults instead of the database's: the busiest
partition's leader and the active controller SIGKILLed, the workers cut from the brokers
for 8 s. ``make chaos`` runs the long version (harness/chaos/driver.py). The seed is random
unless ``CHAOS_SEED`` names one; it is in every failure message, with where the run's
manifest, report and logs are.
"""

from __future__ import annotations

import json
import os
import secrets

from harness.chaos.driver import run
from harness.services import ROOT


def _passed(outcome, seed: int):
    where = f"seed {seed}; manifest {outcome.manifest.relative_to(ROOT)}"
    assert outcome.drain_error is None, f"{outcome.drain_error} ({where})"
    assert not outcome.unexpected_exits, \
        f"workers exited without the test's doing: {json.dumps(outcome.unexpected_exits)} ({where})"
    assert outcome.report is not None, f"the checker (harness/chaos/checker.py) gave no report ({where})"
    report = outcome.report
    assert report.ok, "the checker found problems ({}):\n{}".format(where, "\n".join(map(str, report.problems)))
    assert report.lost == report.acked_not_consumed == report.duplicate_effects == report.regressions == 0
    assert report.acked["consumed"] == report.acked["records"] == report.events
    return report


def test_a_short_storm_loses_nothing_does_nothing_twice_and_moves_no_order_back():
    seed = int(os.environ.get("CHAOS_SEED") or secrets.randbelow(10**6))
    report = _passed(run("short", seed), seed)
    assert report.kills > 0 and report.rebalances >= 2 and report.cut_seconds > 0 and report.api_503_seconds > 0


# The storm on three brokers deploys the providers of the other two contracts: the courier that
# refuses a repeated reference (signed, enveloped) and an SMS gateway without lookup.
OTHER_CONTRACTS = {"EFFECTS__WAYBILL__PROVIDER": "express", "EFFECTS__SMS__LOOKUP": "false"}


def test_a_short_storm_on_three_brokers_over_sasl_ssl_keeps_every_acknowledged_record():
    seed = int(os.environ.get("CHAOS_SEED") or secrets.randbelow(10**6))
    report = _passed(run("short", seed, cluster=True, settings=OTHER_CONTRACTS), seed)
    assert report.effects["express_calls"] > 0 and report.effects.get("sms_lookup_calls", 0) == 0
    assert report.cluster == {"nodes": 3, "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                              "proxied": True}
    assert report.kills > 0 and report.rebalances >= 2
    assert report.restarts["leader"] >= 1 and report.restarts["controller"] == 1 and report.broker_cut_seconds > 0
    # The check met records whose acknowledgement came while a leader was down.
    assert report.acked["in_flight_during"].get("leader_kill", 0) > 0
