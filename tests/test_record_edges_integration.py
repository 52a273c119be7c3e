"""Issue 24's record model through every edge, on the shared proxy cluster (ZooKeeper, 3
bookies, 2 write proxies, a read proxy): headers as Kafka's ordered pairs (a repeated
name, a null value), null values and producer timestamps written by the thin client, a
raw HTTP body, the core topic producer and the CLI, and read back unchanged -- with
their timestamp type -- by the thin client (pages, record sets, WebSocket tail,
partition pages), raw HTTP JSON, the WebSocket tail in JSON, group consumers through
the read proxy and from the bookies, and ``consume --json``.

Item 1: copies of a topic written by a proxy producer (through Spark with
``includeHeaders=true`` and through a consumer-producer loop) hold no ``bl.*`` header,
and a later write of the same producer id to the copy is written, not dropped as a
retry of the copied markers' batch.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bookline import Namespace, NamespaceConfig
from groups.consumer import ConsumerConfig, GroupConsumer
from groups.fetchers import ConsumerRecord
from groups.producer import TopicProducer
from groups.topics import TopicAdmin
from httpapi import wire
from ops.cluster.local import LocalCluster
from streams.dlsn import StartPosition
from streams.records import CREATE_TIME, ReadRecord
from tests.cli_support import run_cli
from tests.waiting import scaled, wait_for
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

CLIENT_CONFIG = ClientConfig(
    batch_bytes_max=1 << 20,
    buffer_bytes_max=8 << 20,
    proxy_down_ms=1_000,
    retry_deadline_ms=int(scaled(40.0) * 1000),
)
FAST = ConsumerConfig(
    session_timeout_ms=3_000,
    auto_offset_reset="earliest",
    auto_commit_interval_ms=200,
    fetch_wait_ms=200,
)
# Kafka's headers at their hardest: a repeated name and a null value; and a value that
# is not UTF-8 (JSON bodies carry those base64).
PAIRS: list[tuple[str, bytes | None]] = [("a", b"1"), ("n", None), ("a", b"2")]
BINARY: list[tuple[str, bytes | None]] = [("b", b"\xff\x00"), ("b", None)]
TS = 1_600_000_000_000  # a producer's timestamp: 2020-09-13, long before any append
# (key, value, headers, producer timestamp) of the records every test writes.
SENT: list[tuple[bytes | None, bytes | None, Any, int | None]] = [
    (b"k", None, PAIRS, TS),  # a tombstone with headers
    (None, b"\xff", BINARY, TS + 1),
    (b"k2", b"plain", None, None),  # the log stamps it
]


def _uid() -> str:
    return uuid.uuid4().hex[:8]


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


def _check(got: list[tuple[Any, Any, Any, int, int]], since_ms: int) -> None:
    """``got`` = (key, value, headers, timestamp_ms, timestamp_type) of SENT's records."""
    assert [g[:3] for g in got] == [s[:3] for s in SENT]
    assert [g[3] for g in got[:2]] == [TS, TS + 1]  # the producer's, kept
    assert got[2][3] >= since_ms  # stamped by the log at append
    assert {g[4] for g in got} == {CREATE_TIME}


def _of_records(recs: list[ReadRecord]) -> list[tuple[Any, Any, Any, int, int]]:
    return [(r.key, r.payload, r.headers, r.timestamp_ms, r.timestamp_type) for r in recs]


def _of_consumed(recs: list[ConsumerRecord]) -> list[tuple[Any, Any, Any, int, int]]:
    return [(r.key, r.value, r.headers, r.timestamp_ms, r.timestamp_type) for r in recs]


async def _consume(cluster: LocalCluster, topic: str, via: str, want: int) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    consumer = await GroupConsumer.from_cluster_file(
        cluster.dir / "cluster.json", f"g{_uid()}", [topic], via=via, config=FAST,
        client_config=CLIENT_CONFIG,
    )  # fmt: skip
    try:

        async def enough() -> bool:
            got.extend(await consumer.poll(timeout_s=0.2))
            return len(got) >= want

        await wait_for(enough, lambda: f"{want} records via {via}, got {len(got)}",
                       timeout_s=scaled(30), interval_s=0)  # fmt: skip
    finally:
        await consumer.close()
    return sorted(got, key=lambda r: r.offset)


