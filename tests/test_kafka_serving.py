"""The Kafka listener over the serving core, with real clients against a real local
cluster (ZooKeeper, bookies, two write proxies and a read proxy, each a Kafka broker):
kafka-python, confluent-kafka (librdkafka) and aiokafka produce keyed records with
header pairs, a null value and producer timestamps to a 6-partition topic (idempotent,
acks=all, compressed: gzip, zstd, gzip), and read
them back with the same offsets, keys, values, headers and timestamps; records cross
between Kafka clients and the thin client both ways at the same offsets; bad input gets
Kafka's error or a closed connection, and the proxies keep serving."""

from __future__ import annotations

import asyncio
import functools
import os
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkaapi.protocol.apis_admin import CREATE_TOPICS
from kafkaapi.protocol.apis_cluster import METADATA
from kafkaapi.protocol.apis_data import FETCH, LIST_OFFSETS, PRODUCE
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request
from kafkaapi.protocol.records import Record, RecordBatch, decode_batches, encode_batch
from ops.cluster.local import LocalCluster
from tests.cluster_support import cluster_doc, started_cluster
from thinclient.client import ClientConfig, ProxyClient

PARTITIONS = 6
BASE_TS = 1_700_000_000_000
# (partition, offset, key, value, headers, timestamp) as every client reports it.
Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(
        tmp_path_factory.mktemp("kafka-cluster"),
        bookies=3,
        write_proxies=2,
        read_proxies=1,
        kafka=True,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    doc = cluster_doc(cluster.dir / "cluster.json")
    servers = str(doc["kafka_bootstrap"])
    assert len(servers.split(",")) == 3  # every proxy is a broker
    return servers


def _topic() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


def _records(n: int) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]], int]]:
    """Keyed records with repeated header names, one null value, producer timestamps."""
    out = []
    for i in range(n):
        value = None if i == 3 else f"value-{i}".encode()
        headers = [("trace", f"t-{i}".encode()), ("dup", b"a"), ("dup", b"b")]
        out.append((f"key-{i % 7}".encode(), value, headers, BASE_TS + i))
    return out


def _expected(sent: list[tuple[int, int]], n: int) -> set[Row]:
    return {
        (p, off, key, value, tuple(headers), ts)
        for (p, off), (key, value, headers, ts) in zip(sent, _records(n), strict=True)
    }


# -- raw protocol, for what no client lets a test send ----------------------------------


async def _call(address: str, api: Any, version: int, body: dict[str, Any]) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame(encode_request(api, version, 7, "test", body)))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        correlation, answer = decode_response(api, version, await reader.readexactly(size))
        assert correlation == 7
        return answer
    finally:
        writer.close()


async def _create(address: str, topic: str, partitions: int = PARTITIONS) -> None:
    body = {"topics": [{"name": topic, "num_partitions": partitions, "replication_factor": -1,
                        "assignments": [], "configs": []}], "timeout_ms": 30_000}  # fmt: skip
    answer = await _call(address, CREATE_TOPICS, 5, body)
    assert answer["topics"][0]["error_code"] == 0, answer


async def _metadata(address: str, topic: str) -> dict[str, Any]:
    return await _call(address, METADATA, 9, {"topics": [{"name": topic}]})


def _produce_body(topic: str, partition: int, batch: bytes, acks: int = -1) -> dict[str, Any]:
    return {"transactional_id": None, "acks": acks, "timeout_ms": 30_000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": batch}]}]}  # fmt: skip


def _one_record_batch(value: bytes) -> bytes:
    return encode_batch(RecordBatch(0, (Record(0, int(time.time() * 1000), b"k", value),)))


# -- the three clients ------------------------------------------------------------------


def _kafka_python_roundtrip(
    bootstrap: str, topic: str, n: int
) -> tuple[list[tuple[int, int]], set[Row]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", request_timeout_ms=30_000, compression_type="gzip"
    )
    try:
        futures = [producer.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
                   for k, v, h, ts in _records(n)]  # fmt: skip
        sent = [(m.partition, m.offset) for m in (f.get(timeout=60) for f in futures)]
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             group_id=None, fetch_max_wait_ms=200)  # fmt: skip
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        got: set[Row] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for tp_records in consumer.poll(timeout_ms=500).values():
                for r in tp_records:
                    got.add((r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp))
    finally:
        consumer.close()
    return sent, got


