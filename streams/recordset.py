"""The record-set codec: many records in one ledger entry (pure, no I/O).

The byte layout (format v3, and what v1 and v2 differ in) is documented in
:mod:`streams.recordset_layout`; encoding is :mod:`streams.recordset_encode`. This
module decodes every version -- v1 records' ``bl.*`` marker headers are removed and
become their producer marker, v1 and v2 records' ``bookline.spark`` header their origin
tag -- and is where callers import the codec from.
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
    F_GAP,
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
    I_KNOWN,
    I_MARKER,
    I_TAG,
    LEGACY_COUNT,
    LEGACY_EPOCH,
    LEGACY_PREFIX,
    LEGACY_PRODUCER,
    LEGACY_SEQ,
    LEGACY_SPARK_TAG,
    MARKER_TAIL,
    REC,
    REC_V1,
    RECORD_SET_BYTES_MAX,
    RECORD_SET_VERSION,
    SET_LOG_APPEND_TIME,
    SET_SPARSE,
    U16,
    U32,
    VERSIONS_READ,
    RecordSetHeader,
)
from streams.recordset_sparse import encode_sparse_set

__all__ = [
    "HEADER_BYTES",
    "RECORD_SET_BYTES_MAX",
    "RECORD_SET_VERSION",
    "RecordSetHeader",
    "decode_header",
    "decode_internal",
    "decode_read_records",
    "decode_verified",
    "decode_with_markers",
    "encode_control",
    "encode_record_set",
    "encode_sparse_set",
    "verify_record_set",
]

# Builds ReadRecords (tuples) without a Python-level call.
_new = tuple.__new__
_U64 = struct.Struct(">Q")

# A record's extras: (key, headers, timestamp, producer marker, origin tag, position
# after them).
Extras = tuple[bytes | None, Headers | None, int, ProducerMarker | None, bytes | None, int]
ExtrasParser = Callable[[bytes, int, int, int], Extras]


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
    sparse = bool(flags & SET_SPARSE)
    if stored_len != len(stored) or raw_len > RECORD_SET_BYTES_MAX or (user > count and not sparse):
        raise BadRequestError("record set header lengths are inconsistent")
    comp_bits = flags & COMPRESSION_MASK
    known = COMPRESSION_MASK | (SET_LOG_APPEND_TIME | SET_SPARSE if version >= 2 else 0)
    if comp_bits > Compression.ZSTD or flags & ~known:
        raise BadRequestError(f"record set flags {flags:#x} unknown")
    compression = Compression(comp_bits)
    ts_type = LOG_APPEND_TIME if flags & SET_LOG_APPEND_TIME else CREATE_TIME
    header = RecordSetHeader(compression, count, user, first, ftx, ltx, base, before,
                             stored_len, raw_len, version, ts_type, sparse)  # fmt: skip
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


def extras_parser(version: int) -> ExtrasParser:
    """The parser of a record's extras in a set of format ``version`` (one that
    :func:`verify_record_set` accepted)."""
    return _extras if version >= 3 else _extras_v2 if version == 2 else _extras_v1


def _extras(body: bytes, pos: int, flags: int, ts: int) -> Extras:
    """A v3 record's extras (:mod:`streams.recordset_layout`), from ``pos``."""
    key, headers, ts, pos = _user_extras(body, pos, flags, ts)
    if not flags & F_MARKER:
        return key, headers, ts, None, None, pos
    marker, tag, pos = _internal(body, pos, len(body))
    return key, headers, ts, marker, tag, pos


def _extras_v2(body: bytes, pos: int, flags: int, ts: int) -> Extras:
    """A v2 record's extras: flag 0x40 is the producer marker alone, and a
    ``bookline.spark`` header is the record's origin tag."""
    key, headers, ts, pos = _user_extras(body, pos, flags, ts)
    marker: ProducerMarker | None = None
    if flags & F_MARKER:
        marker, pos = _marker(body, pos, len(body))
    if headers is None:
        return key, None, ts, marker, None, pos
    headers, tag = _strip_spark_tag(headers)
    return key, headers, ts, marker, tag, pos


def _user_extras(body: bytes, pos: int, flags: int, ts: int) -> tuple[
    bytes | None, Headers | None, int, int
]:  # fmt: skip
    """A v2/v3 record's timestamp, key and headers, from ``pos``."""
    if flags & ~F_KNOWN:
        raise BadRequestError(f"record flags {flags:#x} unknown")
    end = len(body)
    if flags & F_TIMESTAMP:
        _need(pos + 8, end)
        (ts,) = I64.unpack_from(body, pos)
        pos += 8
    key, pos = _key(body, pos, end) if flags & F_KEY else (None, pos)
    headers, pos = _headers(body, pos, end, I32) if flags & F_HEADERS else (None, pos)
    return key, headers, ts, pos


def _extras_v1(body: bytes, pos: int, flags: int, ts: int) -> Extras:
    """A v1 record's extras: its ``bl.*`` headers removed, its marker made from them,
    its ``bookline.spark`` header its origin tag."""
    if flags & ~F_KNOWN_V1:
        raise BadRequestError(f"record flags {flags:#x} unknown in format 1")
    end = len(body)
    key, pos = _key(body, pos, end) if flags & F_KEY else (None, pos)
    if not flags & F_HEADERS:
        return key, None, ts, None, None, pos
    pairs, pos = _headers(body, pos, end, U32)
    headers, marker = _strip_legacy(pairs)
    if headers is None:
        return key, None, ts, marker, None, pos
    headers, tag = _strip_spark_tag(headers)
    return key, headers, ts, marker, tag, pos


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