async def _stream_readers_see_sent(
    cluster: LocalCluster, client: ProxyClient, stream: str, since_ms: int
) -> None:
    """A plain stream's readers: pages, record sets, the WebSocket tail, and JSON."""
    _check(_of_records((await client.read(stream, "earliest", limit=10)).records), since_ms)
    sets: list[ReadRecord] = []
    batches = client.catch_up(stream, "earliest", wait_ms=1000)  # an open stream: no end
    async for batch in batches:
        sets += batch
        if len(sets) >= len(SENT):
            break
    await batches.aclose()
    _check(_of_records(sets), since_ms)
    tail = client.tail(stream, "earliest")
    tailed = [await anext(tail) for _ in SENT]
    await tail.aclose()
    _check(_of_records(tailed), since_ms)
    await _json_views_show_pairs(cluster, stream)


async def _topic_readers_see_sent(
    cluster: LocalCluster, client: ProxyClient, topic: str, since_ms: int
) -> None:
    """A topic's readers: partition pages, group consumers (read proxy and bookies)."""
    rows = (await client.read_partition(topic, 0, 0)).rows
    _check([(k, v, h, ts, tt) for _o, ts, k, v, h, tt in rows], since_ms)
    for via in ("proxy", "core"):
        _check(_of_consumed(await _consume(cluster, topic, via, len(SENT))), since_ms)


async def _json_views_show_pairs(cluster: LocalCluster, stream: str) -> None:
    """What a human with curl (or a browser's WebSocket) sees: pairs, nulls, ts_type."""
    rurl = str(cluster.read_proxies[0].extra["url"])
    url = f"{rurl}/v1/streams/{stream}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/records?from=earliest", headers={"Accept": wire.JSON}) as r:
            assert r.status == 200, await r.text()
            page = await r.json()
        async with http.ws_connect(
            f"{url.replace('http', 'ws', 1)}/tail?from=earliest&format=json"
        ) as ws:
            frames: list[dict[str, Any]] = []
            while sum(len(f["records"]) for f in frames) < len(SENT):
                frames.append(json.loads((await ws.receive(timeout=scaled(30))).data))
    for records in (page["records"], [r for f in frames for r in f["records"]]):
        first, second, third = records[:3]
        assert first["payload"] is None and first["key"] == "k"
        assert first["headers"] == [["a", "1"], ["n", None], ["a", "2"]]
        assert (first["ts"], first["ts_type"]) == (TS, "CreateTime")
        assert second["headers_b64"] == [["b", "/wA="], ["b", None]]
        assert second["payload_b64"] == "/w=="
        assert "headers" not in third and third["ts_type"] == "CreateTime"


async def test_thin_client_writes_round_trip_through_every_reader(
    proxy_cluster: LocalCluster, client: ProxyClient
) -> None:
    topic, stream = f"rec{_uid()}", f"rec{_uid()}"
    await client.create_topic(topic, 1)
    since_ms = await _now_ms(client, topic)
    for key, value, headers, ts in SENT:
        await client.send(topic, value, key, headers, timestamp_ms=ts)
        await client.write(stream, value, key, headers, timestamp_ms=ts)
    await _topic_readers_see_sent(proxy_cluster, client, topic, since_ms)
    await _stream_readers_see_sent(proxy_cluster, client, stream, since_ms)


async def test_a_raw_http_body_round_trips_through_every_reader(
    proxy_cluster: LocalCluster, client: ProxyClient
) -> None:
    """A JSON body with headers as [name, value] pairs, a null payload and timestamps,
    posted by hand to a stream's and to a topic partition's owner."""
    topic, stream = f"rec{_uid()}", f"rec{_uid()}"
    await client.create_topic(topic, 1)
    since_ms = await _now_ms(client, topic)
    body = {"producer": f"p{_uid()}", "seq": 0, "records": [
        {"payload": None, "key": "k", "headers": [["a", "1"], ["n", None], ["a", "2"]],
         "timestamp": TS},
        {"payload_b64": "/w==", "headers_b64": [["b", "/wA="], ["b", None]], "timestamp": TS + 1},
        {"payload": "plain", "key": "k2"},
    ]}  # fmt: skip
    await _post(proxy_cluster, f"/v1/streams/{stream}/records", body)
    await _post(proxy_cluster, f"/v1/topics/{topic}/partitions/0/records", body)
    await _topic_readers_see_sent(proxy_cluster, client, topic, since_ms)
    await _stream_readers_see_sent(proxy_cluster, client, stream, since_ms)


