"""The record-set codec: many records in one ledger entry (pure, no I/O).

The byte layout (format v2, and what v1 differs in) is documented in
:mod:`streams.recordset_layout`; encoding is :mod:`streams.recordset_encode`. This
module decodes both versions -- v1 records' ``bl.*`` marker headers are removed and
become their producer marker -- and is where callers import the codec from.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import crc32c
import lz4.block
import zstandard

from foundation.errors import BadRequestError, ChecksumError
from streams.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    Compression,
    Headers,
    ProducerMarker,
    ReadRecord,
)
from streams.recordset_encode import encode_control, encode_record_set
from streams.recordset_layout import (
    COMPRESSION_MASK,
    CRC,
    F_END_OF_STREAM,
    F_HEADERS,
    F_KEY,
    F_KNOWN,
    F_KNOWN_V1,
    F_MARKER,
    F_NULL,
    F_SKIP,
    F_TIMESTAMP,
    HEADER,
    HEADER_BYTES,
    I32,
    I64,
    LEGACY_COUNT,
    LEGACY_EPOCH,
    LEGACY_PREFIX,
    LEGACY_PRODUCER,
    LEGACY_SEQ,
    MARKER_TAIL,
    REC,
    REC_V1,
    RECORD_SET_BYTES_MAX,
    RECORD_SET_VERSION,
    SET_LOG_APPEND_TIME,
    U16,
    U32,
    VERSIONS_READ,
    RecordSetHeader,
)

__all__ = [
    "HEADER_BYTES",
    "RECORD_SET_BYTES_MAX",
    "RECORD_SET_VERSION",
    "RecordSetHeader",
    "decode_header",
    "decode_read_records",
    "decode_verified",
    "decode_with_markers",
    "encode_control",
    "encode_record_set",
    "verify_record_set",
]

# Builds ReadRecords (tuples) without a Python-level call.
_new = tuple.__new__
_U64 = struct.Struct(">Q")

# A record's extras: (key, headers, timestamp, marker, position after them).
Extras = tuple[bytes | None, Headers | None, int, ProducerMarker | None, int]


def decode_header(data: bytes) -> RecordSetHeader:
    """Verify the checksum and return the header (the body is not parsed)."""
    header, _body = _verified(data)
    return header


def verify_record_set(data: bytes) -> tuple[RecordSetHeader, bytes]:
    """Verify the checksum; the header and the raw (decompressed) body, not parsed yet.
    With :func:`decode_verified` this splits :func:`decode_read_records` in two, so a
    reader can check a set when it arrives and build its records when they are read."""
    return _verified(data)


def _verified(data: bytes) -> tuple[RecordSetHeader, bytes]:
    if len(data) < HEADER_BYTES:
        raise ChecksumError(f"record set of {len(data)} bytes is shorter than its header")
    version = data[0]
    if version not in VERSIONS_READ:
        raise BadRequestError(f"record set version {version} is not one of {VERSIONS_READ}")
    fields = HEADER.unpack_from(data, 0)
    (crc,) = CRC.unpack_from(data, HEADER.size)
    stored = data[HEADER_BYTES:]
    if crc32c.crc32c(stored, crc32c.crc32c(data[: HEADER.size])) != crc:
        raise ChecksumError("record set checksum mismatch")
    (_v, flags, count, user, first, ftx, ltx, base, before, stored_len, raw_len) = fields
    if stored_len != len(stored) or raw_len > RECORD_SET_BYTES_MAX or user > count:
        raise BadRequestError("record set header lengths are inconsistent")
    comp_bits = flags & COMPRESSION_MASK
    known = COMPRESSION_MASK | (SET_LOG_APPEND_TIME if version >= 2 else 0)
    if comp_bits > Compression.ZSTD or flags & ~known:
        raise BadRequestError(f"record set flags {flags:#x} unknown")
    compression = Compression(comp_bits)
    ts_type = LOG_APPEND_TIME if flags & SET_LOG_APPEND_TIME else CREATE_TIME
    header = RecordSetHeader(compression, count, user, first, ftx, ltx, base, before,
                             stored_len, raw_len, version, ts_type)  # fmt: skip
    return header, _decompress(stored, compression, raw_len)


def _decompress(stored: bytes, compression: Compression, raw_len: int) -> bytes:
    if compression is Compression.NONE:
        body = stored
    else:
        try:
            if compression is Compression.LZ4:
                body = lz4.block.decompress(stored, uncompressed_size=raw_len)
            else:
                body = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_len)
        except Exception as exc:  # each library raises its own type for bad input
            raise BadRequestError(f"record set body does not decompress: {exc}") from exc
    if len(body) != raw_len:
        raise BadRequestError(f"record set body is {len(body)} bytes, header says {raw_len}")
    return body


def _extras(body: bytes, pos: int, flags: int, ts: int) -> Extras:
    """A v2 record's extras (:mod:`streams.recordset_layout`), from ``pos``."""
    if flags & ~F_KNOWN:
        raise BadRequestError(f"record flags {flags:#x} unknown")
    end = len(body)
    if flags & F_TIMESTAMP:
        _need(pos + 8, end)
        (ts,) = I64.unpack_from(body, pos)
        pos += 8
    key, pos = _key(body, pos, end) if flags & F_KEY else (None, pos)
    headers, pos = _headers(body, pos, end, I32) if flags & F_HEADERS else (None, pos)
    marker: ProducerMarker | None = None
    if flags & F_MARKER:
        marker, pos = _marker(body, pos, end)
    return key, headers, ts, marker, pos


