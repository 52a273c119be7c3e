"""The group coordinator on the real core library (ZooKeeper + three bookie processes,
``bookie_cluster`` in conftest): its log is a real stream, replayed by the next
coordinator (offsets, members and generation intact), compacted by truncation; lag and
resets read real partition offsets."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator

import pytest

from foundation.errors import LockOwnedError
from foundation.names import group_stream, partition_stream
from groups.coordinator import CoordinatorConfig, GroupCoordinator
from groups.coordinator_store import CoreTopics, ensure_group_log
from groups.topics import TopicAdmin
from groups.wire import CommitRequest, HeartbeatRequest, JoinRequest, ResetRequest
from streams.config import NamespaceConfig
from streams.namespace import Namespace
from streams.records import LogRecord
from streams.writer import LogWriter
from tests.conftest import BookieCluster

pytestmark = pytest.mark.integration

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)
SESSION_MS = 10_000


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"gc{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


async def _produce(ns: Namespace, topic: str, partition: int, n: int) -> None:
    writer = await ns.open_writer(partition_stream(topic, partition))
    try:
        await writer.write_many([LogRecord(f"r{i}".encode()) for i in range(n)])
    finally:
        await writer.close()


async def _load(
    ns: Namespace, config: CoordinatorConfig | None = None
) -> tuple[GroupCoordinator, LogWriter]:
    await ensure_group_log(ns, "g")
    writer = await ns.open_writer(group_stream("g"))
    coord = await GroupCoordinator.load(ns, "g", writer, CoreTopics(ns), config=config)
    return coord, writer


async def test_replay_after_restart_keeps_offsets_members_and_generation(
    ns: Namespace,
) -> None:
    await TopicAdmin(ns).create_topic("t", 2)
    await _produce(ns, "t", 0, 30)
    await _produce(ns, "t", 1, 10)
    config = CoordinatorConfig(compact_records=8)
    c, writer = await _load(ns, config)
    assert not c.exists
    a = await c.join(JoinRequest(("t",), session_timeout_ms=SESSION_MS))
    await c.heartbeat(HeartbeatRequest(a.member_id, a.generation, a.partitions))
    d = await c.describe()
    assert d["lag"] == 40 and [p["end"] for p in d["partitions"]] == [30, 10]
    for i in range(1, 11):  # past compaction: a full record, truncation before it
        await c.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 2 * i, ("t", 1): i}))
    d = await c.describe()
    assert [p["lag"] for p in d["partitions"]] == [10, 0] and d["lag"] == 10
    info = await ns.stream_info(group_stream("g"))
    assert info.first_sequence_id > 0, "the group log was never truncated"
    # The next coordinator (after this one's writer is gone) replays the same group.
    await c.close()
    with pytest.raises(LockOwnedError):  # the lock fences a second coordinator
        await ns.open_writer(group_stream("g"))
    await writer.close()
    c2, writer2 = await _load(ns, config)
    try:
        assert c2.exists and c2.committed() == {("t", 0): 20, ("t", 1): 10}
        assert c2.state.generation == a.generation and a.member_id in c2.state.members
        gen, parts = await c2.heartbeat(HeartbeatRequest(a.member_id, a.generation, a.partitions))
        assert (gen, parts) == (a.generation, a.partitions)  # no rejoin needed
        await c2.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 30}))
        assert (await c2.describe())["lag"] == 0
    finally:
        await c2.close()
        await writer2.close()


async def test_reset_reads_real_offsets_and_times(ns: Namespace) -> None:
    await TopicAdmin(ns).create_topic("t", 1)
    await _produce(ns, "t", 0, 5)
    middle_ms = int(time.time() * 1000) + 50
    await asyncio.sleep(0.1)  # the next records are written after middle_ms
    await _produce(ns, "t", 0, 5)
    c, writer = await _load(ns)
    try:
        assert (await c.reset(ResetRequest("datetime", middle_ms, ("t",)))).offsets == {("t", 0): 5}
        assert (await c.reset(ResetRequest("latest", None, ("t",)))).offsets == {("t", 0): 10}
        assert (await c.reset(ResetRequest("earliest", None, ("t",)))).offsets == {("t", 0): 0}
        future = int(time.time() * 1000) + 60_000
        assert (await c.reset(ResetRequest("datetime", future, ("t",)))).offsets == {("t", 0): 10}
        assert (await c.describe())["lag"] == 0
        await c.reset(ResetRequest("offset", 3, ("t",)))
        d = await c.describe()
        assert d["state"] == "empty" and d["lag"] == 7 and d["members"] == []
    finally:
        await c.close()
        await writer.close()
