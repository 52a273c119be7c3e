"""One suite, both clients: the core library (a :class:`~streams.namespace.Namespace`
and the objects over it: writers, readers, ``TopicAdmin``, ``TopicProducer``) and the
thin client (:class:`~thinclient.proxy_client.ProxyClient`, over the proxies' HTTP API)
behave the same for the same operation -- writes, reads from each kind of position,
tails, truncation, topics and consumer groups -- and answer in the same types
(:mod:`streams.vocabulary`), as ``tests/test_ledger_conformance.py`` does for the
ledger client's fakes and real bookies.

Both clients see one cluster (the session's ``proxy_cluster``: ZooKeeper, bookies,
write and read proxies, each a process). Where the two clients' shapes differ (the core
library writes through a stream's single writer and reads through a reader; the thin
client writes and reads by stream name) a small :class:`Client` adapter gives the tests
one call; everything else -- stream and topic management, subscriptions, producing --
is the clients' own methods, called by the same name (the :class:`Streams`,
:class:`Topics` and :class:`Producer` protocols, which mypy checks both clients meet).
Each test uses its own stream and topic names.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import pytest

from bookline import (
    DLSN,
    ConsumerConfig,
    GroupConsumer,
    LogRecord,
    Namespace,
    NamespaceConfig,
    PartitionInfo,
    ProxyClient,
    ReadRecord,
    StartPosition,
    StreamInfo,
    TopicAdmin,
    TopicInfo,
    TopicOptions,
    TopicProducer,
)
from bookline.client import ClientConfig
from metadata.topics import TopicRecord
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.writer import LogWriter
from tests.values import value
from tests.waiting import scaled, wait_for

pytestmark = pytest.mark.integration

CLIENT_CONFIG = ClientConfig(proxy_down_ms=1_000, retry_deadline_ms=int(scaled(40.0) * 1000))
# A read or tail waits this long for the records a test wrote (scaled on a loaded machine).
READ_TIMEOUT_S = 30.0
# A thin-client page long-polls this long for its first record (the proxy allows 30 s).
PAGE_WAIT_MS = 5_000


class Streams(Protocol):
    """Stream management and subscriptions: the same names on both clients."""

    async def create_stream(self, name: str) -> None: ...
    async def list_streams(self) -> list[str]: ...
    async def stream_info(self, name: str) -> StreamInfo: ...
    async def delete_stream(self, name: str) -> None: ...
    async def commit(self, name: str, subscriber: str, dlsn: DLSN) -> bool: ...
    async def committed(self, name: str, subscriber: str) -> DLSN | None: ...
    async def list_subscribers(self, name: str) -> list[str]: ...


class Topics(Protocol):
    """Topic administration: ``TopicAdmin``'s names and result types."""

    async def create_topic(
        self, name: str, partitions: int, options: TopicOptions | None = None
    ) -> TopicRecord: ...
    async def get_topic(self, name: str) -> TopicRecord: ...
    async def describe_topic(self, name: str) -> TopicInfo: ...
    async def alter_partitions(self, name: str, partitions: int) -> TopicRecord: ...
    async def list_topics(self) -> list[str]: ...
    async def delete_topic(self, name: str) -> None: ...


class Producer(Protocol):
    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: dict[str, bytes | str] | None = None,
        partition: int | None = None,
    ) -> tuple[int, int]: ...
    async def partitions_for(self, topic: str, *, refresh: bool = False) -> int: ...