def _confluent_roundtrip(
    bootstrap: str, topic: str, n: int
) -> tuple[list[tuple[int, int]], set[Row]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": "zstd",
            "enable.idempotence": True,
        }
    )
    sent: dict[int, tuple[int, int]] = {}

    def report(index: int) -> Any:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            sent[index] = (msg.partition(), msg.offset())

        return done

    for i, (k, v, h, ts) in enumerate(_records(n)):
        pairs: Any = h  # confluent's stubs want str | bytes | None values
        producer.produce(topic, value=v, key=k, headers=pairs, timestamp=ts, on_delivery=report(i))
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 200})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got: set[Row] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            row: Any = (msg.partition(), msg.offset(), msg.key(), msg.value(),
                        tuple(msg.headers() or ()), msg.timestamp()[1])  # fmt: skip
            got.add(row)
    finally:
        consumer.close()
    return [sent[i] for i in range(n)], got


async def _aiokafka_roundtrip(
    bootstrap: str, topic: str, n: int
) -> tuple[list[tuple[int, int]], set[Row]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, compression_type="gzip"
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
                   for k, v, h, ts in _records(n)]  # fmt: skip
        sent = [(m.partition, m.offset) for m in await asyncio.gather(*futures)]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=None, fetch_max_wait_ms=200)  # fmt: skip
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        got: set[Row] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for r in records:
                    got.add((r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp))
    finally:
        await consumer.stop()
    return sent, got


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
async def test_client_produces_and_consumes_the_same_records(bootstrap: str, client: str) -> None:
    topic, n = _topic(), 40
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    if client == "kafka-python":
        sent, got = await asyncio.to_thread(_kafka_python_roundtrip, bootstrap, topic, n)
    elif client == "confluent-kafka":
        sent, got = await asyncio.to_thread(_confluent_roundtrip, bootstrap, topic, n)
    else:
        sent, got = await _aiokafka_roundtrip(bootstrap, topic, n)
    assert got == _expected(sent, n)
    # Offsets are each partition's dense sequence ids from 0.
    for p in {p for p, _ in sent}:
        assert sorted(o for q, o in sent if q == p) == list(range(sum(q == p for q, _ in sent)))


# -- Kafka and the thin client, both ways -----------------------------------------------


def _thin(cluster: LocalCluster) -> ProxyClient:
    return ProxyClient(
        write_urls=[p.extra["url"] for p in cluster.write_proxies],
        read_urls=[p.extra["url"] for p in cluster.read_proxies],
        config=ClientConfig(),
    )


async def test_kafka_records_read_by_the_thin_client_and_back(
    cluster: LocalCluster, bootstrap: str
) -> None:
    topic, n = _topic(), 12
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(_kafka_python_roundtrip, bootstrap, topic, n)
    async with _thin(cluster) as thin:
        seen: set[Row] = set()
        for p in range(PARTITIONS):
            page = await thin.read_partition(topic, p, 0, limit=100)
            for offset, ts, key, value, headers, _ts_type in page.rows:
                pairs: Any = tuple(tuple(h) for h in headers or ())
                seen.add((p, offset, key, value, pairs, ts))
        assert seen == _expected(sent, n)
        # The thin client writes; a Kafka consumer reads the same offsets.
        written = [await thin.send(topic, f"thin-{i}".encode(), key=f"tk-{i}".encode(),
                                   headers={"from": b"thin"}) for i in range(6)]  # fmt: skip
    got = await asyncio.to_thread(_kafka_python_consume, bootstrap, topic, {p for p, _ in written})
    for i, (p, offset) in enumerate(written):
        assert got[(p, offset)] == (f"tk-{i}".encode(), f"thin-{i}".encode(), (("from", b"thin"),))


