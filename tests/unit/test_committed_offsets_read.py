"""Reading a group's committed offsets rides out a coordinator that is not there yet or moves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupCoordinatorNotAvailableError, GroupLoadInProgressError, UnknownTopicOrPartitionError

from app.adapters.kafka.ops import CommittedOffsets


class AdminAnswering:
    """An admin client whose coordinator answers with ``failures`` first, then with offsets."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = list(failures)
        self.found = 0

    async def find_coordinator(self, group: str) -> int:
        self.found += 1
        if self.failures:
            raise self.failures.pop(0)
        return 1

    async def list_consumer_group_offsets(self, group: str, coordinator: int) -> dict:
        return {TopicPartition("order-event", 0): SimpleNamespace(offset=7),
                TopicPartition("order-event", 1): SimpleNamespace(offset=-1),
                TopicPartition("other", 0): SimpleNamespace(offset=3)}


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(CommittedOffsets, "PAUSE_SECONDS", 0)


async def test_a_coordinator_not_there_yet_or_loading_is_asked_again():
    client = AdminAnswering([GroupCoordinatorNotAvailableError(), GroupLoadInProgressError()])
    assert await CommittedOffsets(client, "g", "order-event").read() == {0: 7}
    assert client.found == 3


async def test_a_coordinator_that_never_comes_raises_after_the_attempts():
    client = AdminAnswering([GroupCoordinatorNotAvailableError()] * CommittedOffsets.ATTEMPTS)
    with pytest.raises(GroupCoordinatorNotAvailableError):
        await CommittedOffsets(client, "g", "order-event").read()


async def test_other_errors_are_not_retried():
    client = AdminAnswering([UnknownTopicOrPartitionError()])
    with pytest.raises(UnknownTopicOrPartitionError):
        await CommittedOffsets(client, "g", "order-event").read()
    assert client.found == 1