@dataclass
class Client:
    """One client under test, and the calls whose shape differs between the two."""

    name: str  # "core" | "thin"
    streams: Streams
    topics: Topics
    producer: Producer
    write: Callable[[str, list[bytes]], Awaitable[list[DLSN]]]
    # ``n`` records from ``start`` (waiting for them), read as one reader would.
    read: Callable[[str, StartPosition, int], Awaitable[list[ReadRecord]]]
    tail: Callable[[str, StartPosition], AsyncGenerator[ReadRecord, None]]
    truncate: Callable[[str, DLSN], Awaitable[None]]
    consumer: Callable[[str, list[str]], GroupConsumer]
    closers: list[Callable[[], Awaitable[object]]] = field(default_factory=list)


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _thin(cluster: LocalCluster) -> ProxyClient:
    return ProxyClient(
        write_urls=[p.extra["url"] for p in cluster.write_proxies],
        read_urls=[p.extra["url"] for p in cluster.read_proxies],
        config=CLIENT_CONFIG,
    )


def _consumer_config() -> ConsumerConfig:
    return ConsumerConfig(auto_offset_reset="earliest", enable_auto_commit=False)


async def _core_client(ns: Namespace, thin: ProxyClient) -> Client:
    writers: dict[str, LogWriter] = {}
    producer = TopicProducer(ns)

    async def writer(stream: str) -> LogWriter:
        if stream not in writers:
            writers[stream] = await ns.open_writer(stream)
        return writers[stream]

    async def write(stream: str, values: list[bytes]) -> list[DLSN]:
        records = [LogRecord(v) for v in values]
        return list(await (await writer(stream)).write_many(records))

    async def read(stream: str, start: StartPosition, n: int) -> list[ReadRecord]:
        reader = await ns.open_reader(stream, start)
        try:
            out: list[ReadRecord] = []
            while len(out) < n:
                out += await reader.read_many(n - len(out), timeout_s=scaled(READ_TIMEOUT_S))
            return out
        finally:
            await reader.close()

    async def tail(stream: str, start: StartPosition) -> AsyncGenerator[ReadRecord, None]:
        reader = await ns.open_reader(stream, start)
        try:
            async for rec in reader:
                yield rec
        finally:
            await reader.close()

    async def truncate(stream: str, dlsn: DLSN) -> None:
        await (await writer(stream)).truncate(dlsn)

    def consumer(group: str, topics: list[str]) -> GroupConsumer:
        # The coordinator lives in the write proxies; partitions are read from bookies.
        return GroupConsumer(group, topics, client=thin, namespace=ns, config=_consumer_config())

    async def close_writers() -> None:
        for w in writers.values():
            await w.close()

    closers: list[Callable[[], Awaitable[object]]] = [producer.close, close_writers]
    return Client("core", ns, TopicAdmin(ns), producer, write, read, tail, truncate,
                  consumer, closers)  # fmt: skip


def _thin_client(thin: ProxyClient) -> Client:
    async def write(stream: str, values: list[bytes]) -> list[DLSN]:
        return await thin.write_many(stream, list(values))

    async def read(stream: str, start: StartPosition, n: int) -> list[ReadRecord]:
        out: list[ReadRecord] = []
        position: StartPosition | str = start

        async def all_read() -> bool:
            nonlocal position
            page = await thin.read(stream, position, limit=n - len(out), wait_ms=PAGE_WAIT_MS)
            out.extend(page.records)
            position = page.next
            return len(out) >= n

        await wait_for(all_read, lambda: f"{n} records of {stream} ({len(out)} read)",
                       timeout_s=READ_TIMEOUT_S)  # fmt: skip
        return out

    async def truncate(stream: str, dlsn: DLSN) -> None:
        await thin.truncate(stream, dlsn)

    def consumer(group: str, topics: list[str]) -> GroupConsumer:
        return GroupConsumer(group, topics, client=thin, config=_consumer_config())

    return Client("thin", thin, thin, thin, write, read, thin.tail, truncate, consumer)


@pytest.fixture(params=["core", "thin"])
async def client(
    request: pytest.FixtureRequest, proxy_cluster: LocalCluster
) -> AsyncIterator[Client]:
    """Each client in turn, on the one cluster."""
    async with _thin(proxy_cluster) as thin:
        if request.param == "thin":
            yield _thin_client(thin)
            return
        config = NamespaceConfig(session_timeout_ms=4000)
        async with await Namespace.open(
            proxy_cluster.zk_connect, CLUSTER_ROOT, config=config
        ) as ns:
            c = await _core_client(ns, thin)
            try:
                yield c
            finally:
                for close in c.closers:
                    await close()


