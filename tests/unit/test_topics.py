"""The topics ``make topics`` creates: three replicas or more keep two in sync."""

from __future__ import annotations

import pytest

from app.settings import Settings
from app.adapters.kafka.topics import topic_specs


@pytest.mark.parametrize("replication, min_isr", [(1, None), (2, None), (3, "2"), (5, "2")])
def test_topics_of_three_replicas_or_more_need_two_in_sync(replication, min_isr):
    specs = topic_specs(Settings().model_copy(update={"topic_replication": replication}))
    assert [spec.replication for spec in specs] == [replication, replication]
    assert [spec.config.get("min.insync.replicas") for spec in specs] == [min_isr, min_isr]