def _kafka_python_consume(
    bootstrap: str, topic: str, partitions: set[int]
) -> dict[tuple[int, int], tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out = {}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, "consumer did not reach the end offsets"
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    out[(r.partition, r.offset)] = (r.key, r.value, tuple(r.headers))
        return out
    finally:
        consumer.close()


# -- offsets, leaders, long polls -------------------------------------------------------


async def test_list_offsets_earliest_latest_and_by_time(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = _topic()
    await _create(address, topic, partitions=1)
    leader = await _leader_address(address, topic, 0)
    for i in range(3):
        batch = encode_batch(RecordBatch(0, (Record(0, BASE_TS + 1000 * i, b"k", b"v"),)))
        answer = await _call(leader, PRODUCE, 9, _produce_body(topic, 0, batch))
        assert answer["responses"][0]["partition_responses"][0]["base_offset"] == i

    async def at(ts: int) -> tuple[int, int]:
        body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "timestamp": ts}]}]}  # fmt: skip
        part = (await _call(address, LIST_OFFSETS, 5, body))["topics"][0]["partitions"][0]
        assert part["error_code"] == 0, part
        return part["offset"], part["timestamp"]

    assert (await at(-2))[0] == 0
    assert (await at(-1))[0] == 3
    assert await at(BASE_TS + 1500) == (2, BASE_TS + 2000)
    assert (await at(BASE_TS + 10_000))[0] == -1


async def _leader_address(address: str, topic: str, partition: int) -> str:
    meta = await _metadata(address, topic)
    leader = meta["topics"][0]["partitions"][partition]["leader_id"]
    broker = next(b for b in meta["brokers"] if b["node_id"] == leader)
    return f"{broker['host']}:{broker['port']}"


