"""Pure tests of the produce side's record decoding (kafkaapi/protocol/records.py's
:func:`decode_produced`): the columnar fast path gives exactly what the checked,
record-by-record decoder gives, and hostile bytes get the same errors from both."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaapi.protocol.compression import Compression
from kafkaapi.protocol.errors import KafkaProtocolError
from kafkaapi.protocol.records import (
    BATCH_OVERHEAD_BYTES,
    ProducedBatch,
    Record,
    RecordBatch,
    decode_batch,
    decode_produced,
    encode_batch,
)

SOME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Values and keys long enough for two- and three-byte length varints.
values = st.binary(max_size=300)
keys = st.none() | st.binary(max_size=200)
headers = st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=8)), max_size=2)


@st.composite
def batches(draw: st.DrawFn) -> RecordBatch:
    """Mostly plain records (the fast path's), sometimes one with headers or a null
    value; counts and timestamp deltas past one-byte varints."""
    base_ts = draw(st.integers(0, 1 << 42))
    count = draw(st.integers(1, 80))
    odd = draw(st.none() | st.integers(0, count - 1))  # a record off the fast path
    records = []
    for i in range(count):
        value: bytes | None = draw(values)
        hdrs: tuple[tuple[str, bytes | None], ...] = ()
        if i == odd:
            value, hdrs = draw(st.none() | values), tuple(draw(headers))
        stamp = base_ts + draw(st.sampled_from([0, 1, 5]) | st.integers(-(1 << 35), 1 << 35))
        records.append(Record(i, stamp, draw(keys), value, hdrs))
    return RecordBatch(
        base_offset=0,
        records=tuple(records),
        compression=draw(st.sampled_from([Compression.NONE, Compression.LZ4])),
        log_append_time=draw(st.booleans()),
        producer_id=draw(st.integers(-1, 1 << 40)),
        producer_epoch=draw(st.integers(-1, 32767)),
        base_sequence=draw(st.integers(-1, 1 << 30)),
    )


def _rows(produced: ProducedBatch) -> list[tuple[int, bytes | None, bytes | None, tuple]]:  # type: ignore[type-arg]
    """(timestamp, key, value, headers) per record, whichever form they came in."""
    columns = produced.columns
    if columns is None:
        return [(r.timestamp, r.key, r.value, r.headers) for r in produced.records]
    keys = columns.keys or [None] * produced.count
    return [(t, k, v, ()) for t, k, v in zip(columns.timestamps, keys, columns.values, strict=True)]


@SOME
@given(batches())
def test_produced_batches_decode_as_the_checked_decoder_does(batch: RecordBatch) -> None:
    raw = encode_batch(batch)
    checked = decode_batch(raw)
    produced = decode_produced(raw)
    assert _rows(produced) == [(r.timestamp, r.key, r.value, r.headers) for r in checked.records]
    assert produced.count == len(checked.records)
    assert (produced.producer_id, produced.producer_epoch, produced.base_sequence) == (
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
    )
    assert produced.log_append_time == batch.log_append_time
    plain = all(r.value is not None and not r.headers for r in batch.records)
    assert (produced.columns is not None) == plain  # plain records never take the slow path


def _resealed(raw: bytes) -> bytes:
    """``raw`` with its CRC recomputed, so the records' bytes are what gets checked."""
    return raw[:17] + struct.pack(">I", crc32c.crc32c(raw[21:])) + raw[21:]


def _outcome(decode: object, raw: bytes) -> object:
    try:
        produced = decode(raw)  # type: ignore[operator]
    except KafkaProtocolError as exc:
        return ("error", exc.code)
    if isinstance(produced, ProducedBatch):
        return _rows(produced)
    assert isinstance(produced, RecordBatch)
    return [(r.timestamp, r.key, r.value, r.headers) for r in produced.records]


@SOME
@given(batches(), st.data())
def test_hostile_record_bytes_get_the_checked_decoders_errors(
    batch: RecordBatch, data: st.DataObject
) -> None:
    raw = bytearray(encode_batch(RecordBatch(0, batch.records, producer_id=1, base_sequence=0)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(BATCH_OVERHEAD_BYTES, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    hostile = _resealed(bytes(raw))
    assert _outcome(decode_produced, hostile) == _outcome(decode_batch, hostile)


@pytest.mark.parametrize("count", [0, -1, 1 << 20])
def test_a_records_count_that_does_not_fit_is_refused(count: int) -> None:
    raw = bytearray(encode_batch(RecordBatch(0, (Record(0, 0, None, b"v"),))))
    struct.pack_into(">i", raw, 57, count)
    with pytest.raises(KafkaProtocolError) as checked:
        decode_batch(_resealed(bytes(raw)))
    with pytest.raises(KafkaProtocolError) as produced:
        decode_produced(_resealed(bytes(raw)))
    assert produced.value.code == checked.value.code