async def _new_stream(c: Client, values: list[bytes]) -> tuple[str, list[DLSN]]:
    stream = f"conf-{c.name}-{_uid()}"
    await c.streams.create_stream(stream)
    return stream, await c.write(stream, values)


async def _take(tail: AsyncIterator[ReadRecord], n: int) -> list[bytes]:
    async with asyncio.timeout(scaled(READ_TIMEOUT_S)):
        return [value(await anext(tail)) for _ in range(n)]


# -- writes and stream management --------------------------------------------------------


async def test_writes_are_acknowledged_in_order_and_described(client: Client) -> None:
    values = [b"a", b"b", b"c"]
    stream, dlsns = await _new_stream(client, values)
    assert dlsns == sorted(dlsns) and len(set(dlsns)) == 3
    assert stream in await client.streams.list_streams()

    async def described() -> StreamInfo | None:
        # Counters are as of the LAC, which follows the last acknowledgement shortly.
        info = await client.streams.stream_info(stream)
        return info if info.record_count == 3 else None

    info = await wait_for(described, "the stream's counters to show the three records")
    assert isinstance(info, StreamInfo)
    assert (info.name, info.next_sequence_id) == (stream, 3)
    assert info.last_dlsn == dlsns[-1]
    records = await client.read(stream, StartPosition.earliest(), 3)
    assert [r.payload for r in records] == values
    assert [r.dlsn for r in records] == dlsns
    assert [r.sequence_id for r in records] == [0, 1, 2]
    await client.streams.delete_stream(stream)
    assert stream not in await client.streams.list_streams()


# -- reads from each kind of position -----------------------------------------------------


async def test_reads_from_the_beginning_a_dlsn_and_an_offset(client: Client) -> None:
    values = [b"r%d" % i for i in range(5)]
    stream, dlsns = await _new_stream(client, values)
    got = await client.read(stream, StartPosition.earliest(), 5)
    assert [r.payload for r in got] == values
    got = await client.read(stream, StartPosition.dlsn(dlsns[1]), 4)
    assert [r.payload for r in got] == values[1:]
    got = await client.read(stream, StartPosition.sequence(3), 2)
    assert [r.payload for r in got] == values[3:]


async def test_read_from_the_end_sees_only_later_records(client: Client) -> None:
    stream, _ = await _new_stream(client, [b"old-1", b"old-2"])
    reading = asyncio.ensure_future(client.read(stream, StartPosition.latest(), 2))
    try:
        # The write may land before the read's start resolves: write until the read has
        # two records past the two old ones (it never sees an old one either way).
        while not reading.done():
            await client.write(stream, [b"new"])
            await asyncio.wait([reading], timeout=scaled(1.0))
        got = reading.result()
    finally:
        reading.cancel()
    assert [r.payload for r in got] == [b"new", b"new"]
    assert all(r.sequence_id >= 2 for r in got)


async def test_read_from_a_timestamp_starts_at_the_first_record_at_or_after_it(
    client: Client,
) -> None:
    stream, _ = await _new_stream(client, [b"t0"])
    for i in range(1, 4):
        await client.write(stream, [b"t%d" % i])
    every = await client.read(stream, StartPosition.earliest(), 4)
    ts = every[2].timestamp_ms
    want = [r.payload for r in every if r.timestamp_ms >= ts]
    got = await client.read(stream, StartPosition.timestamp(ts), len(want))
    assert [r.payload for r in got] == want


# -- tails --------------------------------------------------------------------------------


