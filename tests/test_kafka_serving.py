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
import os
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaapi.protocol.apis_cluster import METADATA
from kafkaapi.protocol.apis_data import FETCH, LIST_OFFSETS, PRODUCE
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request
from kafkaapi.protocol.records import Record, RecordBatch, decode_batches, encode_batch
from ops.cluster.local import LocalCluster
from tests.kafka_cluster import (
    BASE_TS,
    PARTITIONS,
    Row,
    aiokafka_roundtrip,
    bootstrap_of,
    confluent_roundtrip,
    create_topic,
    expected_rows,
    kafka_call,
    kafka_cluster,
    kafka_python_roundtrip,
    leader_address,
    metadata_of,
    new_topic,
    one_record_batch,
    produce_body,
)
from thinclient.client import ClientConfig, ProxyClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with kafka_cluster(tmp_path_factory.mktemp("kafka-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return bootstrap_of(cluster)


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
async def test_client_produces_and_consumes_the_same_records(bootstrap: str, client: str) -> None:
    topic, n = new_topic(), 40
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    if client == "kafka-python":
        sent, got = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    elif client == "confluent-kafka":
        sent, got = await asyncio.to_thread(confluent_roundtrip, bootstrap, topic, n)
    else:
        sent, got = await aiokafka_roundtrip(bootstrap, topic, n)
    assert got == expected_rows(sent, n)
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
    topic, n = new_topic(), 12
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    async with _thin(cluster) as thin:
        seen: set[Row] = set()
        for p in range(PARTITIONS):
            page = await thin.read_partition(topic, p, 0, limit=100)
            for offset, ts, key, value, headers, _ts_type in page.rows:
                pairs: Any = tuple(tuple(h) for h in headers or ())
                seen.add((p, offset, key, value, pairs, ts))
        assert seen == expected_rows(sent, n)
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
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    for i in range(3):
        batch = encode_batch(RecordBatch(0, (Record(0, BASE_TS + 1000 * i, b"k", b"v"),)))
        answer = await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, batch))
        assert answer["responses"][0]["partition_responses"][0]["base_offset"] == i

    async def at(ts: int) -> tuple[int, int]:
        body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "timestamp": ts}]}]}  # fmt: skip
        part = (await kafka_call(address, LIST_OFFSETS, 5, body))["topics"][0]["partitions"][0]
        assert part["error_code"] == 0, part
        return part["offset"], part["timestamp"]

    assert (await at(-2))[0] == 0
    assert (await at(-1))[0] == 3
    assert await at(BASE_TS + 1500) == (2, BASE_TS + 2000)
    assert (await at(BASE_TS + 10_000))[0] == -1


async def test_produce_to_a_proxy_not_owning_the_partition_is_refused(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    first = await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, one_record_batch(b"a")))
    assert first["responses"][0]["partition_responses"][0]["error_code"] == 0
    for other in bootstrap.split(","):
        if other == leader:
            continue  # the other write proxy, and the read proxy
        answer = await kafka_call(other, PRODUCE, 9, produce_body(topic, 0, one_record_batch(b"b")))
        assert answer["responses"][0]["partition_responses"][0]["error_code"] == 6  # NOT_LEADER
    # Metadata still names the owner.
    assert await leader_address(address, topic, 0) == leader


async def test_fetch_long_poll_answers_when_a_record_arrives(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    body = {"replica_id": -1, "max_wait_ms": 20_000, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""}  # fmt: skip
    # The read proxy's listener (the last one) serves the fetch: its own read core.
    poll = asyncio.create_task(kafka_call(bootstrap.rsplit(",", maxsplit=1)[-1], FETCH, 11, body))
    await asyncio.sleep(0.5)  # the fetch is waiting (the behaviour under test)
    assert not poll.done()
    await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, one_record_batch(b"late")))
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
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    big = one_record_batch(b"x" * (2 << 20))  # over the proxies' record_bytes_max
    answer = await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, big))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == 10  # TOO_LARGE
    bad_crc = bytearray(one_record_batch(b"v"))
    bad_crc[-1] ^= 1
    answer = await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, bytes(bad_crc)))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == 2  # CORRUPT
    # Every proxy still serves.
    for each in bootstrap.split(","):
        assert (await metadata_of(each, topic))["topics"][0]["error_code"] == 0


