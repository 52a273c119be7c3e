"""Topics on the core library: admin (metadata in real ZooKeeper, partitions as streams
on three real bookie processes), offsets from the writer, and the core producer."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator

import pytest

from bookline import (
    LogRecord,
    Namespace,
    NamespaceConfig,
    StartPosition,
    StreamOptions,
    TopicOptions,
)
from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    InvalidNameError,
    NotFoundError,
    UnknownPartitionError,
    WriterFailedError,
)
from groups.partitioner import partition_for_key
from groups.producer import ProducerConfig, SyncTopicProducer, TopicProducer
from groups.topics import TopicAdmin
from metadata.topics import PARTITIONS_PER_TRANSACTION
from tests.conftest import BookieCluster
from tests.values import value

pytestmark = pytest.mark.integration

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"tp{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


async def test_topic_create_describe_grow_delete(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    options = TopicOptions(retention_ms=60_000, write_quorum=2)
    record = await admin.create_topic("orders", 3, options)
    assert record.partitions == 3
    assert record.options.retention_ms == 60_000
    assert record.options.quorums == (3, 2, 2)  # the rest from the namespace config
    assert await admin.list_topics() == ["orders"]
    assert await ns.list_streams() == ["orders~0", "orders~1", "orders~2"]
    assert (await ns.stream_options("orders~1")).quorums == (3, 2, 2)

    w = await ns.open_writer("orders~1")
    await w.write_many([LogRecord(b"a"), LogRecord(b"b")])
    await w.close()
    assert await admin.end_offsets("orders") == [0, 2, 0]
    info = await admin.describe_topic("orders")
    assert [(p.partition, p.start_offset, p.end_offset) for p in info.partitions] == [
        (0, 0, 0),
        (1, 0, 2),
        (2, 0, 0),
    ]
    assert info.record_count == 2

    grown = await admin.alter_partitions("orders", 5)
    assert grown.partitions == 5
    assert grown.options == record.options  # new partitions get the topic's options
    assert (await ns.stream_options("orders~4")).retention_ms == 60_000
    assert await admin.end_offsets("orders") == [0, 2, 0, 0, 0]
    assert (await admin.alter_partitions("orders", 5)).partitions == 5  # same: no-op

    await admin.delete_topic("orders")
    assert await admin.list_topics() == []
    assert await ns.list_streams() == []
    with pytest.raises(NotFoundError):
        await admin.describe_topic("orders")
    with pytest.raises(NotFoundError):
        await admin.delete_topic("orders")


async def test_topic_bad_input_changes_nothing(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    for bad in (0, -1, 10_001, True, "3"):
        with pytest.raises(BadRequestError):
            await admin.create_topic("t", bad)  # type: ignore[arg-type]
    for name in ("", "a/b", "t~0", "..", "a b", ".hidden"):
        with pytest.raises(InvalidNameError):
            await admin.create_topic(name, 1)
    with pytest.raises(BadRequestError):
        await admin.create_topic("t", 1, TopicOptions(ensemble_size=2, write_quorum=3))
    assert await admin.list_topics() == []
    assert await ns.list_streams() == []

    await admin.create_topic("t", 4)
    before = await ns.list_streams()
    for shrink in (3, 1, 0):
        with pytest.raises(BadRequestError):
            await admin.alter_partitions("t", shrink)
    with pytest.raises(NotFoundError):
        await admin.alter_partitions("nope", 2)
    with pytest.raises(AlreadyExistsError, match="already exists"):
        await admin.create_topic("t", 8)
    assert (await admin.get_topic("t")).partitions == 4
    assert await ns.list_streams() == before


async def test_topic_and_stream_names_never_collide(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    await ns.create_stream("events")
    with pytest.raises(AlreadyExistsError, match="is a stream"):
        await admin.create_topic("events", 2)
    assert await admin.list_topics() == []
    await admin.create_topic("clicks", 2)
    with pytest.raises(AlreadyExistsError, match="is a topic"):
        await ns.create_stream("clicks")
    with pytest.raises(InvalidNameError):
        await ns.create_stream("clicks~0")  # users never create partition streams
    assert await ns.list_streams() == ["clicks~0", "clicks~1", "events"]


async def test_topic_grows_in_steps_past_one_transaction(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    n = PARTITIONS_PER_TRANSACTION + 5
    await admin.create_topic("wide", n)
    assert (await admin.get_topic("wide")).partitions == n
    assert len(await ns.list_streams()) == n
    await admin.delete_topic("wide")
    assert await ns.list_streams() == []


async def test_half_deleted_topic_is_finished_by_delete(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    await admin.create_topic("half", 2)
    await ns.context.md.topics.delete_topic(ns.name, "half")  # the record only
    with pytest.raises(AlreadyExistsError, match="earlier topic"):
        await admin.create_topic("half", 2)
    await admin.delete_topic("half")  # removes the leftover partition streams
    await admin.create_topic("half", 2)
    assert await ns.list_streams() == ["half~0", "half~1"]


async def test_stream_options_quorums_go_together() -> None:
    with pytest.raises(BadRequestError):
        StreamOptions(ensemble_size=3)
    with pytest.raises(BadRequestError):
        StreamOptions(ensemble_size=2, write_quorum=3, ack_quorum=2)
    assert StreamOptions(ensemble_size=3, write_quorum=3, ack_quorum=2).quorums == (3, 3, 2)


async def test_writer_offsets_are_sequence_ids_across_segment_rolls(ns: Namespace) -> None:
    await ns.create_stream("rolls", StreamOptions(segment_rollover_bytes=1500))
    w = await ns.open_writer("rolls")
    offsets: list[int] = []
    for b in range(10):
        batch = [LogRecord(b"%03d-%03d" % (b, i) + b"x" * 92) for i in range(20)]
        _dlsns, got = await w.write_many_offsets(batch)
        offsets += got
    await w.close()
    assert offsets == list(range(200))
    assert len(await ns.segments("rolls")) > 3
    reader = await ns.open_reader("rolls", StartPosition.sequence(137))
    rec = await reader.read_next(timeout_s=5)
    await reader.close()
    assert rec is not None and rec.sequence_id == 137 and value(rec).startswith(b"006-017")
    w2 = await ns.open_writer("rolls")  # a new writer (new segment) goes on from 200
    assert (await w2.write_many_offsets([LogRecord(b"next")]))[1] == [200]
    assert await ns.end_offset("rolls") == 201
    await w2.close()


async def test_core_producer_keys_offsets_sticky_and_unknown_partition(ns: Namespace) -> None:
    admin = TopicAdmin(ns)
    await admin.create_topic("orders", 4)
    async with TopicProducer(ns, config=ProducerConfig(batch_bytes_max=500)) as producer:
        keys = [b"customer-%d" % i for i in range(40)]
        sent = await asyncio.gather(*(producer.send("orders", b"v", key=k) for k in keys))
        assert [p for p, _o in sent] == [partition_for_key(k, 4) for k in keys]
        for p in range(4):  # per partition, offsets 0, 1, 2, ... in send order
            offsets = [o for q, o in sent if q == p]
            assert offsets == list(range(len(offsets)))
        again = await producer.send("orders", "v", key="customer-3")
        assert again[0] == partition_for_key(b"customer-3", 4)
        # Unkeyed: sticky batches, cut at 500 bytes, spread over every partition.
        unkeyed = await producer.send_many("orders", [b"u" * 100] * 200)
        assert {p for p, _o in unkeyed} == {0, 1, 2, 3}
        assert await producer.send("orders", b"x", partition=2) == (
            2,
            len([1 for p, _o in [*sent, again, *unkeyed] if p == 2]),
        )
        with pytest.raises(UnknownPartitionError):
            await producer.send("orders", b"x", partition=4)
        await admin.alter_partitions("orders", 6)  # the refresh on an unknown one sees it
        assert await producer.send("orders", b"x", partition=5) == (5, 0)
        with pytest.raises(BadRequestError):
            await producer.send("orders", b"x", headers={"bl.seq": b"1"})
        with pytest.raises(NotFoundError):
            await producer.send("missing", b"x")
    ends = await admin.end_offsets("orders")
    assert sum(ends) == 40 + 1 + 200 + 1 + 1


def test_sync_core_producer(bookie_cluster: BookieCluster) -> None:
    from bookline.sync import SyncNamespace

    with SyncNamespace.open(bookie_cluster.zk, bookie_cluster.root, "tps-sync", CONFIG) as ns:
        ns.runner.call(TopicAdmin(ns.ns).create_topic("s", 2))
        with SyncTopicProducer(ns) as producer:
            assert producer.send("s", b"a", key=b"k") == (partition_for_key(b"k", 2), 0)
            assert producer.send_many("s", [b"b", b"c"], partition=1)[-1][0] == 1


async def test_deleting_a_stream_fences_a_writer_still_writing_it(ns: Namespace) -> None:
    """Acknowledged == durable also across a delete and re-create of the name: the old
    writer's ledger is fenced before the delete, so it can acknowledge nothing more."""
    await ns.create_stream("doomed")
    w = await ns.open_writer("doomed")
    await w.write(LogRecord(b"before"))
    await ns.delete_stream("doomed")
    await ns.create_stream("doomed")
    with pytest.raises(WriterFailedError):
        await w.write(LogRecord(b"after"))
    await w.close()
    assert await ns.end_offset("doomed") == 0
