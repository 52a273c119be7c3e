"""Consumers' read path: partition pages by offset through the read proxy (and the same
lookups on the core library), core subscriptions over HTTP, and the two fetchers.

Pure tests of the page codec first; then the shared proxy cluster (ZooKeeper, 3
bookies, 2 write proxies, a read proxy, each a process)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator

import msgpack
import pytest

from bookline import LogRecord, Namespace, NamespaceConfig
from foundation.errors import (
    NotAssignedError,
    NotFoundError,
    OutOfRangeError,
    StaleGenerationError,
)
from groups.consumer import ConsumerConfig, GroupConsumer
from groups.consumer_sync import SyncGroupConsumer
from groups.fetchers import ConsumerRecord, CoreFetchers, PartitionFetch, ProxyFetchers
from groups.state import GroupState
from groups.topics import TopicAdmin
from httpapi import wire
from httpapi.partitions import decode_page, encode_page, rows_of
from ops.cluster.local import LocalCluster
from streams.dlsn import DLSN
from streams.records import ReadRecord
from tests.waiting import scaled, wait_for, wait_until
from thinclient import reads
from thinclient.client import ClientConfig, ProxyClient

CLIENT_CONFIG = ClientConfig(proxy_down_ms=1_000, retry_deadline_ms=20_000)


def _uid() -> str:
    return uuid.uuid4().hex[:8]


# -- pure ----------------------------------------------------------------------------------


def test_page_codec_both_media() -> None:
    recs = [
        ReadRecord("t~0", DLSN(1, 0, 0), 7, 1, 100, b"v0", None, None),
        ReadRecord("t~0", DLSN(1, 0, 1), 8, 2, 101, b"\xff", b"k", [("h", b"x")], 1),
    ]
    rows = rows_of(recs)
    assert rows == [(7, 100, None, b"v0", None, 0), (8, 101, b"k", b"\xff", [("h", b"x")], 1)]
    packed = encode_page(rows, 9, wire.MSGPACK)
    unpacked_rows, nxt = decode_page(msgpack.unpackb(packed))
    assert ([tuple(r) for r in unpacked_rows], nxt) == (rows, 9)
    as_json = wire.decode_body(encode_page(rows, 9, wire.JSON), wire.JSON)
    assert as_json["records"][1]["value_b64"] == "/w=="  # not UTF-8: base64
    assert decode_page(as_json) == (rows, 9)
    assert decode_page({"rows": [], "next_offset": 3}) == ([], 3)


def test_consumer_record_is_a_cheap_tuple() -> None:
    r = ConsumerRecord("t", 2, 41, b"k", b"v", [("h", b"1")], 99, 1)
    assert (r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms,
            r.timestamp_type) == ("t", 2, 41, b"k", b"v", [("h", b"1")], 99, 1)  # fmt: skip
    assert r.tp == ("t", 2)
    assert r == ConsumerRecord("t", 2, 41, b"k", b"v", [("h", b"1")], 99, 1)
    assert "t/2@41" in repr(r)


def test_partitions_handed_over_count_as_owned_until_reported() -> None:
    """A member starts consuming what an answer hands it: a second member joining
    before the first one's next heartbeat must not be handed the same partitions."""
    state = GroupState("g", {"t": 4})
    join = {"instance_id": None, "topics": ["t"], "assignor": "cooperative-sticky",
            "session_timeout_ms": 3000}  # fmt: skip
    a = state.join(0, member_id=None, **join)  # type: ignore[arg-type]
    assert a.partitions == {("t", p) for p in range(4)}
    b = state.join(1, member_id=None, **join)  # type: ignore[arg-type]
    assert b.partitions == frozenset()
    with pytest.raises(StaleGenerationError):
        state.heartbeat(2, a.member_id, a.generation, a.partitions)
    a2 = state.join(3, member_id=a.member_id, owned=a.partitions, **join)  # type: ignore[arg-type]
    assert len(a2.partitions) == 2
    assert state.heartbeat(4, b.member_id, b.generation, ()) == frozenset()  # not yet released
    state.heartbeat(5, a.member_id, a2.generation, a2.partitions)  # a released two
    assert state.heartbeat(6, b.member_id, b.generation, ()) == a.partitions - a2.partitions


# -- the read proxy ---------------------------------------------------------------------


@pytest.fixture
async def ns(proxy_cluster: LocalCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        proxy_cluster.zk_connect, "/bookline", "default", NamespaceConfig(session_timeout_ms=4000)
    )
    try:
        yield n
    finally:
        await n.close()


@pytest.fixture
async def client(proxy_cluster: LocalCluster) -> AsyncIterator[ProxyClient]:
    c = ProxyClient.from_cluster_file(proxy_cluster.dir / "cluster.json", config=CLIENT_CONFIG)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