def _extras_v1(body: bytes, pos: int, flags: int, ts: int) -> Extras:
    """A v1 record's extras: its ``bl.*`` headers removed, its marker made from them."""
    if flags & ~F_KNOWN_V1:
        raise BadRequestError(f"record flags {flags:#x} unknown in format 1")
    end = len(body)
    key, pos = _key(body, pos, end) if flags & F_KEY else (None, pos)
    if not flags & F_HEADERS:
        return key, None, ts, None, pos
    pairs, pos = _headers(body, pos, end, U32)
    headers, marker = _strip_legacy(pairs)
    return key, headers, ts, marker, pos


def _key(body: bytes, pos: int, end: int) -> tuple[bytes, int]:
    _need(pos + 4, end)
    (klen,) = U32.unpack_from(body, pos)
    pos += 4
    _need(pos + klen, end)
    return body[pos : pos + klen], pos + klen


def _headers(body: bytes, pos: int, end: int, value_len: struct.Struct) -> tuple[Headers, int]:
    """Headers as pairs; ``value_len`` is v2's signed length (-1: null) or v1's u32."""
    _need(pos + 2, end)
    (hcount,) = U16.unpack_from(body, pos)
    pos += 2
    headers: Headers = []
    for _ in range(hcount):
        _need(pos + 2, end)
        (nlen,) = U16.unpack_from(body, pos)
        pos += 2
        _need(pos + nlen + 4, end)
        try:
            name = body[pos : pos + nlen].decode()
        except UnicodeDecodeError as exc:
            raise BadRequestError("record header name is not UTF-8") from exc
        pos += nlen
        (vlen,) = value_len.unpack_from(body, pos)
        pos += 4
        if vlen < 0:
            if vlen != -1:
                raise BadRequestError(f"record header value length {vlen}")
            headers.append((name, None))
            continue
        _need(pos + vlen, end)
        headers.append((name, body[pos : pos + vlen]))
        pos += vlen
    return headers, pos


def _marker(body: bytes, pos: int, end: int) -> tuple[ProducerMarker, int]:
    _need(pos + 2, end)
    (plen,) = U16.unpack_from(body, pos)
    pos += 2
    _need(pos + plen + MARKER_TAIL.size, end)
    try:
        producer = body[pos : pos + plen].decode()
    except UnicodeDecodeError as exc:
        raise BadRequestError("producer marker id is not UTF-8") from exc
    pos += plen
    epoch, seq, count = MARKER_TAIL.unpack_from(body, pos)
    return ProducerMarker(producer, epoch, seq, count), pos + MARKER_TAIL.size


def _strip_legacy(headers: Headers) -> tuple[Headers | None, ProducerMarker | None]:
    """A v1 record's headers without Bookline's ``bl.*`` ones, and the producer marker
    those held (None when they hold none)."""
    internal = {n: v for n, v in headers if n.startswith(LEGACY_PREFIX)}
    if not internal:
        return headers, None
    user = [(n, v) for n, v in headers if not n.startswith(LEGACY_PREFIX)]
    return user or None, _legacy_marker(internal)


def _legacy_marker(internal: dict[str, bytes | None]) -> ProducerMarker | None:
    raw = [internal.get(n) for n in (LEGACY_PRODUCER, LEGACY_SEQ, LEGACY_COUNT)]
    producer, seq, count = raw
    if producer is None or seq is None or count is None:
        return None
    epoch = internal.get(LEGACY_EPOCH)
    try:
        return ProducerMarker(
            producer.decode(),
            0 if epoch is None else U32.unpack(epoch)[0],
            _U64.unpack(seq)[0],
            U32.unpack(count)[0],
        )
    except (UnicodeDecodeError, struct.error):
        return None  # malformed: not a marker the write proxy wrote


