"""Pure tests of Kafka's record batch v2 and its compression (kafkaapi/protocol):
round trips, kafka-python's record classes as the oracle, and hostile batches."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Sequence
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.compression import Compression, compress, decompress
from kafkaapi.protocol.errors import KafkaProtocolError
from kafkaapi.protocol.records import (
    Record,
    RecordBatch,
    control_type,
    decode_batch,
    decode_batches,
    encode_batch,
)

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
int64 = st.integers(-(1 << 40), 1 << 40)
nullable_bytes = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=8), nullable_bytes), max_size=4).map(tuple)


@st.composite
def batches(draw: st.DrawFn) -> RecordBatch:
    base = draw(st.integers(0, 1 << 50))
    base_ts = draw(st.integers(0, 1 << 42))
    count = draw(st.integers(1, 6))
    records = tuple(
        Record(
            base + i * draw(st.integers(1, 3)),
            base_ts + draw(st.integers(-1000, 1000)),
            draw(nullable_bytes),
            draw(nullable_bytes),
            draw(headers),
        )
        for i in range(count)
    )
    return RecordBatch(
        base_offset=base,
        records=records,
        compression=draw(st.sampled_from(Compression)),
        log_append_time=draw(st.booleans()),
        transactional=draw(st.booleans()),
        partition_leader_epoch=draw(st.integers(-1, 1000)),
        producer_id=draw(st.integers(-1, 1 << 40)),
        producer_epoch=draw(st.integers(-1, 32767)),
        base_sequence=draw(st.integers(-1, 1 << 30)),
    )


@SOME
@given(batches())
def test_batches_round_trip(batch: RecordBatch) -> None:
    raw = encode_batch(batch)
    decoded = decode_batch(raw)
    assert decoded == batch
    assert decoded.max_timestamp == max(r.timestamp for r in batch.records)
    assert decoded.last_offset_delta == batch.records[-1].offset - batch.base_offset
    assert decode_batches(raw + raw) == [batch, batch]


def _kafka_python_batch(
    records: Sequence[tuple[int, bytes | None, bytes | None, list[Any]]], codec: int
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=7,
        producer_epoch=2,
        base_sequence=40,
        batch_size=1 << 20,
    )
    for offset, (timestamp, key, value, hdrs) in enumerate(records):
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=hdrs)
    return bytes(builder.build())


record_rows = st.lists(
    st.tuples(
        st.integers(0, 1 << 42),
        nullable_bytes,
        nullable_bytes,
        st.lists(st.tuples(st.text(max_size=6), nullable_bytes), max_size=3),
    ),
    min_size=1,
    max_size=5,
)


@SOME
@given(record_rows)
def test_uncompressed_batches_match_kafka_python_bytes(rows: list[Any]) -> None:
    theirs = _kafka_python_batch(rows, 0)
    mine = RecordBatch(
        base_offset=0,
        records=tuple(
            Record(i, ts, key, value, tuple(hdrs)) for i, (ts, key, value, hdrs) in enumerate(rows)
        ),
        partition_leader_epoch=0,  # what kafka-python's builder writes
        producer_id=7,
        producer_epoch=2,
        base_sequence=40,
    )
    assert encode_batch(mine) == theirs
    assert decode_batch(theirs) == mine


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compressed_batches_read_both_ways_with_kafka_python(codec: Compression) -> None:
    """kafka-python (no snappy module here) reads our compressed batches and we read its."""
    rows = [
        (1000 + i, b"key-%d" % i, b"value " * 50, [("h", b"x"), ("h", None)]) for i in range(20)
    ]
    theirs = _kafka_python_batch(rows, int(codec))
    decoded = decode_batch(theirs)
    assert decoded.compression == codec
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in decoded.records] == rows
    mine = encode_batch(decoded)
    read_back = list(DefaultRecordBatch(mine))
    assert [(r.timestamp, r.key, r.value, r.headers) for r in read_back] == rows
    assert DefaultRecordBatch(mine).compression_type == int(codec)


def test_snappy_reads_raw_blocks_and_the_java_framing() -> None:
    import cramjam

    data = b"snappy " * 10000
    assert compress(Compression.SNAPPY, data).startswith(b"\x82SNAPPY\x00")
    assert decompress(Compression.SNAPPY, compress(Compression.SNAPPY, data)) == data
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data


def test_control_batches_are_recognised() -> None:
    commit = Record(5, 1000, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 3))
    batch = RecordBatch(5, (commit,), transactional=True, control=True, producer_id=9)
    decoded = decode_batch(encode_batch(batch))
    assert decoded.control and decoded.transactional
    assert control_type(decoded.records[0]) == "COMMIT"
    assert control_type(Record(0, 0, struct.pack(">hh", 0, 0), None)) == "ABORT"


def _sample() -> bytes:
    return encode_batch(
        RecordBatch(3, (Record(3, 10, b"k", b"v", (("a", None),)), Record(4, 11, None, b"w")))
    )


def _refused(raw: bytes, **kwargs: Any) -> KafkaProtocolError:
    with pytest.raises(KafkaProtocolError) as caught:
        decode_batches(raw, **kwargs)
    return caught.value


def test_a_flipped_bit_fails_the_crc() -> None:
    raw = bytearray(_sample())
    raw[-2] ^= 0x10
    assert _refused(bytes(raw)).kafka is kerr.CORRUPT_MESSAGE


def test_truncations_are_corrupt_or_dropped_as_a_fetch_tail() -> None:
    raw = _sample()
    for end in range(1, len(raw)):
        assert _refused(raw[:end]).kafka is kerr.CORRUPT_MESSAGE
        assert decode_batches(raw + raw[:end], partial_tail=True) == [decode_batch(raw)]


def _recrc(raw: bytearray) -> bytes:
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    return bytes(raw)


@pytest.mark.parametrize(
    ("offset", "fmt", "value"),
    [
        (57, ">i", 1 << 30),  # records_count far past the bytes
        (57, ">i", -1),  # negative records_count
        (21, ">h", 5),  # compression codec 5 does not exist
    ],
)
def test_lying_batch_fields_are_refused(offset: int, fmt: str, value: int) -> None:
    raw = bytearray(_sample())
    struct.pack_into(fmt, raw, offset, value)
    error = _refused(_recrc(raw))
    assert error.kafka in (kerr.CORRUPT_MESSAGE, kerr.UNSUPPORTED_COMPRESSION_TYPE)


def test_a_negative_or_short_batch_length_is_corrupt() -> None:
    raw = bytearray(_sample())
    struct.pack_into(">i", raw, 8, -100)
    assert _refused(bytes(raw)).kafka is kerr.CORRUPT_MESSAGE


def test_old_magic_is_refused() -> None:
    raw = bytearray(_sample())
    raw[16] = 1
    assert _refused(bytes(raw)).kafka is kerr.UNSUPPORTED_VERSION


@pytest.mark.parametrize("codec", list(Compression)[1:])
def test_a_zip_bomb_stops_at_the_bound(codec: Compression) -> None:
    record = Record(0, 0, None, bytes(4 * 1024 * 1024))
    raw = encode_batch(RecordBatch(0, (record,), compression=codec))
    assert len(raw) < 1024 * 1024
    error = _refused(raw, bytes_max=1024 * 1024)
    assert error.kafka is kerr.RECORD_LIST_TOO_LARGE
    assert decode_batches(raw)[0].records[0] == record  # fine under the default bound


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_batches_raise_only_the_protocol_error(data: st.DataObject) -> None:
    raw = bytearray(_sample())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    fix_crc = data.draw(st.booleans())  # past the CRC, into the record decoder
    with contextlib.suppress(KafkaProtocolError):
        decode_batches(_recrc(raw) if fix_crc else bytes(raw))