async def test_produce_to_a_proxy_not_owning_the_partition_is_refused(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = _topic()
    await _create(address, topic, partitions=1)
    leader = await _leader_address(address, topic, 0)
    first = await _call(leader, PRODUCE, 9, _produce_body(topic, 0, _one_record_batch(b"a")))
    assert first["responses"][0]["partition_responses"][0]["error_code"] == 0
    for other in bootstrap.split(","):
        if other == leader:
            continue  # the other write proxy, and the read proxy
        answer = await _call(other, PRODUCE, 9, _produce_body(topic, 0, _one_record_batch(b"b")))
        assert answer["responses"][0]["partition_responses"][0]["error_code"] == 6  # NOT_LEADER
    # Metadata still names the owner.
    assert await _leader_address(address, topic, 0) == leader


async def test_fetch_long_poll_answers_when_a_record_arrives(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = _topic()
    await _create(address, topic, partitions=1)
    leader = await _leader_address(address, topic, 0)
    body = {"replica_id": -1, "max_wait_ms": 20_000, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""}  # fmt: skip
    # The read proxy's listener (the last one) serves the fetch: its own read core.
    poll = asyncio.create_task(_call(bootstrap.rsplit(",", maxsplit=1)[-1], FETCH, 11, body))
    await asyncio.sleep(0.5)  # the fetch is waiting (the behaviour under test)
    assert not poll.done()
    await _call(leader, PRODUCE, 9, _produce_body(topic, 0, _one_record_batch(b"late")))
    answer = await asyncio.wait_for(poll, 30)
    part = answer["responses"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["high_watermark"] == 1
    [batch] = decode_batches(part["records"], partial_tail=True)
    assert [(r.offset, r.value) for r in batch.records] == [(0, b"late")]


# -- bad input --------------------------------------------------------------------------


async def _closed(address: str, payload: bytes) -> bool:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30) == b""
    finally:
        writer.close()


async def test_bad_input_gets_an_error_or_a_closed_connection(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    assert await _closed(address, frame(os.urandom(64)))  # garbage
    assert await _closed(address, frame(struct.pack(">hhih", 3, 99, 1, -1)))  # Metadata v99
    assert await _closed(address, struct.pack(">i", 1 << 30))  # a 1 GiB frame
    topic = _topic()
    await _create(address, topic, partitions=1)
    leader = await _leader_address(address, topic, 0)
    big = _one_record_batch(b"x" * (2 << 20))  # over the proxies' record_bytes_max
    answer = await _call(leader, PRODUCE, 9, _produce_body(topic, 0, big))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == 10  # TOO_LARGE
    bad_crc = bytearray(_one_record_batch(b"v"))
    bad_crc[-1] ^= 1
    answer = await _call(leader, PRODUCE, 9, _produce_body(topic, 0, bytes(bad_crc)))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == 2  # CORRUPT
    # Every proxy still serves.
    for each in bootstrap.split(","):
        assert (await _metadata(each, topic))["topics"][0]["error_code"] == 0


async def test_an_idempotent_retry_is_answered_with_the_first_offsets(bootstrap: str) -> None:
    from kafkaapi.protocol.apis_data import INIT_PRODUCER_ID

    address = bootstrap.split(",", maxsplit=1)[0]
    topic = _topic()
    await _create(address, topic, partitions=1)
    leader = await _leader_address(address, topic, 0)
    init = await _call(leader, INIT_PRODUCER_ID, 1, {"transactional_id": None,
                                                     "transaction_timeout_ms": 60_000})  # fmt: skip
    assert init["error_code"] == 0 and init["producer_id"] > 0
    pid, epoch = init["producer_id"], init["producer_epoch"]

    def batch(seq: int, *values: bytes) -> bytes:
        now = int(time.time() * 1000)
        records = tuple(Record(i, now, b"k", v) for i, v in enumerate(values))
        return encode_batch(RecordBatch(0, records, producer_id=pid, producer_epoch=epoch,
                                        base_sequence=seq))  # fmt: skip

    async def produce(raw: bytes) -> dict[str, Any]:
        answer = await _call(leader, PRODUCE, 9, _produce_body(topic, 0, raw))
        return dict(answer["responses"][0]["partition_responses"][0])

    first = await produce(batch(0, b"a", b"b"))
    again = await produce(batch(0, b"a", b"b"))  # the client's retry of the same batch
    following = await produce(batch(2, b"c"))
    assert (first["error_code"], first["base_offset"]) == (0, 0)
    assert (again["error_code"], again["base_offset"]) == (0, 0)
    assert (following["error_code"], following["base_offset"]) == (0, 2)
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]}  # fmt: skip
    end = (await _call(address, LIST_OFFSETS, 5, body))["topics"][0]["partitions"][0]
    assert end["offset"] == 3  # written once each
    # A transactional producer is told at once that transactions are not served.
    txn = await _call(leader, INIT_PRODUCER_ID, 1, {"transactional_id": "tx-1",
                                                    "transaction_timeout_ms": 60_000})  # fmt: skip
    assert txn["error_code"] == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def _confluent_consume(bootstrap: str, topic: str, n: int, rack: str) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "client.rack": rack})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = 0
        deadline = time.monotonic() + 60
        while got < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got += 1
        return got
    finally:
        consumer.close()


async def _served_by_read_proxy(cluster: LocalCluster) -> float:
    import aiohttp

    url = cluster.read_proxies[0].extra["metrics"]
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('bookline_readproxy_served_records_total{path="partition"}'):
            return float(line.split()[-1])
    return 0.0


async def test_a_rack_aware_consumer_fetches_from_the_read_proxy(
    cluster: LocalCluster, bootstrap: str
) -> None:
    """KIP-392: the leader (a write proxy) names a read proxy as the preferred read
    replica of a consumer that sends client.rack, and librdkafka fetches from it."""
    topic, n = _topic(), 24
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    await asyncio.to_thread(_confluent_roundtrip, bootstrap, topic, n)
    before = await _served_by_read_proxy(cluster)
    assert await asyncio.to_thread(_confluent_consume, bootstrap, topic, n, "rack-a") == n
    assert await _served_by_read_proxy(cluster) - before >= n


async def test_acks_0_gets_no_answer_and_the_record_is_written(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = _topic()
    await _create(address, topic, partitions=1)
    leader = await _leader_address(address, topic, 0)
    host, port = leader.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        body = _produce_body(topic, 0, _one_record_batch(b"fire"), acks=0)
        writer.write(frame(encode_request(PRODUCE, 9, 1, "t", body)))
        writer.write(frame(encode_request(METADATA, 9, 2, "t", {"topics": [{"name": topic}]})))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        correlation, _ = decode_response(METADATA, 9, await reader.readexactly(size))
        assert correlation == 2  # the produce was not answered
    finally:
        writer.close()
    offsets = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]}  # fmt: skip
    end = (await _call(address, LIST_OFFSETS, 5, offsets))["topics"][0]["partitions"][0]
    assert end["offset"] == 1


