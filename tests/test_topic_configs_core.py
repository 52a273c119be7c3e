"""Topic configs by Kafka's names through the core library (issue 24, 5): TopicAdmin
create / alter / describe with configs (real ZooKeeper, three real bookies), refused
names and values changing nothing, and configs applied to the partition streams --
existing and new ones -- by their writers (max.message.bytes, retention)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator

import pytest

from bookline import LogRecord, Namespace, NamespaceConfig, StartPosition, TopicOptions
from foundation.errors import InvalidConfigError, TooLargeError, UnknownConfigError
from foundation.limits import RECORD_BYTES_MAX
from groups.topics import TopicAdmin
from metadata.topic_configs import CONFIGS
from tests.conftest import BookieCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"tc{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


async def test_create_alter_describe_with_configs(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    record = await admin.create_topic(
        "orders",
        2,
        TopicOptions(retention_bytes=1 << 30),  # an alias, still accepted
        configs={"cleanup.policy": "compact,delete", "retention.ms": 60_000,
                 "bookline.write.quorum": "2", "min.cleanable.dirty.ratio": "0.3"},
    )  # fmt: skip
    assert dict(record.configs) == {
        "cleanup.policy": "compact,delete",
        "retention.ms": "60000",
        "retention.bytes": str(1 << 30),
        "min.cleanable.dirty.ratio": "0.3",
        "bookline.write.quorum": "2",
    }
    for p in (0, 1):
        options = await ns.stream_options(f"orders~{p}")
        assert (options.retention_ms, options.retention_bytes) == (60_000, 1 << 30)
        assert options.quorums == (3, 2, 2)

    described = {c.name: (c.value, c.source) for c in await admin.describe_configs("orders")}
    assert list(described) == list(CONFIGS)  # every config, the table's order
    assert described["cleanup.policy"] == ("compact,delete", "topic")
    assert described["bookline.ensemble.size"] == ("3", "default")  # the namespace's
    assert described["segment.bytes"] == (str(CONFIG.segment_rollover_bytes), "default")
    assert described["delete.retention.ms"] == ("86400000", "default")
    info = await admin.describe_topic("orders")
    assert {c.name: (c.value, c.source) for c in info.configs} == described

    # Alter: set and return to the default; every existing partition stream follows,
    # and partitions added later get the topic's options too.
    altered = await admin.alter_configs(
        "orders", {"cleanup.policy": "compact", "segment.ms": "5000"}, delete=["retention.ms"]
    )
    assert altered.configs["cleanup.policy"] == "compact"
    assert "retention.ms" not in altered.configs
    grown = await admin.alter_partitions("orders", 3)
    assert grown.configs == altered.configs
    for p in (0, 1, 2):
        options = await ns.stream_options(f"orders~{p}")
        assert options.retention_ms is None and options.retention_bytes is None  # compact only
        assert options.segment_rollover_ms == 5000
    after = {c.name: (c.value, c.source) for c in await admin.describe_configs("orders")}
    assert after["retention.ms"] == ("-1", "default")
    assert after["segment.ms"] == ("5000", "topic")


async def test_unknown_names_and_bad_values_are_refused_and_change_nothing(
    ns: Namespace,
) -> None:
    admin = TopicAdmin(ns)
    with pytest.raises(UnknownConfigError, match=r"known configs: cleanup\.policy") as unknown:
        await admin.create_topic("t", 1, configs={"cleanup.polcy": "compact"})
    assert unknown.value.code == 53
    with pytest.raises(InvalidConfigError) as bad:
        await admin.create_topic("t", 1, configs={"retention.ms": "soon"})
    assert bad.value.code == 52
    with pytest.raises(InvalidConfigError):  # E=3 >= Qw=2 >= Qa=3 does not hold
        await admin.create_topic("t", 1, configs={"bookline.ack.quorum": 3,
                                                  "bookline.write.quorum": 2})  # fmt: skip
    assert await admin.list_topics() == []
    assert await ns.list_streams() == []

    await admin.create_topic("t", 1, configs={"retention.ms": "1000"})
    before = await admin.get_topic("t")
    with pytest.raises(UnknownConfigError):
        await admin.alter_configs("t", {"retention.ms": "5", "log.retention.ms": "5"})
    with pytest.raises(InvalidConfigError):
        await admin.alter_configs("t", {"max.message.bytes": str(RECORD_BYTES_MAX + 1)})
    with pytest.raises(UnknownConfigError):
        await admin.alter_configs("t", {}, delete=["retention"])
    assert await admin.get_topic("t") == before
    assert (await ns.stream_options("t~0")).retention_ms == 1000


async def test_max_message_bytes_refuses_an_oversized_record_on_every_partition(
    ns: Namespace,
) -> None:
    admin = TopicAdmin(ns)
    await admin.create_topic("small", 1, configs={"max.message.bytes": "1000"})
    w = await ns.open_writer("small~0")
    try:
        with pytest.raises(TooLargeError, match="at most 1000"):
            await w.write(LogRecord(b"x" * 1001))
        with pytest.raises(TooLargeError):  # key and headers count, as in Kafka
            await w.write_many([LogRecord(b"x" * 900, key=b"k" * 101)])
        await w.write(LogRecord(b"x" * 1000))  # at the limit: fine, the writer lives on
    finally:
        await w.close()
    # A partition added later has the limit too; raising it applies on the next open.
    await admin.alter_partitions("small", 2)
    w = await ns.open_writer("small~1")
    try:
        with pytest.raises(TooLargeError):
            await w.write(LogRecord(b"x" * 1001))
    finally:
        await w.close()
    await admin.alter_configs("small", {"max.message.bytes": "4000"})
    for p in (0, 1):
        w = await ns.open_writer(f"small~{p}")
        try:
            await w.write(LogRecord(b"x" * 4000))
        finally:
            await w.close()


async def test_retention_set_by_alter_applies_to_an_existing_partition(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    await admin.create_topic("logs", 1)
    for _ in range(3):  # each writer's open seals the segment before it
        w = await ns.open_writer("logs~0")
        try:
            await w.write_many([LogRecord(b"y" * 100) for _ in range(5)])
        finally:
            await w.close()
    assert not await ns.apply_retention("logs~0")  # no retention: nothing dropped
    assert (await ns.stream_info("logs~0")).first_sequence_id == 0
    await admin.alter_configs("logs", {"retention.bytes": "1"})
    assert await ns.apply_retention("logs~0")
    assert (await ns.stream_info("logs~0")).first_sequence_id > 0
    # With cleanup.policy=compact, retention no longer deletes (as in Kafka).
    await admin.alter_configs("logs", {"cleanup.policy": "compact"})
    assert (await ns.stream_options("logs~0")).retention_bytes is None


async def test_an_open_writer_takes_an_altered_config(ns: Namespace) -> None:
    """A partition's writer already open when its topic's configs change applies them
    (its stream record is watched): a lower max.message.bytes refuses, retention starts
    without reopening."""
    admin = TopicAdmin(ns)
    await admin.create_topic("live", 1)
    w = await ns.open_writer("live~0")
    try:
        await w.write(LogRecord(b"x" * 2000))
        await admin.alter_configs("live", {"max.message.bytes": "1000"})

        async def refused() -> bool:
            try:
                await w.write(LogRecord(b"x" * 2000))
            except TooLargeError:
                return True
            return False

        await wait_for(refused, "the open writer refusing a record above the new limit")
        await w.write(LogRecord(b"x" * 1000))  # the writer goes on
        await admin.alter_configs("live", {}, delete=["max.message.bytes"])

        async def accepted() -> bool:
            try:
                await w.write(LogRecord(b"x" * 2000))
            except TooLargeError:
                return False
            return True

        await wait_for(accepted, "the open writer taking the default limit back")
    finally:
        await w.close()


async def test_message_timestamp_type_log_append_time_stamps_the_partitions_records(
    ns: Namespace,
) -> None:
    admin = TopicAdmin(ns)
    await admin.create_topic("stamped", 1, configs={"message.timestamp.type": "LogAppendTime"})
    await admin.create_topic("created", 1)  # CreateTime: the producer's timestamp stays
    assert (await ns.stream_options("stamped~0")).timestamp_type == "LogAppendTime"
    for topic in ("stamped", "created"):
        w = await ns.open_writer(f"{topic}~0")
        try:
            await w.write_many([LogRecord(b"a", timestamp_ms=1_000), LogRecord(b"b")])
        finally:
            await w.close()
    for topic, first_ts, ts_type in (("stamped", None, 1), ("created", 1_000, 0)):
        reader = await ns.open_reader(f"{topic}~0", StartPosition.earliest())
        try:
            records = await reader.read_many(2, timeout_s=30)
            while len(records) < 2:  # a read may end at an entry boundary
                more = await reader.read_many(2 - len(records), timeout_s=30)
                assert more, f"{topic}: records missing"
                records += more
        finally:
            await reader.close()
        assert [r.timestamp_type for r in records] == [ts_type, ts_type]
        if first_ts is None:
            assert records[0].timestamp_ms > 1_000  # the writer's clock, not the producer's
        else:
            assert records[0].timestamp_ms == first_ts


async def test_alters_at_once_all_apply(ns: Namespace) -> None:
    """Each alter merges into the record it compare-and-sets: none undoes another."""
    admin = TopicAdmin(ns)
    await admin.create_topic("busy", 2)
    changes = [
        {"retention.ms": "60000"},
        {"segment.ms": "70000"},
        {"cleanup.policy": "compact,delete"},
        {"min.compaction.lag.ms": "5"},
        {"delete.retention.ms": "6"},
    ]
    await asyncio.gather(*(admin.alter_configs("busy", c) for c in changes))
    record = await admin.get_topic("busy")
    assert dict(record.configs) == {k: v for c in changes for k, v in c.items()}
    for p in (0, 1):
        options = await ns.stream_options(f"busy~{p}")
        assert (options.retention_ms, options.segment_rollover_ms) == (60_000, 70_000)
