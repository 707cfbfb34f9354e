"""The topics ``make topics`` creates: three replicas or more keep two in sync."""

from __future__ import annotations

import pytest

from app.adapters.kafka.topics import topic_specs
from app.settings import Settings


@pytest.mark.parametrize("replication, min_isr", [(1, None), (2, None), (3, "2"), (5, "2")])
def test_topics_of_three_replicas_or_more_need_two_in_sync(replication, min_isr):
    specs = topic_specs(Settings().model_copy(update={"topic_replication": replication}))
    assert [spec.replication for spec in specs] == [replication] * 3
    assert [spec.config.get("min.insync.replicas") for spec in specs] == [min_isr] * 3


def test_the_store_watermark_topic_keeps_every_deployments_newest_record():
    """One partition (one order of records to read back), compacted: the newest record of each key
    stays for ever, so a restore of a backup a year old is still noticed."""
    [watermark] = [spec for spec in topic_specs(Settings()) if spec.name == "order-event-store-watermark"]
    assert watermark.partitions == 1 and watermark.config["cleanup.policy"] == "compact"