def _kafka_python_commit(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(parts)
        consumer.commit({parts[0]: OffsetAndMetadata(3, "", -1)})
    finally:
        consumer.close()
    fresh = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: fresh.committed(TopicPartition(topic, p)) for p in range(2)}
    finally:
        fresh.close()


def _confluent_commit(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, 1, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 1, 2)], asynchronous=False)
        got = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


async def test_committed_offsets_of_assign_consumers(bootstrap: str) -> None:
    """OffsetCommit/OffsetFetch on the group coordinators: kafka-python and librdkafka
    consumers that assign() partitions commit and read back the group's offsets."""
    address = bootstrap.split(",", maxsplit=1)[0]
    topic, group = _topic(), f"g-{uuid.uuid4().hex[:8]}"
    await _create(address, topic, partitions=2)
    leader = await _leader_address(address, topic, 0)
    for p in range(2):
        for _ in range(4):
            await _call(leader if p == 0 else await _leader_address(address, topic, 1),
                        PRODUCE, 9, _produce_body(topic, p, _one_record_batch(b"v")))  # fmt: skip
    assert await asyncio.to_thread(_kafka_python_commit, bootstrap, topic, group) == {
        0: 3,
        1: None,
    }
    # librdkafka commits partition 1 of the same group and sees both (-1001: none).
    assert await asyncio.to_thread(_confluent_commit, bootstrap, topic, group) == {0: 3, 1: 2}


def _kafka_python_subscribe(bootstrap: str, topic: str, group: str, n: int) -> set[tuple[int, int]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10_000, heartbeat_interval_ms=500)  # fmt: skip
    try:
        got: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update((r.partition, r.offset) for r in records)
        consumer.commit()
        return got
    finally:
        consumer.close()


def _confluent_subscribe(bootstrap: str, topic: str, group: str, n: int) -> set[tuple[int, int]]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 10_000})  # fmt: skip
    try:
        consumer.subscribe([topic])
        got: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                where: Any = (msg.partition(), msg.offset())
                got.add(where)
        consumer.commit(asynchronous=False)
        return got
    finally:
        consumer.close()


async def _aiokafka_subscribe(
    bootstrap: str, topic: str, group: str, n: int
) -> set[tuple[int, int]]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                session_timeout_ms=10_000, heartbeat_interval_ms=500)  # fmt: skip
    await consumer.start()
    try:
        got: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.update((r.partition, r.offset) for r in records)
        await consumer.commit()
        return got
    finally:
        await consumer.stop()


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
async def test_a_subscribed_consumer_gets_every_partition_and_commits(
    bootstrap: str, client: str
) -> None:
    """JoinGroup/SyncGroup/Heartbeat on Bookline's coordinator: a lone member is given
    every partition, reads them all, commits; the group's offsets are its end offsets."""
    topic, group, n = _topic(), f"g-{uuid.uuid4().hex[:8]}", 30
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(_kafka_python_roundtrip, bootstrap, topic, n)
    if client == "kafka-python":
        got = await asyncio.to_thread(_kafka_python_subscribe, bootstrap, topic, group, n)
    elif client == "confluent-kafka":
        got = await asyncio.to_thread(_confluent_subscribe, bootstrap, topic, group, n)
    else:
        got = await _aiokafka_subscribe(bootstrap, topic, group, n)
    assert got == set(sent)
    committed = await asyncio.to_thread(_committed, bootstrap, topic, group)
    ends = {p: sum(q == p for q, _ in sent) for p in range(PARTITIONS)}
    # An empty partition's position may be committed (0) or not (None), per client.
    assert {p: o if o is not None or ends[p] else 0 for p, o in committed.items()} == ends