async def test_tail_follows_the_stream(client: Client) -> None:
    stream, _ = await _new_stream(client, [b"h1", b"h2"])
    tail = client.tail(stream, StartPosition.earliest())
    try:
        assert await _take(tail, 2) == [b"h1", b"h2"]
        await client.write(stream, [b"n1", b"n2"])
        assert await _take(tail, 2) == [b"n1", b"n2"]
    finally:
        await tail.aclose()


# -- truncation ---------------------------------------------------------------------------


async def test_truncation_hides_records_before_the_point(client: Client) -> None:
    values = [b"x%d" % i for i in range(5)]
    stream, dlsns = await _new_stream(client, values)
    await client.truncate(stream, dlsns[3])
    info = await client.streams.stream_info(stream)
    assert info.first_dlsn == dlsns[3]
    assert info.first_sequence_id == 3
    got = await client.read(stream, StartPosition.earliest(), 2)
    assert [r.payload for r in got] == values[3:]


# -- subscriptions ------------------------------------------------------------------------


async def test_subscriptions_commit_forward_only(client: Client) -> None:
    stream, dlsns = await _new_stream(client, [b"s0", b"s1"])
    streams = client.streams
    assert await streams.committed(stream, "sub") is None
    assert await streams.commit(stream, "sub", dlsns[1]) is True
    assert await streams.commit(stream, "sub", dlsns[0]) is False
    assert await streams.committed(stream, "sub") == dlsns[1]
    assert await streams.list_subscribers(stream) == ["sub"]


# -- topics -------------------------------------------------------------------------------


async def test_topics_create_describe_grow_delete(client: Client) -> None:
    topic = f"conf-{client.name}-{_uid()}"
    options = TopicOptions(retention_ms=3_600_000, write_quorum=2)
    record = await client.topics.create_topic(topic, 2, options)
    assert isinstance(record, TopicRecord)
    assert (record.topic, record.partitions) == (topic, 2)
    assert record.options.retention_ms == 3_600_000
    assert record.options.write_quorum == 2 and record.options.ensemble_size is not None
    assert (await client.topics.get_topic(topic)).options == record.options
    assert topic in await client.topics.list_topics()

    sent = [await client.producer.send(topic, b"v%d" % i, key=b"k") for i in range(3)]
    p = sent[0][0]
    assert sent == [(p, 0), (p, 1), (p, 2)]  # one key, one partition, offsets in order

    async def described() -> TopicInfo | None:
        # Offsets are as of the LAC, which follows the last acknowledgement shortly.
        info = await client.topics.describe_topic(topic)
        return info if info.record_count == 3 else None

    info = await wait_for(described, "the topic's offsets to show the three records")
    assert isinstance(info, TopicInfo) and all(
        isinstance(x, PartitionInfo) for x in info.partitions
    )
    assert [(x.partition, x.start_offset) for x in info.partitions] == [(0, 0), (1, 0)]
    assert info.partitions[p].end_offset == 3
    assert info.record_count == 3

    assert (await client.topics.alter_partitions(topic, 3)).partitions == 3
    assert await client.producer.partitions_for(topic, refresh=True) == 3
    await client.topics.delete_topic(topic)
    assert topic not in await client.topics.list_topics()


# -- consumer groups ----------------------------------------------------------------------


async def test_group_consumes_and_commits_every_partition(client: Client) -> None:
    topic = f"conf-{client.name}-{_uid()}"
    await client.topics.create_topic(topic, 2)
    sent = {await client.producer.send(topic, b"g%d" % i, partition=i % 2) for i in range(6)}
    consumer = client.consumer(f"g-{_uid()}", [topic])
    async with consumer:
        got: set[tuple[int, int]] = set()

        async def all_polled() -> bool:
            got.update((r.partition, r.offset) for r in await consumer.poll(timeout_s=1.0))
            return got == sent

        await wait_for(all_polled, lambda: f"{sent - got} consumed", timeout_s=60)
        await consumer.commit()
        assert {tp: await consumer.committed(tp) for tp in sorted(consumer.assignment())} == {
            (topic, 0): 3,
            (topic, 1): 3,
        }