async def test_topic_producer_round_trips_through_every_reader(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace
) -> None:
    topic = f"rec{_uid()}"
    await TopicAdmin(ns).create_topic(topic, 1)
    since_ms = await _now_ms(client, topic)
    producer = TopicProducer(ns)
    try:
        for key, value, headers, ts in SENT:
            await producer.send(topic, value, key, headers, 0, timestamp_ms=ts)
    finally:
        await producer.close()
    await _topic_readers_see_sent(proxy_cluster, client, topic, since_ms)


def test_cli_produce_and_consume_json(proxy_cluster: LocalCluster) -> None:
    """``produce --header`` repeated (order and repeats kept, ``n`` alone a null value),
    ``--null-value`` and ``--timestamp``; ``consume --json`` shows them."""
    cluster = proxy_cluster.dir / "cluster.json"
    topic = f"rec{_uid()}"
    env = {"BOOKLINE_CLUSTER": str(cluster)}
    made = run_cli("topic", "create", topic, "--partitions", "1", env=env)
    assert made.returncode == 0, made.stderr
    sent = run_cli("produce", topic, "--key", "k", "--header", "a=1", "--header", "n",
                   "--header", "a=2", "--null-value", "NULL", "--timestamp", str(TS),
                   stdin="first\nNULL\n", env=env)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    got = run_cli("consume", topic, "--group", f"g{_uid()}", "--from", "earliest",
                  "--limit", "2", "--json", env=env)  # fmt: skip
    assert got.returncode == 0, got.stderr
    lines = [json.loads(line) for line in got.stdout.splitlines()]
    assert [(r["value"], r["key"], r["ts"], r["ts_type"]) for r in lines] == [
        ("first", "k", TS, "CreateTime"),
        (None, "k", TS, "CreateTime"),
    ]
    assert all(r["headers"] == [["a", "1"], ["n", None], ["a", "2"]] for r in lines)


async def _now_ms(client: ProxyClient, topic: str) -> int:
    """A lower bound of the log's clock now (what a record stamped later must carry):
    the timestamp a probe record of another stream gets."""
    probe = f"{topic}-clock"
    await client.write(probe, b"probe")
    (rec,) = (await client.read(probe, "earliest", limit=1)).records
    await client.delete_stream(probe)
    return rec.timestamp_ms