def _committed(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _member(  # noqa: PLR0917 - one thread's arguments
    bootstrap: str, topic: str, group: str, stop: Any, out: dict[str, Any], name: str
) -> None:
    """A kafka-python member polling until ``stop``; its records and final assignment."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10_000, heartbeat_interval_ms=300)  # fmt: skip
    got: set[tuple[int, int]] = set()
    try:
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=300).values():
                got.update((r.partition, r.offset) for r in records)
            out[name] = (set(got), {tp.partition for tp in consumer.assignment()})
    finally:
        consumer.close()


async def test_two_members_split_the_partitions(bootstrap: str) -> None:
    """A second member joining takes some partitions over: in the end the members hold
    disjoint sets covering every partition, and every record was read."""
    import threading

    from tests.waiting import wait_for

    topic, group, n = _topic(), f"g-{uuid.uuid4().hex[:8]}", 60
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(_kafka_python_roundtrip, bootstrap, topic, n)
    stop = threading.Event()
    out: dict[str, Any] = {}
    a = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, group, stop, out, "a"))
    b: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: "a" in out and len(out["a"][1]) == PARTITIONS, "a holds all")
        b = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, group, stop, out, "b"))

        def split() -> bool:
            if "b" not in out:
                return False
            held_a, held_b = out["a"][1], out["b"][1]
            whole = held_a | held_b == set(range(PARTITIONS))
            return bool(held_b) and not held_a & held_b and whole

        await wait_for(split, "the partitions split between a and b", timeout_s=60)
        await wait_for(lambda: out["a"][0] | out["b"][0] >= set(sent), "every record read")
    finally:
        stop.set()
        await a
        if b is not None:
            await b


def _admin_groups(bootstrap: str, group: str) -> tuple[set[str], str, set[str]]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        listed = {g["group_id"] for g in admin.list_groups()}
        described = admin.describe_groups([group])[group]
        admin.delete_groups([group])
        after = {g["group_id"] for g in admin.list_groups()}
        return listed, str(described["group_state"]), after
    finally:
        admin.close()


def _describe_cluster(bootstrap: str) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.describe_cluster(request_timeout=30).result(60).nodes)


async def test_admin_clients_list_describe_and_delete_groups(bootstrap: str) -> None:
    topic, group = _topic(), f"g-{uuid.uuid4().hex[:8]}"
    address = bootstrap.split(",", maxsplit=1)[0]
    await _create(address, topic, partitions=2)
    leader = await _leader_address(address, topic, 0)
    for _ in range(4):
        await _call(leader, PRODUCE, 9, _produce_body(topic, 0, _one_record_batch(b"v")))
    await asyncio.to_thread(_kafka_python_commit, bootstrap, topic, group)
    listed, state, after = await asyncio.to_thread(_admin_groups, bootstrap, group)
    assert group in listed and state == "Empty" and group not in after
    assert await asyncio.to_thread(_describe_cluster, bootstrap) == 3


def _confluent_member(  # noqa: PLR0917 - one thread's arguments
    bootstrap: str, topic: str, group: str, stop: Any, out: dict[str, Any], name: str
) -> None:
    """A librdkafka member with the cooperative-sticky assignor, polling until ``stop``."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "partition.assignment.strategy": "cooperative-sticky",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 10_000, "heartbeat.interval.ms": 300})  # fmt: skip
    got: set[tuple[int, int]] = set()
    try:
        consumer.subscribe([topic])
        while not stop.is_set():
            msg = consumer.poll(0.3)
            if msg is not None and msg.error() is None:
                where: Any = (msg.partition(), msg.offset())
                got.add(where)
            out[name] = (set(got), {tp.partition for tp in consumer.assignment()})
    finally:
        consumer.close()


async def test_cooperative_librdkafka_members_split_the_partitions(bootstrap: str) -> None:
    """librdkafka's cooperative-sticky members (incremental assign and unassign): the
    second one takes some partitions over, the two hold disjoint sets covering every
    partition, and every record is read."""
    import threading

    from tests.waiting import wait_for

    topic, group, n = _topic(), f"g-{uuid.uuid4().hex[:8]}", 60
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(_kafka_python_roundtrip, bootstrap, topic, n)
    stop = threading.Event()
    out: dict[str, Any] = {}

    def run(name: str) -> asyncio.Task[None]:
        member = functools.partial(_confluent_member, bootstrap, topic, group, stop, out, name)
        return asyncio.create_task(asyncio.to_thread(member))

    a = run("a")
    b: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: "a" in out and len(out["a"][1]) == PARTITIONS, "a holds all")
        b = run("b")

        def split() -> bool:
            if "b" not in out:
                return False
            held_a, held_b = out["a"][1], out["b"][1]
            whole = held_a | held_b == set(range(PARTITIONS))
            return bool(held_a) and bool(held_b) and not held_a & held_b and whole

        await wait_for(split, "the partitions split between a and b", timeout_s=60)
        await wait_for(lambda: out["a"][0] | out["b"][0] >= set(sent), "every record read")
    finally:
        stop.set()
        await a
        if b is not None:
            await b


