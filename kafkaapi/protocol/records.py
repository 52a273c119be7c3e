"""Kafka's record batch v2 (magic 2), encoded and decoded (no I/O).

A batch, all integers big-endian::

    base_offset            int64
    batch_length           int32   bytes after this field
    partition_leader_epoch int32
    magic                  int8    2
    crc                    uint32  CRC-32C of everything after it (attributes .. end)
    attributes             int16   bits 0-2 compression, 3 timestamp type (1 = log append
                                   time), 4 transactional, 5 control, 6 delete horizon
    last_offset_delta      int32
    base_timestamp         int64
    max_timestamp          int64
    producer_id            int64   -1: not idempotent
    producer_epoch         int16
    base_sequence          int32
    records_count          int32
    records                        compressed as a whole when bits 0-2 say so

a record (varint = zigzag varint, see ``primitives.py``)::

    length varint (bytes after it), attributes int8 (unused, 0),
    timestamp_delta varlong, offset_delta varint,
    key_length varint (-1 = null key), key, value_length varint (-1 = null), value,
    headers_count varint, per header: key_length varint, key (UTF-8),
                                      value_length varint (-1 = null value), value

A control batch (bit 5) holds one record whose key is ``int16 version, int16 type``
(0 abort, 1 commit): :func:`control_type` reads it.

The CRC and lengths are checked before anything is decoded; every count is checked
against the bytes that could hold it, so bad input raises :class:`KafkaProtocolError`
(CORRUPT_MESSAGE, or RECORD_LIST_TOO_LARGE from decompression) and nothing else.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import crc32c

from kafkaapi.protocol.compression import DECOMPRESSED_BYTES_MAX, Compression, compress, decompress
from kafkaapi.protocol.errors import UNSUPPORTED_VERSION, KafkaProtocolError
from kafkaapi.protocol.primitives import corrupt, varint, varlong

__all__ = [
    "BATCH_OVERHEAD_BYTES",
    "Header",
    "PlainColumns",
    "ProducedBatch",
    "Record",
    "RecordBatch",
    "control_type",
    "decode_batch",
    "decode_batches",
    "decode_produced",
    "encode_batch",
    "encode_columns",
    "seal_plain",
    "split_batches",
]

Header = tuple[str, bytes | None]

_HEAD: Final = struct.Struct(">qiibI")  # base_offset .. crc
_BODY: Final = struct.Struct(">hiqqqhii")  # attributes .. records_count
BATCH_OVERHEAD_BYTES: Final = _HEAD.size + _BODY.size  # 61
_LENGTH_FIELD_END: Final = 12  # base_offset + batch_length: batch_length counts after it
_CRC_END: Final = _HEAD.size  # the CRC covers from here to the end
_MAGIC: Final = 2

_COMPRESSION_MASK: Final = 0x07
_LOG_APPEND_TIME: Final = 0x08
_TRANSACTIONAL: Final = 0x10
_CONTROL: Final = 0x20
_CONTROL_KEY: Final = struct.Struct(">hh")
CONTROL_TYPES: Final = {0: "ABORT", 1: "COMMIT"}


@dataclass(frozen=True, slots=True)
class Record:
    """One record, with absolute offset and timestamp (the batch's base plus deltas)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordBatch:
    base_offset: int
    records: tuple[Record, ...]
    compression: Compression = Compression.NONE
    log_append_time: bool = False  # timestamp type: false = the producer's create time
    transactional: bool = False
    control: bool = False
    partition_leader_epoch: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    # Set on decode: the batch's own fields (an empty batch has no records to derive them).
    last_offset_delta: int = field(default=-1, compare=False)
    base_timestamp: int = field(default=-1, compare=False)
    max_timestamp: int = field(default=-1, compare=False)

    @property
    def attributes(self) -> int:
        return (
            int(self.compression)
            | (_LOG_APPEND_TIME if self.log_append_time else 0)
            | (_TRANSACTIONAL if self.transactional else 0)
            | (_CONTROL if self.control else 0)
        )


def encode_batch(batch: RecordBatch) -> bytes:
    """The batch's bytes. Offsets and timestamps of its records become deltas from the
    batch's base offset and its first record's timestamp."""
    records = batch.records
    if not records:
        return _sealed(batch, b"", batch.last_offset_delta, batch.base_timestamp,
                       batch.max_timestamp, 0)  # fmt: skip
    timestamps = [r.timestamp for r in records]
    body = _records_body(
        batch.base_offset,
        [r.offset for r in records],
        timestamps,
        [r.key for r in records],
        [r.value for r in records],
        [r.headers for r in records],
    )
    last_delta = records[-1].offset - batch.base_offset
    return _sealed(batch, body, last_delta, timestamps[0], max(timestamps), len(records))


def encode_columns(
    offsets: Sequence[int],
    timestamps: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[Sequence[Header] | None],
    *,
    log_append_time: bool = False,
) -> bytes:
    """An uncompressed batch of the records given column by column (at least one;
    offsets increasing), as :func:`encode_batch` encodes it without a :class:`Record`
    per record: a fetch answer's batch, which a reader's records become directly."""
    base_offset = offsets[0]
    body = _records_body(base_offset, offsets, timestamps, keys, values, headers)
    return seal_plain(
        base_offset, body, offsets[-1] - base_offset, timestamps[0], max(timestamps),
        len(offsets), log_append_time=log_append_time,
    )  # fmt: skip


def seal_plain(  # noqa: PLR0917 - the batch's derived fields, in the header's order
    base_offset: int,
    body: bytes,
    last_delta: int,
    base_ts: int,
    max_ts: int,
    count: int,
    *,
    log_append_time: bool = False,
) -> bytes:
    """An uncompressed batch around ``count`` encoded records (``body``), no producer
    fields: a fetch answer's (also :mod:`kafkaapi.protocol.records_arrays`')."""
    batch = RecordBatch(base_offset=base_offset, records=(), log_append_time=log_append_time)
    return _sealed(batch, body, last_delta, base_ts, max_ts, count)


def _sealed(  # noqa: PLR0917 - private, the batch's derived fields
    batch: RecordBatch, body: bytes, last_delta: int, base_ts: int, max_ts: int, count: int
) -> bytes:
    """The batch's header and CRC around its (encoded) records."""
    payload = compress(batch.compression, body)
    tail = _BODY.pack(
        batch.attributes, last_delta, base_ts, max_ts,
        batch.producer_id, batch.producer_epoch, batch.base_sequence, count,
    )  # fmt: skip
    crc = crc32c.crc32c(payload, crc32c.crc32c(tail))
    length = BATCH_OVERHEAD_BYTES - _LENGTH_FIELD_END + len(payload)
    head = _HEAD.pack(batch.base_offset, length, batch.partition_leader_epoch, _MAGIC, crc)
    return head + tail + payload


# Zigzag varints of 0 .. 2**14 - 1, made once: nearly every length and delta of a batch
# is one of them, and a look-up is ~20x cheaper than encoding one (the per-record
# encoding was half a fetch's CPU in py-spy, issue 25).
_SMALL: Final = tuple(varint(i) for i in range(1 << 14))
_SMALL_END: Final = len(_SMALL)
_NULL: Final = varint(-1)
_NO_HEADERS: Final = varint(0)


def _records_body(  # noqa: PLR0917 - private hot path, called positionally
    base_offset: int,
    offsets: Sequence[int],
    timestamps: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[Sequence[Header] | None],
) -> bytes:
    """The records' bytes, one ``b"".join`` per record and one for all (lengths
    looked up inline: a call per field was a quarter of the loop's time)."""
    small, end = _SMALL, _SMALL_END
    base_ts = timestamps[0]
    parts: list[bytes] = []
    append, join = parts.append, b"".join
    for offset, ts, nullable_key, nullable_value, pairs in zip(
        offsets, timestamps, keys, values, headers, strict=True
    ):
        offset_delta, ts_delta = offset - base_offset, ts - base_ts
        if nullable_key is None:
            key_length, key = _NULL, b""
        else:
            key, size = nullable_key, len(nullable_key)
            key_length = small[size] if size < end else varint(size)
        if nullable_value is None:
            value_length, value = _NULL, b""
        else:
            value, size = nullable_value, len(nullable_value)
            value_length = small[size] if size < end else varint(size)
        record = join((
            b"\x00",  # attributes
            small[ts_delta] if 0 <= ts_delta < end else varlong(ts_delta),
            small[offset_delta] if 0 <= offset_delta < end else varint(offset_delta),
            key_length, key, value_length, value,
            _headers(pairs) if pairs else _NO_HEADERS,
        ))  # fmt: skip
        size = len(record)
        append(small[size] if size < end else varint(size))
        append(record)
    return join(parts)


def _headers(pairs: Sequence[Header]) -> bytes:
    out = bytearray(varint(len(pairs)))
    for key, value in pairs:
        raw = key.encode()
        out += varint(len(raw)) + raw
        out += _NULL if value is None else varint(len(value)) + value
    return bytes(out)


def decode_batches(
    data: bytes | memoryview, *, partial_tail: bool = False, bytes_max: int = DECOMPRESSED_BYTES_MAX
) -> list[RecordBatch]:
    """Every batch in a records field. A fetch response may end in a cut-off batch
    (``partial_tail=True`` drops it, as clients do); a produce request may not."""
    return [
        decode_batch(view, bytes_max=bytes_max)
        for view in split_batches(data, partial_tail=partial_tail)
    ]


def split_batches(data: bytes | memoryview, *, partial_tail: bool = False) -> list[memoryview]:
    """The bytes of every batch in a records field, by their lengths (nothing decoded)."""
    view = memoryview(bytes(data))
    batches = []
    pos = 0
    while pos < len(view):
        size = _batch_size(view, pos)
        if size is None or pos + size > len(view):
            if partial_tail:
                break
            raise corrupt(f"record batch cut off at byte {len(view) - pos} of it")
        batches.append(view[pos : pos + size])
        pos += size
    return batches


def _batch_size(view: memoryview, pos: int) -> int | None:
    if len(view) - pos < _LENGTH_FIELD_END:
        return None
    length: int = struct.unpack_from(">i", view, pos + 8)[0]
    if length < BATCH_OVERHEAD_BYTES - _LENGTH_FIELD_END:
        raise corrupt(f"record batch length {length} under the batch header's")
    return _LENGTH_FIELD_END + length


def decode_batch(
    data: bytes | memoryview, *, bytes_max: int = DECOMPRESSED_BYTES_MAX
) -> RecordBatch:
    """One whole batch (exactly its bytes): CRC and magic first, then the records."""
    head, records = _checked(data, bytes_max)
    return RecordBatch(
        base_offset=head.base_offset,
        records=_decode_records(records, head.records_count, head.base_offset, head.base_timestamp),
        compression=Compression(head.codec),
        log_append_time=head.log_append_time,
        transactional=head.transactional,
        control=head.control,
        partition_leader_epoch=head.partition_leader_epoch,
        producer_id=head.producer_id,
        producer_epoch=head.producer_epoch,
        base_sequence=head.base_sequence,
        last_offset_delta=head.last_offset_delta,
        base_timestamp=head.base_timestamp,
        max_timestamp=head.max_timestamp,
    )


class _Head(NamedTuple):
    """A batch's fields before its records."""

    base_offset: int
    partition_leader_epoch: int
    codec: int
    log_append_time: bool
    transactional: bool
    control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


def _checked(data: bytes | memoryview, bytes_max: int) -> tuple[_Head, bytes]:
    """A whole batch's fields and its records' bytes (decompressed), once its lengths,
    magic and CRC are checked."""
    view = memoryview(data)
    if len(view) < BATCH_OVERHEAD_BYTES:
        raise corrupt(f"record batch of {len(view)} bytes, under {BATCH_OVERHEAD_BYTES}")
    base_offset, length, leader_epoch, magic, crc = _HEAD.unpack_from(view, 0)
    if length != len(view) - _LENGTH_FIELD_END:
        raise corrupt(f"record batch length {length}, {len(view) - _LENGTH_FIELD_END} bytes")
    if magic != _MAGIC:
        raise KafkaProtocolError(UNSUPPORTED_VERSION, f"record batch magic {magic}, not 2")
    if crc32c.crc32c(view[_CRC_END:]) != crc:
        raise corrupt(f"record batch at offset {base_offset}: CRC mismatch")
    attributes, last_delta, base_ts, max_ts, pid, epoch, seq, count = _BODY.unpack_from(
        view, _CRC_END
    )
    codec = attributes & _COMPRESSION_MASK
    records = decompress(codec, view[BATCH_OVERHEAD_BYTES:], bytes_max)
    head = _Head(
        base_offset, leader_epoch, codec, bool(attributes & _LOG_APPEND_TIME),
        bool(attributes & _TRANSACTIONAL), bool(attributes & _CONTROL), last_delta,
        base_ts, max_ts, pid, epoch, seq, count,
    )  # fmt: skip
    return head, records


@dataclass(frozen=True, slots=True)
class PlainColumns:
    """A batch's records as columns, when none has headers or a null value (what
    producers send most): no object per record, the write core's own shape."""

    values: list[bytes]
    keys: list[bytes | None] | None  # None: no record has a key
    timestamps: list[int]  # absolute, the producer's


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """One batch of a Produce request, decoded for writing: its producer fields, and
    its records as ``columns`` when they are plain, else as ``records``."""

    count: int
    columns: PlainColumns | None
    records: tuple[Record, ...]
    log_append_time: bool
    transactional: bool
    control: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int


def decode_produced(
    data: bytes | memoryview, *, bytes_max: int = DECOMPRESSED_BYTES_MAX
) -> ProducedBatch:
    """One whole batch (exactly its bytes) of a Produce request: checked as
    :func:`decode_batch` checks it; plain records are decoded straight into columns."""
    head, raw = _checked(data, bytes_max)
    columns = _plain_columns(raw, head.records_count, head.base_timestamp)
    records = () if columns is not None else _decode_records(
        raw, head.records_count, head.base_offset, head.base_timestamp
    )  # fmt: skip
    return ProducedBatch(
        head.records_count, columns, records, head.log_append_time, head.transactional,
        head.control, head.producer_id, head.producer_epoch, head.base_sequence,
    )  # fmt: skip


def _plain_columns(data: bytes, count: int, base_ts: int) -> PlainColumns | None:
    """The records of ``data`` as columns, or None when one has headers or a null value
    -- or anything unusual: then :func:`_decode_records` decodes them one by one and
    refuses what is wrong with its checked errors. The hot loop of every produce, one
    pass with the one- and two-byte varints inline (lengths, deltas and the key's and
    value's lengths of 100-byte records take one or two), no call per field. Any length
    that points past its record is caught by the last check: every position only
    grows, so a value ending exactly before the record's headers count (0) means every
    field before it lay within the record."""
    if count <= 0 or count > len(data):
        return None
    values: list[bytes] = []
    keys: list[bytes | None] = []
    stamps: list[int] = []
    pos = 0
    try:
        for _ in range(count):
            raw = data[pos]  # the record's length
            if raw < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                raw = (raw & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                return None
            if raw & 1 or raw == 0:
                return None
            stop = pos + (raw >> 1)
            pos += 1  # attributes: none defined
            raw = data[pos]  # the timestamp delta (signed; a backlog's spans >63 ms)
            if raw < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                raw = (raw & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                raw, pos = _uvarint_at(data, pos, stop, 10)
                if raw >> 64:
                    return None
            delta = (raw >> 1) ^ -(raw & 1)
            while data[pos] >= 0x80:  # the offset delta: unused (offsets are the log's)
                pos += 1
            pos += 1
            raw = data[pos]  # the key's length, -1 (raw 1) for a null key
            if raw < 0x80:
                pos += 1
            else:
                raw, pos = _uvarint_at(data, pos, stop, 5)
            if raw == 1:
                key = None
            elif raw & 1:
                return None
            else:
                key = data[pos : pos + (raw >> 1)]
                pos += raw >> 1
            raw = data[pos]  # the value's length; odd: null (or corrupt)
            if raw < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                raw = (raw & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                raw, pos = _uvarint_at(data, pos, stop, 5)
            end = pos + (raw >> 1)
            if raw & 1 or end != stop - 1 or data[end] != 0:
                return None  # a null value, headers, or lengths that do not add up
            values.append(data[pos:end])
            keys.append(key)
            stamps.append(base_ts + delta)
            pos = stop
    except IndexError:
        return None
    if pos != len(data):
        return None
    return PlainColumns(values, None if keys.count(None) == count else keys, stamps)


def _uvarint_at(data: bytes, pos: int, end: int, bytes_max: int) -> tuple[int, int]:
    """The raw (not zigzag-decoded) varint at ``pos``; IndexError past ``end`` or after
    ``bytes_max`` bytes (the caller's cue to decode the slow, checked way)."""
    raw = 0
    for index in range(bytes_max):
        if pos >= end:
            raise IndexError(pos)
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            return raw, pos
    raise IndexError(pos)


def _decode_records(data: bytes, count: int, base_offset: int, base_ts: int) -> tuple[Record, ...]:
    # The hot loop of every produce and fetch: positions in plain ints over ``data``,
    # no Reader object per record; every length still checked before it is used.
    if count < 0 or count > len(data):  # a record takes at least one byte
        raise corrupt(f"{count} records in {len(data)} bytes")
    records = []
    pos = 0
    for _ in range(count):
        record, pos = _decode_record(data, pos, base_offset, base_ts)
        records.append(record)
    if pos != len(data):
        raise corrupt(f"{len(data) - pos} bytes after the batch's {count} records")
    return tuple(records)


def _decode_record(data: bytes, pos: int, base_offset: int, base_ts: int) -> tuple[Record, int]:
    length, pos = _varint_at(data, pos, len(data), _VARINT32)
    if length < 1 or length > len(data) - pos:
        raise corrupt(f"record length {length} with {len(data) - pos} bytes left")
    stop = pos + length
    pos += 1  # attributes: none defined
    timestamp_delta, pos = _varint_at(data, pos, stop, _VARINT64)
    offset_delta, pos = _varint_at(data, pos, stop, _VARINT32)
    key, pos = _nullable_at(data, pos, stop)
    value, pos = _nullable_at(data, pos, stop)
    count, pos = _varint_at(data, pos, stop, _VARINT32)
    if count < 0 or count > stop - pos:
        raise corrupt(f"{count} headers in {stop - pos} bytes")
    headers = []
    for _ in range(count):
        name, pos = _nullable_at(data, pos, stop)
        if name is None:
            raise corrupt("null header key")
        header_value, pos = _nullable_at(data, pos, stop)
        headers.append((_text(name), header_value))
    if pos != stop:
        raise corrupt(f"{stop - pos} bytes after a record's fields")
    offset = base_offset + offset_delta
    return Record(offset, base_ts + timestamp_delta, key, value, tuple(headers)), pos


# (bytes at most, mask): a zigzag varint of 32 bits takes up to 5 bytes, of 64 up to 10.
_VARINT32: Final = (5, 0xFFFFFFFF)
_VARINT64: Final = (10, 0xFFFFFFFFFFFFFFFF)


def _varint_at(data: bytes, pos: int, end: int, kind: tuple[int, int]) -> tuple[int, int]:
    """The zigzag varint at ``pos`` (not past ``end``) and the position after it."""
    if pos >= end:
        raise corrupt("truncated varint")
    byte = data[pos]
    if byte < 0x80:  # most lengths and deltas: one byte
        return (byte >> 1) ^ -(byte & 1), pos + 1
    bytes_max, mask = kind
    raw = 0
    for index in range(bytes_max):
        if pos >= end:
            raise corrupt("truncated varint")
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            raw &= mask
            return (raw >> 1) ^ -(raw & 1), pos
    raise corrupt(f"varint longer than {bytes_max} bytes")


def _nullable_at(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _varint_at(data, pos, end, _VARINT32)
    if length == -1:
        return None, pos
    if length < 0 or length > end - pos:
        raise corrupt(f"length {length} with {end - pos} bytes left")
    return data[pos : pos + length], pos + length


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise corrupt(f"header key is not UTF-8: {exc}") from exc


def control_type(record: Record) -> str:
    """ABORT or COMMIT: what a control batch's record marks."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise corrupt("control record without its key")
    _version, kind = _CONTROL_KEY.unpack_from(record.key)
    if kind not in CONTROL_TYPES:
        raise corrupt(f"control record of unknown type {kind}")
    return CONTROL_TYPES[kind]