async def _post(cluster: LocalCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as JSON to ``path`` of the owning write proxy (one redirect followed by
    hand, the body sent again)."""
    url = str(cluster.write_proxies[0].extra["url"])
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(f"{url}{path}", json=body, allow_redirects=False) as resp:
                answer = await resp.json()
                if resp.status == 307:
                    url = answer["owner"]
                    continue
                assert resp.status == 200, answer
                assert isinstance(answer, dict)
                return answer
    raise AssertionError(f"{path}: redirected twice")


# -- item 1: copies hold nothing internal, and nothing copied fakes a retry ---------------


async def _written_by_a_proxy_producer(
    cluster: LocalCluster, client: ProxyClient, topic: str, producer: str
) -> None:
    """Records written through a write proxy by producer id ``producer`` (the proxy
    marks its batches for de-duplication) with user headers."""
    await client.create_topic(topic, 1)
    body = {"producer": producer, "seq": 0, "records": [
        {"payload": f"r{i}", "key": "k", "headers": [["user", str(i)]]} for i in range(5)
    ]}  # fmt: skip
    await _post(cluster, f"/v1/topics/{topic}/partitions/0/records", body)


async def _same_producer_writes_to(
    cluster: LocalCluster, client: ProxyClient, topic: str, producer: str
) -> None:
    """The copy's stream is taken over by a write proxy (which rebuilds its producer
    table from the stream's log) and ``producer`` writes sequence 0 again: a new
    record, not a retry of the source's batch."""
    path = f"/v1/topics/{topic}/partitions/0/records"
    body = {"producer": producer, "seq": 0, "records": [{"payload": "after the copy"}]}
    answer = await _post(cluster, path, body)
    assert "duplicates" not in answer, answer
    # the copy's 5 records, then this one (a long poll: a reader may learn of the last
    # entry only a moment after it is durable)
    rows = (await client.read_partition(topic, 0, 5, wait_ms=20_000)).rows  # the most allowed: 30 s
    assert [(r[0], r[3]) for r in rows] == [(5, b"after the copy")]


def _no_internal_headers(rows: list[Any]) -> None:
    """The user's headers as written, nothing else: no ``bl.*`` header, no Spark sink
    tag (it travels in the record framing)."""
    assert [r[4] for r in rows[:5]] == [[("user", str(i).encode())] for i in range(5)]


async def _core_headers(ns: Namespace, stream: str, count: int) -> list[Any]:
    """The headers of the first ``count`` records of ``stream``, read by a core reader."""
    reader = await ns.open_reader(stream, StartPosition.earliest())
    out = []
    try:
        for _ in range(count):
            r = await reader.read_next(timeout_s=scaled(10))
            assert r is not None
            out.append(r.headers)
    finally:
        await reader.close()
    return out


async def test_a_consumer_producer_loop_copies_no_markers(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace
) -> None:
    """A core reader of the source and the core topic producer: every record is copied
    with its headers (none refused for a reserved name), none of them internal."""
    source, copy, producer = f"src{_uid()}", f"cpy{_uid()}", f"p{_uid()}"
    await _written_by_a_proxy_producer(proxy_cluster, client, source, producer)
    await TopicAdmin(ns).create_topic(copy, 1)
    reader = await ns.open_reader(f"{source}~0", StartPosition.earliest())
    out = TopicProducer(ns)
    try:
        for _ in range(5):
            r = await reader.read_next(timeout_s=scaled(10))
            assert r is not None
            await out.send(copy, r.payload, r.key, r.headers, 0, timestamp_ms=r.timestamp_ms)
    finally:
        await reader.close()
        await out.close()
    _no_internal_headers((await client.read_partition(copy, 0, 0)).rows)
    await _same_producer_writes_to(proxy_cluster, client, copy, producer)


@pytest.mark.spark
async def test_a_spark_copy_with_headers_copies_no_markers(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace, spark: Any
) -> None:
    """``includeHeaders=true`` read, headers written: the copy has the user's headers
    only -- through the thin client and a core reader, nothing filtered -- and the
    same producer's next write to it is written."""
    source, copy, producer = f"src{_uid()}", f"cpy{_uid()}", f"p{_uid()}"
    await _written_by_a_proxy_producer(proxy_cluster, client, source, producer)
    await client.create_topic(copy, 1)
    conn = {"cluster": str(proxy_cluster.dir / "cluster.json")}
    df = (
        spark.read.format("bookline").options(**conn).option("topic", source)
        .option("includeHeaders", "true").load()
    )  # fmt: skip
    df.select("key", "value", "headers").write.format("bookline").options(**conn).option(
        "topic", copy
    ).mode("append").save()
    copied = (await client.read_partition(copy, 0, 0)).rows
    assert len(copied) == 5
    _no_internal_headers(copied)
    core = await _core_headers(ns, f"{copy}~0", 5)
    assert core == [[("user", str(i).encode())] for i in range(5)]
    await _same_producer_writes_to(proxy_cluster, client, copy, producer)


async def test_log_append_time_shows_through_the_edges(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace
) -> None:
    """A LogAppendTime stream overwrites the producer's timestamp: the thin client,
    the JSON view and the WebSocket tail say LogAppendTime and show the log's time."""
    from metadata.streams import StreamOptions

    stream = f"lat{_uid()}"
    since_ms = await _now_ms(client, stream)
    await ns.create_stream(stream, StreamOptions(timestamp_type="LogAppendTime"))
    await client.write(stream, b"v", None, PAIRS, timestamp_ms=TS)
    (rec,) = (await client.read(stream, "earliest", limit=10)).records
    assert (rec.payload, rec.headers, rec.timestamp_type) == (b"v", PAIRS, 1)
    assert rec.timestamp_ms >= since_ms > TS
    tail = client.tail(stream, "earliest")
    tailed = await anext(tail)
    await tail.aclose()
    assert (tailed.timestamp_ms, tailed.timestamp_type) == (rec.timestamp_ms, 1)
    rurl = str(proxy_cluster.read_proxies[0].extra["url"])
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{rurl}/v1/streams/{stream}/records?from=earliest",
                 headers={"Accept": wire.JSON}) as r,
    ):  # fmt: skip
        (view,) = (await r.json())["records"]
    assert (view["ts"], view["ts_type"]) == (rec.timestamp_ms, "LogAppendTime")