_MEMBER_SCRIPT = """
import sys
from kafka import KafkaConsumer
consumer = KafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3],
                         enable_auto_commit=False, session_timeout_ms=6000,
                         heartbeat_interval_ms=300)
while True:
    consumer.poll(timeout_ms=300)
    print(len(consumer.assignment()), flush=True)
"""


async def test_a_killed_members_partitions_move_within_its_session_timeout(
    bootstrap: str, tmp_path: Path
) -> None:
    """A member in another process, kill -9: once its session (6 s) expires the other
    member holds every partition."""
    import subprocess
    import sys
    import threading

    from tests.waiting import wait_for

    topic, group = _topic(), f"g-{uuid.uuid4().hex[:8]}"
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    script = tmp_path / "member.py"
    script.write_text(_MEMBER_SCRIPT)
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, read by a thread
        [sys.executable, str(script), bootstrap, topic, group],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )  # fmt: skip
    held = {"n": 0}

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            held["n"] = int(line)

    threading.Thread(target=watch, daemon=True).start()
    stop = threading.Event()
    out: dict[str, Any] = {}
    b: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: held["n"] == PARTITIONS, "the first member holds all")
        b = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, group, stop, out, "b"))
        await wait_for(lambda: 0 < held["n"] < PARTITIONS and "b" in out and out["b"][1],
                       "the partitions split")  # fmt: skip
        proc.kill()  # kill -9
        proc.wait()
        await wait_for(lambda: len(out["b"][1]) == PARTITIONS, "b holds every partition")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop.set()
        if b is not None:
            await b


def _kcat(*args: str, stdin: bytes = b"") -> str:
    import subprocess

    done = subprocess.run(  # checked below: a failure shows kcat's own words
        ["kcat", *args], check=False, input=stdin, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_kcat_lists_produces_and_consumes(bootstrap: str) -> None:
    """kcat's -L (metadata), -P (keyed produce) and -C (consume to the end), and -G (a
    balanced consumer group) against the listeners."""
    import shutil

    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed (ops/setup.sh installs it)")
    topic = _topic()
    await _create(bootstrap.split(",", maxsplit=1)[0], topic, partitions=2)
    listing = await asyncio.to_thread(_kcat, "-b", bootstrap, "-L", "-t", topic)
    assert f'topic "{topic}" with 2 partitions' in listing
    lines = b"".join(f"k{i}:v{i}\n".encode() for i in range(10))
    await asyncio.to_thread(_kcat, "-b", bootstrap, "-P", "-t", topic, "-K:", stdin=lines)
    out = await asyncio.to_thread(
        _kcat, "-b", bootstrap, "-C", "-t", topic, "-e", "-f", "%k=%s@%o\\n"
    )
    assert sorted(line.split("@")[0] for line in out.splitlines()) == sorted(
        f"k{i}=v{i}" for i in range(10)
    )
    group = f"g-{uuid.uuid4().hex[:8]}"
    out = await asyncio.to_thread(
        _kcat, "-b", bootstrap, "-G", group, "-o", "beginning", "-e", "-f", "%s\\n", topic
    )
    assert sorted(out.split()) == sorted(f"v{i}" for i in range(10))