def _need(upto: int, end: int) -> None:
    if upto > end:
        raise BadRequestError("record set body is truncated")


def decode_read_records(  # noqa: PLR0917 - the hot path is called positionally
    data: bytes,
    stream: str,
    segment_seqno: int,
    entry_id: int,
    start_sequence_id: int,
    from_slot: int = 0,
) -> tuple[RecordSetHeader, list[ReadRecord], bool]:
    """Decode one entry into the records a reader sees (user records at or after
    ``from_slot``), and whether the set carries the end-of-stream marker."""
    header, body = _verified(data)
    out, eos = decode_verified(header, body, stream, segment_seqno, entry_id,
                               start_sequence_id, from_slot)  # fmt: skip
    return header, out, eos


def decode_with_markers(
    data: bytes, stream: str, segment_seqno: int, entry_id: int, start_sequence_id: int
) -> tuple[RecordSetHeader, list[ReadRecord], dict[int, ProducerMarker]]:
    """The entry's records and the producer markers they carry (slot -> marker; from
    v2 framing or v1 ``bl.*`` headers): what a write proxy rebuilds its
    de-duplication table from. Readers never see the markers."""
    header, body = _verified(data)
    markers: dict[int, ProducerMarker] = {}
    seq = start_sequence_id + header.first_index
    out, _eos = _decode_each(body, header, stream, segment_seqno, entry_id, seq, 0, markers)
    return header, out, markers


def decode_verified(  # noqa: PLR0917 - the hot path is called positionally
    header: RecordSetHeader,
    body: bytes,
    stream: str,
    segment_seqno: int,
    entry_id: int,
    start_sequence_id: int,
    from_slot: int = 0,
) -> tuple[list[ReadRecord], bool]:
    """The records (at or after ``from_slot``) and end-of-stream flag of a set that
    :func:`verify_record_set` returned."""
    seq = start_sequence_id + header.first_index
    return _decode_each(body, header, stream, segment_seqno, entry_id, seq, from_slot, None)


def _decode_each(  # noqa: PLR0917 - private hot path
    body: bytes,
    header: RecordSetHeader,
    stream: str,
    segment_seqno: int,
    entry_id: int,
    seq: int,
    from_slot: int,
    markers: dict[int, ProducerMarker] | None,
) -> tuple[list[ReadRecord], bool]:
    """One record at a time. Lengths are checked once, not per record: a length that
    runs past the body makes the next header unpack fail or leaves the end misaligned,
    and either raises before any record is returned. Records without extras (flags 0)
    take the short branch: the catch-up read path's."""
    out: list[ReadRecord] = []
    append = out.append
    v2 = header.version >= 2
    unpack = REC.unpack_from if v2 else REC_V1.unpack_from
    extras: Callable[[bytes, int, int, int], Extras] = _extras if v2 else _extras_v1
    base_ts = header.base_ts_ms
    ts_type = header.timestamp_type
    seq0 = seq
    pos = 0
    eos = False
    try:
        for slot in range(header.count):
            flags, txid, dts, plen = unpack(body, pos)
            pos += 17  # RECORD_OVERHEAD_BYTES, a literal in the hot loop
            if flags:
                if flags & F_SKIP:
                    eos = eos or bool(flags & F_END_OF_STREAM)
                    pos += plen
                    continue
                key, hdrs, ts, marker, pos = extras(body, pos, flags, base_ts + dts)
                if marker is not None and markers is not None:
                    markers[slot] = marker
                stop = pos + plen
                if flags & F_NULL:
                    _check_null(plen)
                    payload = None
                else:
                    payload = body[pos:stop]
            else:
                key = hdrs = None
                ts = base_ts + dts
                stop = pos + plen
                payload = body[pos:stop]
            if slot >= from_slot:
                append(_new(ReadRecord, (stream, segment_seqno, entry_id, slot, seq, txid, ts,
                                         payload, key, hdrs, ts_type)))  # fmt: skip
            seq += 1
            pos = stop
    except struct.error as exc:
        raise BadRequestError("record set body is truncated") from exc
    if pos != len(body):
        raise BadRequestError("record set body is truncated or has trailing bytes")
    if seq - seq0 != header.user_count:
        # Readers rely on the count to tell user sets from control ones.
        raise BadRequestError("record set user count does not match its records")
    return out, eos


def _check_null(plen: int) -> None:
    if plen:
        raise BadRequestError(f"a null value with a payload length of {plen}")
