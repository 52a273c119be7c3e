"""Topics through the write proxies as real processes (ZooKeeper, 3 bookies, 2 write
proxies; ``proxy_cluster``): admin over HTTP and the thin client, bad input answered
with stable codes and nothing changed, Kafka's partitioning across client instances,
offsets across segment rolls, and an idempotent produce across a proxy failover."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bookline import Namespace, NamespaceConfig, StartPosition, StreamOptions, TopicOptions
from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    InvalidNameError,
    NotFoundError,
    UnknownPartitionError,
)
from foundation.names import partition_stream
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.records import LogRecord
from tests.values import values
from tests.waiting import scaled, wait_for
from thinclient.client import ClientConfig, ProxyClient, SyncProxyClient
from thinclient.routing import rendezvous

pytestmark = pytest.mark.integration

# The retry deadline is the test's patience with a failover (scaled: tests.waiting).
CLIENT_CONFIG = ClientConfig(
    batch_bytes_max=1 << 20,
    buffer_bytes_max=8 << 20,
    proxy_down_ms=1_000,
    retry_deadline_ms=int(scaled(40.0) * 1000),
)
# Kafka's own murmur2 test vectors (UtilsTest.testMurmur2): its default partitioner puts
# key k in partition toPositive(murmur2(k)) % N.
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
    "kafka": -798503068,
}


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _wurls(cluster: LocalCluster) -> list[str]:
    return [p.extra["url"] for p in cluster.write_proxies]


def _client(cluster: LocalCluster) -> ProxyClient:
    return ProxyClient(write_urls=_wurls(cluster), config=CLIENT_CONFIG)


@pytest.fixture
async def client(proxy_cluster: LocalCluster) -> AsyncIterator[ProxyClient]:
    async with _client(proxy_cluster) as c:
        yield c


@pytest.fixture
async def core(proxy_cluster: LocalCluster) -> AsyncIterator[Namespace]:
    ns = await Namespace.open(
        proxy_cluster.zk_connect, CLUSTER_ROOT, "default", NamespaceConfig(session_timeout_ms=4000)
    )
    try:
        yield ns
    finally:
        await ns.close()


async def _http(
    method: str, url: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, json=body) as resp,
    ):
        return resp.status, await resp.json()


async def _partition_payloads(core: Namespace, stream: str) -> list[bytes]:
    info = await core.stream_info(stream)
    if info.next_sequence_id == 0:
        return []
    reader = await core.open_reader(stream, StartPosition.earliest())
    try:
        recs = await reader.read_many(info.next_sequence_id, timeout_s=10)
        while len(recs) < info.next_sequence_id:
            more = await reader.read_many(info.next_sequence_id - len(recs), timeout_s=10)
            assert more, f"{stream}: records missing"
            recs += more
    finally:
        await reader.close()
    assert [r.sequence_id for r in recs] == list(range(len(recs)))
    return values(recs)


async def test_topic_admin_over_http_and_bad_input_changes_nothing(
    proxy_cluster: LocalCluster,
) -> None:
    base = _wurls(proxy_cluster)[0] + "/v1"
    t = f"http-{_uid()}"
    status, body = await _http("POST", f"{base}/topics", {"name": t, "partitions": 3,
                                                          "retention_ms": 3_600_000})  # fmt: skip
    assert status == 201, body
    assert body["partitions"] == 3 and body["options"]["retention_ms"] == 3_600_000
    assert t in (await _http("GET", f"{base}/topics"))[1]["topics"]
    status, parts = await _http("GET", f"{base}/topics/{t}/partitions")
    assert status == 200
    assert [(p["partition"], p["stream"], p["end_offset"]) for p in parts["partitions"]] == [
        (i, f"{t}~{i}", 0) for i in range(3)
    ]

    bad: list[tuple[str, str, dict[str, Any] | None, int, int]] = [
        ("POST", "/topics", {"name": f"z-{t}", "partitions": 0}, 400, 2),
        ("POST", "/topics", {"name": f"z-{t}", "partitions": -2}, 400, 2),
        ("POST", "/topics", {"name": f"z-{t}"}, 400, 2),
        ("POST", "/topics", {"name": f"z-{t}", "partitions": 1, "color": "red"}, 400, 2),
        ("POST", "/topics", {"name": "a/b", "partitions": 1}, 400, 13),
        ("POST", "/topics", {"name": f"{t}~1", "partitions": 1}, 400, 13),
        ("POST", "/topics", {"name": t, "partitions": 5}, 409, 16),
        ("PATCH", f"/topics/{t}", {"partitions": 2}, 400, 2),
        ("PATCH", f"/topics/{t}", {"partitions": 0}, 400, 2),
        ("PATCH", f"/topics/{t}", {"partitions": 4, "retention_ms": 1}, 400, 2),
        ("PATCH", f"/topics/nope-{t}", {"partitions": 4}, 404, 17),
        ("POST", f"/topics/{t}/partitions/3/records", {"payload": "x"}, 404, 47),
        ("POST", f"/topics/{t}/partitions/-1/records", {"payload": "x"}, 400, 2),
        ("POST", f"/topics/{t}/partitions/01/records", {"payload": "x"}, 400, 2),
        ("POST", f"/topics/nope-{t}/partitions/0/records", {"payload": "x"}, 404, 17),
        ("POST", f"/streams/{t}~0/records", {"payload": "x"}, 400, 13),
        ("POST", "/streams", {"name": t}, 409, 16),  # a topic's name is taken
        ("DELETE", f"/topics/nope-{t}", None, 404, 17),
    ]
    for method, path, req, want_status, want_code in bad:
        status, answer = await _http(method, base + path, req)
        assert (status, answer.get("code")) == (want_status, want_code), (method, path, answer)
        assert answer["name"] and answer["message"]
    status, after = await _http("GET", f"{base}/topics/{t}/partitions")
    assert after == parts  # nothing changed
    assert f"z-{t}" not in (await _http("GET", f"{base}/topics"))[1]["topics"]

    stream = f"s-{_uid()}"
    assert (await _http("POST", f"{base}/streams", {"name": stream}))[0] == 201
    status, answer = await _http("POST", f"{base}/topics", {"name": stream, "partitions": 1})
    assert (status, answer["code"]) == (409, 16), answer

    status, body = await _http("PATCH", f"{base}/topics/{t}", {"partitions": 5})
    assert (status, body["partitions"]) == (200, 5)
    status, written = await _http(
        "POST", f"{base}/topics/{t}/partitions/4/records", {"payloads": ["a", "b"]}
    )
    assert status in (200, 307), written
    if status == 307:
        status, written = await _http("POST", written["owner"] + f"/v1/topics/{t}/partitions/4/"
                                      "records", {"payloads": ["a", "b"]})  # fmt: skip
    assert written["offsets"] == [0, 1], written
    assert (await _http("DELETE", f"{base}/topics/{t}"))[0] == 200
    assert (await _http("GET", f"{base}/topics/{t}"))[0] == 404


async def test_same_key_same_partition_across_clients_as_kafka_computes(
    proxy_cluster: LocalCluster, client: ProxyClient, core: Namespace
) -> None:
    t = f"keys-{_uid()}"
    await client.create_topic(t, 6)
    keys = list(KAFKA_MURMUR2)
    first = [await client.send(t, f"v1-{k}", key=k) for k in keys]
    async with _client(proxy_cluster) as other:  # another producer id, another cache
        second = await other.send_many(t, [LogRecord(f"v2-{k}".encode(), key=k.encode())
                                           for k in keys])  # fmt: skip
    kafka = [(h & 0x7FFFFFFF) % 6 for h in KAFKA_MURMUR2.values()]
    assert [p for p, _o in first] == kafka
    assert [p for p, _o in second] == kafka
    # Unkeyed records: sticky batches that reach every partition.
    unkeyed: list[tuple[int, int]] = []
    for _ in range(60):
        unkeyed += await client.send_many(t, [b"u"] * 5)
    assert {p for p, _o in unkeyed} == set(range(6))
    # Offsets per partition: 0, 1, 2, ... in send order, and what the partition holds.
    everything = first + second + unkeyed
    for p in range(6):
        offsets = [o for q, o in everything if q == p]
        assert offsets == list(range(len(offsets))), (p, offsets)
        payloads = await _partition_payloads(core, partition_stream(t, p))
        assert len(payloads) == len(offsets)
    # Explicit partitions, growth picked up, bad partitions refused.
    assert (await client.send(t, b"x", partition=5))[0] == 5
    with pytest.raises(UnknownPartitionError):
        await client.send(t, b"x", partition=6)
    with pytest.raises(UnknownPartitionError):
        await client.send_many(t, [b"x"], partition=6)
    async with _client(proxy_cluster) as admin:
        await admin.alter_partitions(t, 8)
    assert await client.send(t, b"grown", partition=7) == (7, 0)  # refreshed on the miss
    with pytest.raises(NotFoundError):
        await client.send(f"missing-{t}", b"x")


async def test_topic_admin_through_the_clients(client: ProxyClient) -> None:
    t = f"adm-{_uid()}"
    options = TopicOptions(retention_bytes=1 << 30, write_quorum=2)
    created = await client.create_topic(t, 2, options)
    assert created.options == StreamOptions(
        retention_bytes=1 << 30, ensemble_size=3, write_quorum=2, ack_quorum=2
    )
    assert t in await client.list_topics()
    assert (await client.get_topic(t)).partitions == 2
    with pytest.raises(BadRequestError):
        await client.alter_partitions(t, 1)
    with pytest.raises(BadRequestError):
        await client.create_topic(f"z{t}", 0)
    with pytest.raises(InvalidNameError):
        await client.create_topic("bad name", 1)
    with pytest.raises(AlreadyExistsError):
        await client.create_topic(t, 2)
    # The stream API takes keys, headers and LogRecords too.
    s = f"kh-{_uid()}"
    await client.write(s, b"v", key=b"k", headers={"h": "1"})
    await client.write(s, LogRecord(b"w", key=b"k2"))
    assert (await client.alter_partitions(t, 3)).partitions == 3
    sent = await client.send(t, "hello", key="k", headers={"trace": "abc"})
    parts = (await client.describe_topic(t)).partitions
    assert parts[sent[0]].end_offset == sent[1] + 1
    assert parts[sent[0]].owner is not None
    await client.delete_topic(t)
    assert t not in await client.list_topics()


def test_sync_client_sends(proxy_cluster: LocalCluster) -> None:
    with SyncProxyClient(write_urls=_wurls(proxy_cluster), config=CLIENT_CONFIG) as c:
        t = f"sync-{_uid()}"
        c.create_topic(t, 2)
        assert c.partitions_for(t) == 2
        p, offset = c.send(t, b"a", key=b"k")
        assert offset == 0
        assert c.send_async(t, b"b", key=b"k").result(30) == (p, 1)
        assert c.send_many(t, [b"c"], partition=p) == [(p, 2)]
        c.delete_topic(t)


async def test_offsets_continue_across_segment_rolls(client: ProxyClient, core: Namespace) -> None:
    t = f"roll-{_uid()}"
    await client.create_topic(t, 1, TopicOptions(segment_rollover_bytes=4096))
    sent: list[tuple[int, int]] = []
    for b in range(20):
        sent += await client.send_many(t, [b"%04d" % (b * 10 + i) + b"x" * 96 for i in range(10)])
    assert sent == [(0, i) for i in range(200)]
    assert len(await core.segments(partition_stream(t, 0))) > 3
    payloads = await _partition_payloads(core, partition_stream(t, 0))
    assert [int(p[:4]) for p in payloads] == list(range(200))


async def test_deleted_and_recreated_topic_starts_afresh_on_every_proxy(
    proxy_cluster: LocalCluster, client: ProxyClient, core: Namespace
) -> None:
    """Partitions owned by both proxies; the topic deleted through one of them and
    created again: every partition takes writes from offset 0 into the new streams."""
    urls = _wurls(proxy_cluster)
    # Owners follow a hash of the name and the proxies' URLs (random ports): with 6
    # partitions one proxy owns all of them for about 1 name in 32, so pick a name
    # whose partitions both proxies own.
    t = next(
        name
        for name in (f"again-{_uid()}" for _ in range(100))
        if len({rendezvous(partition_stream(name, p), urls) for p in range(6)}) == 2
    )
    await client.create_topic(t, 6)
    owners = {rendezvous(partition_stream(t, p), urls) for p in range(6)}
    assert len(owners) == 2, "both proxies own some partitions"
    for p in range(6):
        assert await client.send(t, b"old", partition=p) == (p, 0)
    async with ProxyClient(write_urls=urls[:1], config=CLIENT_CONFIG) as one:
        await one.delete_topic(t)
        await one.create_topic(t, 6)
    for p in range(6):
        assert await client.send(t, b"new-%d" % p, partition=p) == (p, 0)
        # A reader sees a record once its LAC reaches the bookies, about one round trip
        # after the ack (ledger/lac_push.py): wait for it, then check it is the only one.
        stream = partition_stream(t, p)
        visible = functools.partial(_partition_payloads, core, stream)
        payloads = await wait_for(visible, f"{stream}'s record")
        assert payloads == [b"new-%d" % p]


# -- failover (last: it kills a proxy and restarts it) ------------------------------------


async def test_produce_is_idempotent_across_a_proxy_failover(
    proxy_cluster: LocalCluster, client: ProxyClient, core: Namespace
) -> None:
    urls = _wurls(proxy_cluster)
    victim = proxy_cluster.write_proxies[0]

    def victims(topic: str) -> list[int]:
        owner = victim.extra["url"]
        return [p for p in range(6) if rendezvous(partition_stream(topic, p), urls) == owner]

    # A topic whose partitions both proxies own (for 1 name in 32 one proxy owns all 6).
    t = next(name for name in (f"fo-{_uid()}" for _ in range(1000)) if 0 < len(victims(name)) < 6)
    owned = victims(t)
    await client.create_topic(t, 6)
    acked: list[tuple[bytes, int, int]] = []
    stop = asyncio.Event()

    async def produce(worker: int) -> None:
        i = 0
        while not stop.is_set():
            values = [f"{worker}-{i + k}".encode() for k in range(5)]
            keys = [f"key-{worker}-{(i + k) % 17}".encode() for k in range(5)]
            records = [LogRecord(v, key=k) for v, k in zip(values, keys, strict=True)]
            sent = await client.send_many(t, records)
            acked.extend((v, p, o) for v, (p, o) in zip(values, sent, strict=True))
            i += 5

    def acked_on_owned(since: int, at_least: int) -> bool:
        for task in producers:
            if task.done():  # a producer that failed fails the wait at once
                task.result()
        return sum(1 for _v, p, _o in acked[since:] if p in owned) >= at_least

    producers = [asyncio.ensure_future(produce(w)) for w in range(8)]
    try:
        await wait_for(lambda: acked_on_owned(0, 40), "produce acknowledged by the victim")
        before = len(acked)
        procs.kill9(victim.proc)
        await wait_for(
            lambda: acked_on_owned(before, 1), "produce to resume after failover", timeout_s=30
        )
        resumed = len(acked)
        # The producers keep writing to the moved partitions for a while.
        await wait_for(lambda: acked_on_owned(resumed, 40), "more produce after failover")
        stop.set()
        await asyncio.gather(*producers)
    finally:
        stop.set()
        for task in producers:
            task.cancel()
        await asyncio.gather(*producers, return_exceptions=True)
        proxy_cluster.restart_proxy(victim)
    by_partition: dict[int, dict[int, bytes]] = {}
    for value, p, offset in acked:
        assert offset not in by_partition.setdefault(p, {}), "two records with one offset"
        by_partition[p][offset] = value
    for p in range(6):
        payloads = await _partition_payloads(core, partition_stream(t, p))
        assert len(payloads) == len(set(payloads)), f"partition {p}: duplicates"
        for offset, value in by_partition.get(p, {}).items():
            assert payloads[offset] == value, f"partition {p} offset {offset}"
        # Beyond what was acknowledged: only writes whose answers died with the proxy.
        assert len(payloads) - len(by_partition.get(p, {})) <= 5 * 8