async def test_an_idempotent_retry_is_answered_with_the_first_offsets(bootstrap: str) -> None:
    from kafkaapi.protocol.apis_data import INIT_PRODUCER_ID

    address = bootstrap.split(",", maxsplit=1)[0]
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    init = await kafka_call(leader, INIT_PRODUCER_ID, 1, {"transactional_id": None,
                                                     "transaction_timeout_ms": 60_000})  # fmt: skip
    assert init["error_code"] == 0 and init["producer_id"] > 0
    pid, epoch = init["producer_id"], init["producer_epoch"]

    def batch(seq: int, *values: bytes) -> bytes:
        now = int(time.time() * 1000)
        records = tuple(Record(i, now, b"k", v) for i, v in enumerate(values))
        return encode_batch(RecordBatch(0, records, producer_id=pid, producer_epoch=epoch,
                                        base_sequence=seq))  # fmt: skip

    async def produce(raw: bytes) -> dict[str, Any]:
        answer = await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, raw))
        return dict(answer["responses"][0]["partition_responses"][0])

    first = await produce(batch(0, b"a", b"b"))
    again = await produce(batch(0, b"a", b"b"))  # the client's retry of the same batch
    following = await produce(batch(2, b"c"))
    assert (first["error_code"], first["base_offset"]) == (0, 0)
    assert (again["error_code"], again["base_offset"]) == (0, 0)
    assert (following["error_code"], following["base_offset"]) == (0, 2)
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]}  # fmt: skip
    end = (await kafka_call(address, LIST_OFFSETS, 5, body))["topics"][0]["partitions"][0]
    assert end["offset"] == 3  # written once each
    # A transactional producer is told at once that transactions are not served.
    txn = await kafka_call(leader, INIT_PRODUCER_ID, 1, {"transactional_id": "tx-1",
                                                    "transaction_timeout_ms": 60_000})  # fmt: skip
    assert txn["error_code"] == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def test_an_idempotent_batch_over_a_sequence_gap_is_not_written(bootstrap: str) -> None:
    """Issue 25 (kafka-idem), chaos seed 23's lost record: a new producer's sequence 1
    reached the partition while its sequence 0 had failed, and was written; librdkafka
    then counted sequence 0 as acknowledged by it. Refused NOT_LEADER_OR_FOLLOWER ("not
    written", retried with the same sequence), as is a new epoch not at sequence 0; in
    order both are written once."""
    from kafkaapi.protocol.apis_data import INIT_PRODUCER_ID

    address = bootstrap.split(",", maxsplit=1)[0]
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    init = await kafka_call(leader, INIT_PRODUCER_ID, 1, {"transactional_id": None,
                                                     "transaction_timeout_ms": 60_000})  # fmt: skip
    pid, epoch = init["producer_id"], init["producer_epoch"]

    async def produce(seq: int, value: bytes, bump: int = 0) -> tuple[int, int]:
        records = (Record(0, int(time.time() * 1000), b"k", value),)
        raw = encode_batch(RecordBatch(0, records, producer_id=pid,
                                       producer_epoch=epoch + bump, base_sequence=seq))  # fmt: skip
        answer = await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, raw))
        part = answer["responses"][0]["partition_responses"][0]
        return part["error_code"], part["base_offset"]

    not_leader = 6  # NOT_LEADER_OR_FOLLOWER
    assert await produce(1, b"b") == (not_leader, -1)  # sequence 0 never arrived
    assert await produce(0, b"a") == (0, 0)
    assert await produce(1, b"b") == (0, 1)
    assert await produce(2, b"x", bump=1) == (not_leader, -1)  # a new epoch starts at 0
    assert await produce(0, b"x", bump=1) == (0, 2)
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]}  # fmt: skip
    end = (await kafka_call(address, LIST_OFFSETS, 5, body))["topics"][0]["partitions"][0]
    assert end["offset"] == 3  # nothing of the refused batches was written


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
    topic, n = new_topic(), 24
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    await asyncio.to_thread(confluent_roundtrip, bootstrap, topic, n)
    before = await _served_by_read_proxy(cluster)
    assert await asyncio.to_thread(_confluent_consume, bootstrap, topic, n, "rack-a") == n
    assert await _served_by_read_proxy(cluster) - before >= n