def _internal(body: bytes, pos: int, end: int) -> tuple[ProducerMarker | None, bytes | None, int]:
    """A v3 record's internal extras: its producer marker and origin tag, if any."""
    _need(pos + 1, end)
    kinds = body[pos]
    pos += 1
    if not kinds or kinds & ~I_KNOWN:
        raise BadRequestError(f"record internal extras {kinds:#x} unknown")
    marker: ProducerMarker | None = None
    tag: bytes | None = None
    if kinds & I_MARKER:
        marker, pos = _marker(body, pos, end)
    if kinds & I_TAG:
        _need(pos + 2, end)
        (tlen,) = U16.unpack_from(body, pos)
        pos += 2
        _need(pos + tlen, end)
        tag = body[pos : pos + tlen]
        pos += tlen
    return marker, tag, pos


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


def _strip_spark_tag(headers: Headers) -> tuple[Headers | None, bytes | None]:
    """A v1/v2 record's headers without the Spark sink's ``bookline.spark`` ones, and
    the (first) tag they held. Before format v3 the sink's tag was such a header."""
    if not any(n == LEGACY_SPARK_TAG for n, _v in headers):
        return headers, None
    tag = next(v for n, v in headers if n == LEGACY_SPARK_TAG)
    user = [(n, v) for n, v in headers if n != LEGACY_SPARK_TAG]
    return user or None, tag


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
    v2/v3 framing or v1 ``bl.*`` headers): what a write proxy rebuilds its
    de-duplication table from. Readers never see the markers."""
    header, out, markers, _tags = decode_internal(data, stream, segment_seqno, entry_id,
                                                  start_sequence_id)  # fmt: skip
    return header, out, markers


def decode_internal(
    data: bytes, stream: str, segment_seqno: int, entry_id: int, start_sequence_id: int
) -> tuple[RecordSetHeader, list[ReadRecord], dict[int, ProducerMarker], dict[int, bytes]]:
    """The entry's records and the internal extras they carry, by slot: producer
    markers (:func:`decode_with_markers`) and origin tags (v3 framing, or a v1/v2
    ``bookline.spark`` header) -- what the Spark sink scans for its earlier writes and
    compaction keeps. Readers never see them."""
    header, body = _verified(data)
    markers: dict[int, ProducerMarker] = {}
    tags: dict[int, bytes] = {}
    seq = start_sequence_id + header.first_index
    out, _eos = _decode_each(body, header, stream, segment_seqno, entry_id, seq, 0,
                             (markers, tags))  # fmt: skip
    return header, out, markers, tags


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
    internal: tuple[dict[int, ProducerMarker], dict[int, bytes]] | None,
) -> tuple[list[ReadRecord], bool]:
    """One record at a time. Lengths are checked once, not per record: a length that
    runs past the body makes the next header unpack fail or leaves the end misaligned,
    and either raises before any record is returned. Records without extras (flags 0)
    take the short branch: the catch-up read path's. ``internal``: dicts to fill with
    the records' producer markers and origin tags by slot (None: dropped)."""
    out: list[ReadRecord] = []
    append = out.append
    v2 = header.version >= 2
    unpack = REC.unpack_from if v2 else REC_V1.unpack_from
    unpack_u32 = U32.unpack_from
    extras = extras_parser(header.version)
    base_ts = header.base_ts_ms
    ts_type = header.timestamp_type
    payload: bytes | None
    key: bytes | None
    seq0 = seq
    pos = 0
    eos = False
    shift = 0  # offsets compaction removed so far in this set (sparse sets only)
    try:
        for i in range(header.count):
            flags, txid, dts, plen = unpack(body, pos)
            pos += 17  # RECORD_OVERHEAD_BYTES, a literal in the hot loop
            if not flags:  # the catch-up read path's record: no extras
                key = hdrs = None
                ts = base_ts + dts
                stop = pos + plen
                payload = body[pos:stop]
                slot = i + shift
            elif flags == F_KEY:  # a keyed record, the common extra (same in v1): inline
                (klen,) = unpack_u32(body, pos)
                pos += 4
                key = body[pos : pos + klen]
                pos += klen
                hdrs = None
                ts = base_ts + dts
                stop = pos + plen
                payload = body[pos:stop]
                slot = i + shift
            else:
                if flags & F_SKIP:
                    eos = eos or bool(flags & F_END_OF_STREAM)
                    pos += plen
                    continue
                if flags & F_GAP:
                    gap, pos = _gap(body, pos, header)
                    seq += gap
                    shift += gap
                    flags &= ~F_GAP
                key, hdrs, ts, marker, tag, pos = extras(body, pos, flags, base_ts + dts)
                slot = i + shift
                if internal is not None:
                    _keep_internal(internal, slot, marker, tag)
                stop = pos + plen
                if flags & F_NULL:
                    _check_null(plen)
                    payload = None
                else:
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
    if seq - seq0 != header.user_count and not (header.sparse and seq - seq0 <= header.user_count):
        # Readers rely on the count to tell user sets from control ones.
        raise BadRequestError("record set user count does not match its records")
    return out, eos


def _keep_internal(
    internal: tuple[dict[int, ProducerMarker], dict[int, bytes]],
    slot: int,
    marker: ProducerMarker | None,
    tag: bytes | None,
) -> None:
    if marker is not None:
        internal[0][slot] = marker
    if tag is not None:
        internal[1][slot] = tag


def _gap(body: bytes, pos: int, header: RecordSetHeader) -> tuple[int, int]:
    """A record's offset gap (sparse sets only) and the position after it."""
    if not header.sparse:
        raise BadRequestError("record has an offset gap in a set that is not sparse")
    _need(pos + 4, len(body))
    (gap,) = U32.unpack_from(body, pos)
    return gap, pos + 4


def _check_null(plen: int) -> None:
    if plen:
        raise BadRequestError(f"a null value with a payload length of {plen}")