async def _topic(ns: Namespace, partitions: int, counts: list[int]) -> str:
    """A new topic with ``counts[p]`` records ``p-i`` (key ``k{i%3}``) in partition p."""
    topic = f"t{_uid()}"
    await TopicAdmin(ns).create_topic(topic, partitions)
    for p, n in enumerate(counts):
        if n:
            w = await ns.open_writer(f"{topic}~{p}")
            await w.write_many(
                [LogRecord(f"{p}-{i}".encode(), key=f"k{i % 3}".encode()) for i in range(n)]
            )
            await w.close()
    return topic


@pytest.mark.integration
async def test_partition_pages_offsets_and_long_poll(ns: Namespace, client: ProxyClient) -> None:
    topic = await _topic(ns, 2, [250, 0])
    transport = client.transport
    page = await reads.read_partition(transport, topic, 0, 0, limit=100, wait_ms=0)
    assert [r[0] for r in page.rows] == list(range(100))
    assert page.rows[5][3] == b"0-5" and page.rows[5][2] == b"k2"
    assert page.next_offset == 100
    # Paging on by the next offset reuses the proxy's reader; the end is an empty page.
    seen = [r[3] for r in page.rows]
    offset = page.next_offset
    while True:
        page = await reads.read_partition(transport, topic, 0, offset, limit=64, wait_ms=0)
        if not page.rows:
            break
        seen.extend(r[3] for r in page.rows)
        offset = page.next_offset
    assert seen == [f"0-{i}".encode() for i in range(250)]
    assert offset == 250
    # Lookups.
    assert await reads.partition_offset(transport, topic, 0, "earliest") == 0
    assert await reads.partition_offset(transport, topic, 0, "latest") == 250
    assert await reads.partition_offset(transport, topic, 1, "latest") == 0
    later = f"time:{int(time.time() * 1000) + 60_000}"
    assert await reads.partition_offset(transport, topic, 0, later) == 250
    assert await reads.partition_offset(transport, topic, 0, "time:0") == 0
    # Past the end: OUT_OF_RANGE; no such partition: NOT_FOUND.
    with pytest.raises(OutOfRangeError):
        await reads.read_partition(transport, topic, 0, 251, limit=10, wait_ms=0)
    with pytest.raises(NotFoundError):
        await reads.read_partition(transport, topic, 7, 0, limit=10, wait_ms=0)
    # A long poll at the end answers as soon as a record is written.
    poll = asyncio.ensure_future(
        reads.read_partition(transport, topic, 1, 0, limit=10, wait_ms=10_000)
    )
    await asyncio.sleep(0.5)  # behaviour: the poll, parked at the end, does not answer early
    assert not poll.done()
    w = await ns.open_writer(f"{topic}~1")
    await w.write(LogRecord(b"late", headers=[("h", b"1")]))
    page = await asyncio.wait_for(poll, scaled(10))
    # Answered with the record, not at the end of its 10 s wait (an empty page).
    assert [list(r) for r in page.rows] == [[0, page.rows[0][1], None, b"late", [("h", b"1")], 0]]
    await w.close()


async def _take(fetch: PartitionFetch, woke: asyncio.Event, want: int) -> list[ConsumerRecord]:
    """At least ``want`` records taken from ``fetch``, 333 at a time, as it wakes us."""
    got: list[ConsumerRecord] = []

    async def took_all() -> bool:  # one turn: wait for a wake-up, take what is buffered
        if not fetch.buffered:
            await asyncio.wait_for(woke.wait(), scaled(10))
        woke.clear()
        assert fetch.buffered <= 1500 + 700  # the fetch stays within its buffer bound
        got.extend(fetch.take(333))
        return len(got) >= want

    await wait_for(took_all, lambda: f"{want} records fetched, got {len(got)}",
                   timeout_s=20, interval_s=0)  # fmt: skip
    return got


@pytest.mark.integration
async def test_fetchers_core_and_proxy_agree(ns: Namespace, client: ProxyClient) -> None:
    topic = await _topic(ns, 1, [3000])
    woke = asyncio.Event()
    for fetchers in (CoreFetchers(ns), ProxyFetchers(client.transport)):
        source = fetchers.source((topic, 0))
        fetch = PartitionFetch(
            (topic, 0), source, 1000, fetch_records_max=700, buffered_records_max=1500,
            fetch_wait_s=0.2, wake=woke.set,
        )  # fmt: skip
        got = await _take(fetch, woke, 2000)
        assert [r.offset for r in got] == list(range(1000, 3000))
        assert got[0].value == b"0-1000" and got[0].key == b"k1" and got[0].topic == topic
        await fetch.close()
        await source.close()
        assert await fetchers.offset_at((topic, 0), "latest") == 3000
        # A fetch past the end stops with OUT_OF_RANGE for the consumer to act on.
        bad = PartitionFetch(
            (topic, 0), fetchers.source((topic, 0)), 3001, fetch_records_max=10,
            buffered_records_max=10, fetch_wait_s=0.1, wake=woke.set,
        )  # fmt: skip
        await asyncio.wait_for(woke.wait(), scaled(10))
        woke.clear()
        assert isinstance(bad.error, OutOfRangeError)
        await bad.close()


