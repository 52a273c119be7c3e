"""A write proxy killed (kill -9) while kafka-python's idempotent producer writes keyed
records to a 6-partition topic over the Kafka listeners: the partitions it led move to
the other write proxy (NOT_LEADER_OR_FOLLOWER, new metadata), and every acknowledged
record is in the log once, at the offset it was acknowledged with, in per-key order."""

from __future__ import annotations

import asyncio
import struct
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaapi.protocol.apis_admin import CREATE_TOPICS
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request
from ops.cluster import procs
from ops.cluster.local import LocalCluster
from tests.cluster_support import cluster_doc, started_cluster
from tests.waiting import scaled, wait_for

PARTITIONS = 6
RECORDS = 600
KEYS = 12


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path / "c", bookies=3, write_proxies=2, kafka=True) as c:
        yield c


async def _create(address: str, topic: str) -> None:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        body = {"topics": [{"name": topic, "num_partitions": PARTITIONS, "replication_factor": -1,
                            "assignments": [], "configs": []}], "timeout_ms": 30_000}  # fmt: skip
        writer.write(frame(encode_request(CREATE_TOPICS, 5, 1, "t", body)))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        answer = decode_response(CREATE_TOPICS, 5, await reader.readexactly(size))[1]
        assert answer["topics"][0]["error_code"] == 0, answer
    finally:
        writer.close()


def _produce(bootstrap: str, topic: str, acked: dict[int, tuple[int, int]]) -> list[Any]:
    """Send every record (idempotent, acks=all); ``acked`` fills as answers come."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
        linger_ms=5, request_timeout_ms=10_000, delivery_timeout_ms=int(scaled(120) * 1000),
        max_in_flight_requests_per_connection=5,
    )  # fmt: skip
    errors: list[Any] = []

    def on_ack(i: int) -> Any:
        return lambda meta: acked.__setitem__(i, (meta.partition, meta.offset))

    try:
        for i in range(RECORDS):
            future = producer.send(topic, key=f"key-{i % KEYS}".encode(), value=str(i).encode())
            future.add_callback(on_ack(i)).add_errback(errors.append)
            if i % 50 == 49:
                producer.flush(timeout=scaled(120))
    finally:
        producer.flush(timeout=scaled(120))
        producer.close()
    return errors


def _consume_all(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out = {}
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    out[(r.partition, r.offset)] = (r.key, r.value)
        return out
    finally:
        consumer.close()


async def test_kill_9_of_a_write_proxy_during_idempotent_produce(cluster: LocalCluster) -> None:
    bootstrap = str(cluster_doc(cluster.dir / "cluster.json")["kafka_bootstrap"])
    topic = f"fo-{uuid.uuid4().hex[:8]}"
    await _create(bootstrap.split(",", maxsplit=1)[0], topic)
    acked: dict[int, tuple[int, int]] = {}
    done = threading.Event()

    def produce() -> list[Any]:
        try:
            return _produce(bootstrap, topic, acked)
        finally:
            done.set()

    sending = asyncio.create_task(asyncio.to_thread(produce))
    await wait_for(lambda: len(acked) >= RECORDS // 4 or done.is_set(), "a quarter acknowledged")
    assert not done.is_set(), "the producer finished before the kill"
    procs.kill9(cluster.write_proxies[0].proc)
    errors = await asyncio.wait_for(sending, scaled(300))
    assert errors == [] and len(acked) == RECORDS
    stored = await asyncio.to_thread(_consume_all, bootstrap, topic)
    # Once each, at the acknowledged offset: nothing lost, nothing duplicated.
    assert len(stored) == RECORDS
    for i, where in acked.items():
        assert stored[where] == (f"key-{i % KEYS}".encode(), str(i).encode())
    # Per key, in the order sent.
    by_key: dict[bytes, list[int]] = {}
    for _, (key, value) in sorted(stored.items()):
        by_key.setdefault(key, []).append(int(value))
    assert all(values == sorted(values) for values in by_key.values())
