"""Topics, the pure parts: the fast murmur2 against a plain transcription of Kafka's,
the compact keyed write body, offset runs, topic bodies, and the thin client's
grouping of records by partition."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import BadRequestError, InvalidNameError
from foundation.partitioner import key_hash, murmur2, partition_for_key
from httpapi import topics as topic_wire
from httpapi import writes
from httpapi.wire import MSGPACK
from serving.write.batch import WriteBatch
from streams.vocabulary import TopicOptions
from thinclient.config import ClientConfig
from thinclient.topics import TopicRouter, records_path


def _kafka_murmur2(data: bytes) -> int:
    """Utils.murmur2 transcribed line by line (32-bit Java ints), the reference."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(length // 4):
        (k,) = struct.unpack_from("<I", data, i * 4)
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@given(st.binary(max_size=400))
def test_fast_murmur2_is_kafkas(data: bytes) -> None:
    expected = _kafka_murmur2(data)
    assert murmur2(data) == expected
    assert key_hash(data) == expected & 0x7FFFFFFF
    for n in (1, 6, 7):
        assert partition_for_key(data, n) == (expected & 0x7FFFFFFF) % n


def test_keyed_write_body_is_two_flat_lists() -> None:
    recs = [writes.WireRecord(b"a", b"k1"), writes.WireRecord(b"b"), writes.WireRecord(b"c", b"")]
    body = writes.write_body(recs, "p", 0)
    assert body["payloads"] == [b"a", b"b", b"c"] and body["keys"] == [b"k1", None, b""]
    req = writes.parse_write(body, records_max=10)
    assert req.keys == [b"k1", None, b""]
    batch = WriteBatch("t~0", None, payloads=req.payloads, keys=req.keys)
    assert batch.size_bytes() == 5 and batch.record_bytes_max == 3
    assert [r.key for r in req.records] == [b"k1", None, b""]
    for bad in (
        {"payloads": [b"a"], "keys": [b"k", b"l"]},
        {"payloads": [b"a"], "keys": [7]},
        {"payloads": [b"a"], "keys": b"k"},
        {"records": [{"payload": b"a"}], "keys": [b"k"]},
    ):
        with pytest.raises(BadRequestError):
            writes.parse_write(bad, records_max=10)
    plain = writes.write_body([writes.WireRecord(b"a")], None, None)
    assert "keys" not in plain


def test_offsets_in_write_answers() -> None:
    offsets = [5, 6, 7, 20, 21, 3]
    runs = writes.encode_offset_runs(offsets)
    assert runs == [[5, 3], [20, 2], [3, 1]]
    assert writes.decode_offset_runs(runs) == offsets
    dlsns = [(1, 0, i) for i in range(6)]
    packed = writes.write_answer(dlsns, MSGPACK, 0, offsets)
    assert writes.answer_offsets(packed) == offsets and writes.answer_count(packed) == 6
    as_json = writes.write_answer(dlsns[:1], "application/json", 0, [9])
    assert as_json["offsets"] == [9] and as_json["offset"] == 9
    assert writes.answer_offsets({"runs": []}) is None  # an older proxy's answer
    with pytest.raises(BadRequestError):
        writes.decode_offset_runs([[1, 2, 3]])


def test_topic_bodies_are_strict() -> None:
    req = topic_wire.parse_create({"name": "t", "partitions": 3, "retention_ms": 10})
    assert (req.name, req.partitions, req.options) == ("t", 3, TopicOptions(retention_ms=10))
    for bad in (
        {"name": "t"},
        {"name": "t", "partitions": 0},
        {"name": "t", "partitions": 10_001},
        {"name": "t", "partitions": True},
        {"name": "t", "partitions": 1, "retention_ms": 0},
        {"name": "t", "partitions": 1, "extra": 1},
    ):
        with pytest.raises(BadRequestError):
            topic_wire.parse_create(bad)
    with pytest.raises(InvalidNameError):
        topic_wire.parse_create({"name": "t~1", "partitions": 1})
    assert topic_wire.parse_alter({"partitions": 4}) == 4
    with pytest.raises(BadRequestError):
        topic_wire.parse_alter({"partitions": 4, "name": "x"})
    assert topic_wire.parse_partition("0") == 0 and topic_wire.parse_partition("17") == 17
    for text in ("-1", "01", "x", "1e3", "10000", "٣"):
        with pytest.raises(BadRequestError):
            topic_wire.parse_partition(text)


def test_records_path_of_partition_and_user_streams() -> None:
    assert records_path("orders~3") == "/v1/topics/orders/partitions/3/records"
    assert records_path("orders") == "/v1/streams/orders/records"
    assert records_path("g~group") == "/v1/streams/g~group/records"


def test_router_groups_keyed_by_kafka_and_unkeyed_sticky() -> None:
    router = TopicRouter(ClientConfig(), transport=None, rng=random.Random(3))  # type: ignore[arg-type]
    keys = [b"key-%d" % i for i in range(200)]
    recs: list[bytes | writes.WireRecord] = [writes.WireRecord(b"v", k) for k in keys]
    recs += [b"unkeyed"] * 10
    groups = router.group("t", 6, recs, range(len(recs)))
    for p, idx in groups.items():
        assert idx == sorted(idx)
        for i in idx:
            if i < 200:
                assert partition_for_key(keys[i], 6) == p
    sticky = [p for p, idx in groups.items() if 200 in idx]
    assert len(sticky) == 1 and all(i in groups[sticky[0]] for i in range(200, 210))
    assert router.choose("t", 6, b"key-7") == partition_for_key(b"key-7", 6)


def test_both_clients_read_the_same_result_types_from_the_wire() -> None:
    """The thin client reads a topic answer, a partition and a stream description back
    into the dataclasses the core library answers (streams.vocabulary), losslessly."""
    from dataclasses import asdict

    from httpapi.views import info_from_view, info_view
    from metadata.streams import StreamOptions
    from metadata.topics import TopicRecord
    from streams.dlsn import DLSN
    from streams.vocabulary import PartitionInfo, SegmentInfo, StreamInfo

    record = TopicRecord("", "t", 3, StreamOptions(retention_ms=5), 17)
    assert topic_wire.parse_topic_record(topic_wire.record_view(record)) == record
    part = PartitionInfo(1, "t~1", 2, 9, 100, 3, owner="wp-1")
    assert topic_wire.parse_partition_view(asdict(part)) == part
    seg = SegmentInfo(1, 7, "sealed", 0, 4, 2, 5, 0, 50, 9, False, DLSN(1, 1, 0), 1)
    info = StreamInfo("s", [seg], 5, 50, DLSN(1, 0, 0), DLSN(1, 2, 1), 0, 4, 0, 5)
    assert info_from_view({**info_view(info), "owner": None}) == info
    assert TopicOptions(retention_ms=1, ack_quorum=2).given() == {
        "retention_ms": 1,
        "ack_quorum": 2,
    }
    with pytest.raises(BadRequestError):
        topic_wire.parse_partition_view({"partition": 0})