async def test_acks_0_gets_no_answer_and_the_record_is_written(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    topic = new_topic()
    await create_topic(address, topic, partitions=1)
    leader = await leader_address(address, topic, 0)
    host, port = leader.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        body = produce_body(topic, 0, one_record_batch(b"fire"), acks=0)
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
    end = (await kafka_call(address, LIST_OFFSETS, 5, offsets))["topics"][0]["partitions"][0]
    assert end["offset"] == 1


# -- seeks by offset and by time, with every client -------------------------------------


def _seek_targets(sent: list[tuple[int, int]]) -> tuple[int, int, int]:
    """A partition holding at least three records, the offset of its second (a seek by
    offset) and the index of its third (a seek by that record's timestamp)."""
    by_partition: dict[int, list[int]] = {}
    for i, (p, _offset) in enumerate(sent):
        by_partition.setdefault(p, []).append(i)
    p, indexes = next((p, ix) for p, ix in sorted(by_partition.items()) if len(ix) >= 3)
    return p, sent[indexes[1]][1], indexes[2]


def _kafka_python_seeks(bootstrap: str, topic: str, p: int, offset: int, ts: int) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(topic, p)
        consumer.assign([tp])
        found = consumer.offsets_for_times({tp: ts})[tp]
        out: list[Any] = [found.offset, found.timestamp]
        for target in (offset, found.offset):
            consumer.seek(tp, target)
            deadline = time.monotonic() + 60
            records: list[Any] = []
            while not records:
                assert time.monotonic() < deadline, "no record after the seek"
                records = consumer.poll(timeout_ms=500, max_records=1).get(tp, [])
            out.append((records[0].offset, records[0].timestamp))
        return out
    finally:
        consumer.close()


def _confluent_seeks(bootstrap: str, topic: str, p: int, offset: int, ts: int) -> list[Any]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        [found] = consumer.offsets_for_times([TopicPartition(topic, p, ts)], timeout=30)
        out: list[Any] = [found.offset, ts]
        for target in (offset, found.offset):
            consumer.assign([TopicPartition(topic, p, target)])  # librdkafka's seek
            deadline = time.monotonic() + 60
            msg = None
            while msg is None or msg.error() is not None:
                assert time.monotonic() < deadline, "no record after the seek"
                msg = consumer.poll(0.5)
            out.append((msg.offset(), msg.timestamp()[1]))
            consumer.unassign()
        return out
    finally:
        consumer.close()


async def _aiokafka_seeks(bootstrap: str, topic: str, p: int, offset: int, ts: int) -> list[Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, p)
        consumer.assign([tp])
        found = (await consumer.offsets_for_times({tp: ts}))[tp]
        out: list[Any] = [found.offset, found.timestamp]
        for target in (offset, found.offset):
            consumer.seek(tp, target)
            record = await asyncio.wait_for(consumer.getone(), 60)
            out.append((record.offset, record.timestamp))
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
async def test_seeks_by_offset_and_by_time(bootstrap: str, client: str) -> None:
    """Each client seeks to an offset and to the first record at or after a timestamp
    (ListOffsets by time) and reads from exactly there."""
    topic, n = new_topic(), 40
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    p, offset, third = _seek_targets(sent)
    ts = BASE_TS + third  # sample_records(i) carries BASE_TS + i
    if client == "kafka-python":
        got = await asyncio.to_thread(_kafka_python_seeks, bootstrap, topic, p, offset, ts)
    elif client == "confluent-kafka":
        got = await asyncio.to_thread(_confluent_seeks, bootstrap, topic, p, offset, ts)
    else:
        got = await _aiokafka_seeks(bootstrap, topic, p, offset, ts)
    by_time = sent[third][1]
    by_offset_ts = BASE_TS + sent.index((p, offset))
    assert got == [by_time, ts, (offset, by_offset_ts), (by_time, ts)]
