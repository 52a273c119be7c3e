"""A local cluster whose proxies are Kafka brokers, and what the Kafka listener's
cluster tests share: raw protocol calls (for what no client lets a test send), topic
creation, and each client's produce-and-consume round trip."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafkaapi.protocol.apis_admin import CREATE_TOPICS
from kafkaapi.protocol.apis_cluster import METADATA
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request
from kafkaapi.protocol.records import Record, RecordBatch, encode_batch
from ops.cluster.local import LocalCluster
from tests.cluster_support import cluster_doc, started_cluster

PARTITIONS = 6
BASE_TS = 1_700_000_000_000
# (partition, offset, key, value, headers, timestamp) as every client reports it.
Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def new_topic() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


def sample_records(n: int) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]], int]]:
    """Keyed records with repeated header names, one null value, producer timestamps."""
    out = []
    for i in range(n):
        value = None if i == 3 else f"value-{i}".encode()
        headers = [("trace", f"t-{i}".encode()), ("dup", b"a"), ("dup", b"b")]
        out.append((f"key-{i % 7}".encode(), value, headers, BASE_TS + i))
    return out


def expected_rows(sent: list[tuple[int, int]], n: int) -> set[Row]:
    return {
        (p, off, key, value, tuple(headers), ts)
        for (p, off), (key, value, headers, ts) in zip(sent, sample_records(n), strict=True)
    }


# -- raw protocol, for what no client lets a test send ----------------------------------


async def kafka_call(address: str, api: Any, version: int, body: dict[str, Any]) -> dict[str, Any]:
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


async def create_topic(address: str, topic: str, partitions: int = PARTITIONS) -> None:
    body = {"topics": [{"name": topic, "num_partitions": partitions, "replication_factor": -1,
                        "assignments": [], "configs": []}], "timeout_ms": 30_000}  # fmt: skip
    answer = await kafka_call(address, CREATE_TOPICS, 5, body)
    assert answer["topics"][0]["error_code"] == 0, answer


async def metadata_of(address: str, topic: str) -> dict[str, Any]:
    return await kafka_call(address, METADATA, 9, {"topics": [{"name": topic}]})


def produce_body(topic: str, partition: int, batch: bytes, acks: int = -1) -> dict[str, Any]:
    return {"transactional_id": None, "acks": acks, "timeout_ms": 30_000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": batch}]}]}  # fmt: skip


def one_record_batch(value: bytes) -> bytes:
    return encode_batch(RecordBatch(0, (Record(0, int(time.time() * 1000), b"k", value),)))


# -- the three clients ------------------------------------------------------------------


def kafka_python_roundtrip(
    bootstrap: str, topic: str, n: int
) -> tuple[list[tuple[int, int]], set[Row]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", request_timeout_ms=30_000, compression_type="gzip"
    )
    try:
        futures = [producer.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
                   for k, v, h, ts in sample_records(n)]  # fmt: skip
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


def confluent_roundtrip(
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

    for i, (k, v, h, ts) in enumerate(sample_records(n)):
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


async def aiokafka_roundtrip(
    bootstrap: str, topic: str, n: int
) -> tuple[list[tuple[int, int]], set[Row]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, compression_type="gzip"
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
                   for k, v, h, ts in sample_records(n)]  # fmt: skip
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


async def leader_address(address: str, topic: str, partition: int) -> str:
    meta = await metadata_of(address, topic)
    leader = meta["topics"][0]["partitions"][partition]["leader_id"]
    broker = next(b for b in meta["brokers"] if b["node_id"] == leader)
    return f"{broker['host']}:{broker['port']}"


@contextmanager
def kafka_cluster(directory: Path) -> Iterator[LocalCluster]:
    """ZooKeeper, three bookies, two write proxies and a read proxy, each a broker."""
    with started_cluster(directory, bookies=3, write_proxies=2, read_proxies=1, kafka=True) as c:
        yield c


def bootstrap_of(cluster: LocalCluster) -> str:
    servers = str(cluster_doc(cluster.dir / "cluster.json")["kafka_bootstrap"])
    assert len(servers.split(",")) == 3  # every proxy is a broker
    return servers