@pytest.mark.integration
async def test_subscriptions_over_http(ns: Namespace, client: ProxyClient) -> None:
    stream = f"s{_uid()}"
    await ns.create_stream(stream)
    assert await client.committed(stream, "app") is None
    assert await client.commit(stream, "app", DLSN(1, 5, 0)) is True
    assert await client.commit(stream, "app", DLSN(1, 2, 0)) is False
    assert await client.committed(stream, "app") == DLSN(1, 5, 0)
    assert await ns.committed(stream, "app") == DLSN(1, 5, 0)  # the core's own record
    assert await client.list_subscribers(stream) == ["app"]
    with pytest.raises(NotFoundError):
        await client.committed(f"missing{_uid()}", "app")
    page = await client.read_partition(await _topic(ns, 1, [3]), 0, 1)
    assert [r[0] for r in page.rows] == [1, 2] and page.next_offset == 3


# -- GroupConsumer on the real coordinator (members in this process) ----------------------

FAST = ConsumerConfig(
    session_timeout_ms=3_000,
    auto_offset_reset="earliest",
    auto_commit_interval_ms=200,
    fetch_wait_ms=200,
)


async def _consumer(
    cluster: LocalCluster, group: str, topic: str, via: str = "proxy", **kwargs: object
) -> GroupConsumer:
    config = kwargs.pop("config", FAST)
    assert isinstance(config, ConsumerConfig)
    return await GroupConsumer.from_cluster_file(
        cluster.dir / "cluster.json", group, [topic], via=via, config=config,
        client_config=CLIENT_CONFIG, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


async def _poll_each(consumers: list[GroupConsumer]) -> list[ConsumerRecord]:
    return [r for c in consumers for r in await c.poll(timeout_s=0.05)]


async def _drain(
    consumers: list[GroupConsumer], want: int, timeout_s: float = 30
) -> list[ConsumerRecord]:
    """At least ``want`` records, polled from each consumer in turn."""
    got: list[ConsumerRecord] = []

    async def enough() -> bool:
        got.extend(await _poll_each(consumers))
        return len(got) >= want

    await wait_for(enough, lambda: f"{want} records, got {len(got)}",
                   timeout_s=timeout_s, interval_s=0)  # fmt: skip
    return got


@pytest.mark.integration
@pytest.mark.parametrize("via", ["proxy", "core"])
async def test_group_reads_everything_once_and_commits(
    proxy_cluster: LocalCluster, ns: Namespace, via: str
) -> None:
    topic = await _topic(ns, 4, [100, 50, 0, 75])
    group = f"g{_uid()}"
    consumers = [await _consumer(proxy_cluster, group, topic, via) for _ in range(2)]
    try:
        got = await _drain(consumers, 225)
        assert sorted((r.partition, r.offset) for r in got) == sorted(
            [(0, i) for i in range(100)] + [(1, i) for i in range(50)] + [(3, i) for i in range(75)]
        )

        async def handed_off() -> bool:
            assert await _poll_each(consumers) == []
            return len(consumers[0].assignment() | consumers[1].assignment()) == 4

        await wait_for(handed_off, "the hand-off to the second member", timeout_s=15)
        owners = [c.assignment() for c in consumers]
        assert owners[0] | owners[1] == {(topic, p) for p in range(4)}
        assert not owners[0] & owners[1]
        # Per partition, in offset order.
        for p in range(4):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == sorted(offsets)
        for c in consumers:
            await c.commit()
        assert await consumers[0].committed((topic, 0)) == 100
        assert await consumers[0].committed((topic, 2)) == 0  # its position, committed
        c0 = consumers[0]
        tp = sorted(c0.assignment())[0]
        c0.seek(tp, 10)
        again = await _drain([c0], 1)
        assert again[0].tp == tp and again[0].offset == 10
    finally:
        for c in consumers:
            await c.close()


@pytest.mark.integration
async def test_lag_before_and_after_consumption(proxy_cluster: LocalCluster, ns: Namespace) -> None:
    topic = await _topic(ns, 3, [40, 0, 25])
    group = f"g{_uid()}"
    c = await _consumer(proxy_cluster, group, topic, "core")
    try:
        cc = c._coordinator
        desc = await cc.describe(group)
        assert desc["lag"] == 65  # nothing committed: end - start
        assert {p["partition"]: p["lag"] for p in desc["partitions"]} == {0: 40, 1: 0, 2: 25}
        got = await _drain([c], 65)
        assert len(got) == 65
        await c.commit()
        assert (await cc.describe(group))["lag"] == 0
        w = await ns.open_writer(f"{topic}~1")
        await w.write_many([LogRecord(b"x")] * 7)
        await w.close()
        desc = await cc.describe(group)
        assert {p["partition"]: p["lag"] for p in desc["partitions"]} == {0: 0, 1: 7, 2: 0}
    finally:
        await c.close()


@pytest.mark.integration
async def test_pause_resume_seek_and_offset_reset(
    proxy_cluster: LocalCluster, ns: Namespace
) -> None:
    topic = await _topic(ns, 2, [30, 30])
    group = f"g{_uid()}"
    latest = ConsumerConfig(session_timeout_ms=3_000, auto_offset_reset="latest", fetch_wait_ms=200)
    c = await _consumer(proxy_cluster, group, topic, config=latest)
    try:
        assert await c.poll(timeout_s=1.0) == []  # latest: nothing old
        tp0, tp1 = (topic, 0), (topic, 1)
        assert c.assignment() == {tp0, tp1}
        assert c.position(tp0) == 30
        c.seek_to_beginning([tp0])
        c.pause([tp1])
        c.seek(tp1, 5)
        got = await _drain([c], 30, timeout_s=10)
        assert {r.tp for r in got} == {tp0} and [r.offset for r in got] == list(range(30))
        assert c.paused() == {tp1}
        c.resume([tp1])
        got = await _drain([c], 25, timeout_s=10)
        assert [r.offset for r in got] == list(range(5, 30))
        c.seek_to_timestamp(int(time.time() * 1000) + 60_000)  # after everything: the end
        assert await c.poll(timeout_s=0.5) == []
        assert c.position(tp0) == 30
        with pytest.raises(NotAssignedError):
            await c.commit({(topic, 9): 1})
        await c.commit({tp0: 12})
        assert await c.committed(tp0) == 12
        # Past the end: OUT_OF_RANGE from the fetch, reset to the policy (latest).
        c.seek(tp0, 500)
        assert await c.poll(timeout_s=1.0) == []
        assert c.position(tp0) == 30
    finally:
        await c.close()


@pytest.mark.integration
def test_sync_consumer_runs_callbacks_in_the_polling_thread(proxy_cluster: LocalCluster) -> None:
    import threading

    topic = asyncio.run(_sync_topic(proxy_cluster))
    calls: list[tuple[str, list[tuple[str, int]], str]] = []
    consumer: SyncGroupConsumer

    def on_assign(tps: list[tuple[str, int]]) -> None:
        calls.append(("assign", tps, threading.current_thread().name))
        consumer.seek(tps[0], 3)  # the consumer may be used from its callbacks

    def on_revoke(tps: list[tuple[str, int]]) -> None:
        calls.append(("revoke", tps, threading.current_thread().name))
        consumer.commit()

    consumer = SyncGroupConsumer.from_cluster_file(
        proxy_cluster.dir / "cluster.json", f"g{_uid()}", [topic], config=FAST,
        client_config=CLIENT_CONFIG, on_assign=on_assign, on_revoke=on_revoke,
    )  # fmt: skip
    with consumer:
        got: list[ConsumerRecord] = []

        def took_seven() -> bool:
            got.extend(consumer.poll(timeout_s=0.2))
            return len(got) >= 7

        wait_until(took_seven, lambda: f"7 records, got {got}", timeout_s=20, interval_s=0)
        assert [r.offset for r in got] == list(range(3, 10))
    me = threading.current_thread().name
    assert calls == [("assign", [(topic, 0)], me), ("revoke", [(topic, 0)], me)]


async def _sync_topic(cluster: LocalCluster) -> str:
    async with await Namespace.open(cluster.zk_connect, "/bookline", "default") as n:
        return await _topic(n, 1, [10])


@pytest.mark.integration
async def test_cli_consume_prints_and_commits(proxy_cluster: LocalCluster, ns: Namespace) -> None:
    topic = await _topic(ns, 2, [5, 5])
    group = f"g{_uid()}"
    argv = [sys.executable, "-m", "ops.cli", "consume", topic, "--group", group,
            "--cluster", str(proxy_cluster.dir / "cluster.json")]  # fmt: skip

    async def run(*extra: str) -> list[str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        out, _err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        return out.decode().splitlines()

    first = await run("--from", "earliest", "--max", "6", "--json")
    assert len(first) == 6
    recs = [json.loads(line) for line in first]
    assert {r["topic"] for r in recs} == {topic} and all(r["value"] for r in recs)
    # A second run goes on after what the first printed (committed at exit).
    rest = await run("--from", "earliest", "--idle-exit-s", "2")
    assert sorted(rest + [r["value"] for r in recs]) == sorted(
        [f"{p}-{i}" for p in range(2) for i in range(5)]
    )
