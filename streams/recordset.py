"""The record-set codec: many records in one ledger entry (pure, no I/O).

A writer batches records into a *record set*, which becomes the payload of one ledger
entry. Byte layout (all integers big-endian)::

    record set
    offset  size  field
    0       1     version (RECORD_SET_VERSION = 1)
    1       1     flags: bits 0-1 compression (0 none, 1 lz4 block, 2 zstd)
    2       4     records in the set (user + control)
    6       4     user records in the set
    10      8     first index: user records of the segment before this set
    18      8     first txid of the set's user records (-1: none)
    26      8     last txid of the segment up to and including this set (-1: none)
    34      8     base timestamp, ms since the epoch
    42      8     payload bytes of the segment's user records before this set
    50      4     stored body length (after compression)
    54      4     raw body length (before compression)
    58      4     CRC32C over bytes [0, 58) then the stored body
    62      n     body (compressed as the flags say)

    record (inside the raw body, one after the other)
    0       1     flags: 0x01 control, 0x02 end of stream, 0x04 has key, 0x08 has headers
    1       8     txid (signed)
    9       4     timestamp delta from the set's base timestamp, ms (unsigned)
    13      4     payload length
    17      ...   [key length u32, key] if 0x04; [header count u16, then per header
                  name length u16, name utf-8, value length u32, value] if 0x08; payload

The checksum is verified before anything else is decoded, and every length is checked
against what is left, so corrupt input raises :class:`ChecksumError` (or
:class:`BadRequestError` for a well-checksummed but malformed set), never an
``IndexError``. The ledger layer checksums the entry as well; this one also covers the
decompressed body's framing and keeps a record set verifiable wherever it is copied.

Control records (which let the writer advance the LAC when idle) and the end-of-stream
marker occupy a slot but are never handed to readers. A record's sequence id is the
segment's ``start_sequence_id`` + the set's first index + its index among the set's
user records.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import sub

import crc32c
import lz4.block
import zstandard

from foundation.errors import BadRequestError, ChecksumError, TooLargeError
from foundation.invariants import invariant
from streams.records import (
    CREATE_TIME,
    RECORD_OVERHEAD_BYTES,
    Compression,
    Headers,
    HeadersIn,
    ReadRecord,
    header_pairs,
)

__all__ = [
    "HEADER_BYTES",
    "RECORD_SET_BYTES_MAX",
    "RECORD_SET_VERSION",
    "RecordSetHeader",
    "decode_header",
    "decode_read_records",
    "decode_verified",
    "encode_control",
    "encode_record_set",
    "verify_record_set",
]

RECORD_SET_VERSION = 1
_HEADER = struct.Struct(">BBIIqqqqqII")
_CRC = struct.Struct(">I")
HEADER_BYTES = _HEADER.size + _CRC.size  # 62
_REC = struct.Struct(">BqII")
invariant(_REC.size == RECORD_OVERHEAD_BYTES, "record framing is %d bytes", _REC.size)
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
# A raw body is never larger than this (the ledger entry limit is 4 MiB; the margin
# covers compression that did not pay off); bounds decompression of hostile input.
RECORD_SET_BYTES_MAX = 16 << 20
# Headers per record and their sizes: metadata, not a second payload.
HEADERS_PER_RECORD_MAX = 64
HEADER_NAME_BYTES_MAX = 256
TS_DELTA_MAX = 0xFFFFFFFF
# encode_record_set frames records per run of equal (txid, timestamp) while runs
# average at least this many records; shorter runs are framed one by one.
FRAMING_RUN_RECORDS_MIN = 8
# Builds ReadRecords (tuples) without a Python-level call.
_new = tuple.__new__

F_CONTROL = 0x01
F_END_OF_STREAM = 0x02
F_KEY = 0x04
F_HEADERS = 0x08
_F_SKIP = F_CONTROL | F_END_OF_STREAM
_COMPRESSION_MASK = 0x03


@dataclass(frozen=True, slots=True)
class RecordSetHeader:
    compression: Compression
    count: int  # every record, control ones included (slots 0..count-1)
    user_count: int
    first_index: int  # user records of the segment before this set
    first_txid: int  # -1: the set holds no user record
    last_txid: int  # the segment's last user txid so far (-1: none yet)
    base_ts_ms: int
    bytes_before: int  # payload bytes of the segment's user records before this set
    stored_bytes: int
    raw_bytes: int


# -- encoding --------------------------------------------------------------------


def _compress(raw: bytes, compression: Compression) -> tuple[bytes, Compression]:
    if compression is Compression.LZ4:
        out: bytes = lz4.block.compress(raw, store_size=False)
    elif compression is Compression.ZSTD:
        out = zstandard.ZstdCompressor(level=1).compress(raw)
    else:
        return raw, Compression.NONE
    if len(out) >= len(raw):
        return raw, Compression.NONE  # incompressible: store raw, save the reader work
    return out, compression


def _encode_extras(key: bytes | None, headers: HeadersIn | None) -> bytes:
    parts: list[bytes] = []
    if key is not None:
        parts += (_U32.pack(len(key)), key)
    if headers is not None:
        if len(headers) > HEADERS_PER_RECORD_MAX:
            raise BadRequestError(f"at most {HEADERS_PER_RECORD_MAX} headers per record")
        parts.append(_U16.pack(len(headers)))
        for name, value in header_pairs(headers):
            raw_name = name.encode()
            if len(raw_name) > HEADER_NAME_BYTES_MAX:
                raise BadRequestError(f"header name longer than {HEADER_NAME_BYTES_MAX} bytes")
            if value is None:
                raise BadRequestError("null header values need record set format v2")
            parts += (_U16.pack(len(raw_name)), raw_name, _U32.pack(len(value)), bytes(value))
    return b"".join(parts)


def _seal(  # noqa: PLR0917 - private; one positional field per header field
    body: bytes,
    count: int,
    user_count: int,
    first_index: int,
    first_txid: int,
    last_txid: int,
    base_ts_ms: int,
    bytes_before: int,
    compression: Compression,
) -> bytes:
    if len(body) > RECORD_SET_BYTES_MAX:
        raise TooLargeError(f"record set of {len(body)} bytes exceeds {RECORD_SET_BYTES_MAX}")
    stored, used = _compress(body, compression)
    header = _HEADER.pack(
        RECORD_SET_VERSION,
        int(used),
        count,
        user_count,
        first_index,
        first_txid,
        last_txid,
        base_ts_ms,
        bytes_before,
        len(stored),
        len(body),
    )
    crc = crc32c.crc32c(stored, crc32c.crc32c(header))
    return b"".join((header, _CRC.pack(crc), stored))


def encode_record_set(
    payloads: Sequence[bytes],
    txids: Sequence[int],
    timestamps_ms: Sequence[int],
    *,
    first_index: int,
    bytes_before: int,
    last_txid: int,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[HeadersIn | None] | None = None,
    compression: Compression = Compression.NONE,
) -> bytes:
    """Encode user records (parallel sequences) into one record set.

    ``last_txid`` is the segment's last txid after this set (the writer's running
    value). ``keys``/``headers`` are None when no record has any (the fast path)."""
    n = len(payloads)
    if n == 0 or len(txids) != n or len(timestamps_ms) != n:
        raise BadRequestError("a record set needs >= 1 record and parallel txids/timestamps")
    base_ts = timestamps_ms[0]
    if keys is None and headers is None:
        body = _plain_body(payloads, txids, timestamps_ms, base_ts)
    else:
        body = _body_with_extras(payloads, txids, timestamps_ms, base_ts, keys, headers)
    return _seal(body, n, n, first_index, txids[0], last_txid, base_ts, bytes_before, compression)


def _plain_body(
    payloads: Sequence[bytes], txids: Sequence[int], timestamps_ms: Sequence[int], base_ts: int
) -> bytes:
    """The body of records without keys or headers: each record's framing, then its
    payload. A writer's records come in runs sharing a txid and a timestamp (a
    write_many gives all its records one of each), so within a run a record's framing
    depends on its length only: it is packed once per distinct length and the body is
    assembled with C-level calls -- instead of one ``pack`` per record, which was most
    of the encoder's time; when all of them share one framing (same-size records),
    it is the separator of one ``join``. Records in no such run (every txid
    different) are packed one by one, as before; the bytes are the same either way."""
    n = len(payloads)
    lens = list(map(len, payloads))
    txid, ts, length = txids[0], timestamps_ms[0], lens[0]
    if lens.count(length) == n and txids.count(txid) == n and timestamps_ms.count(ts) == n:
        # One framing for every record (a write_many of same-size records): it is the
        # separator, so nothing is built per record.
        return _REC.pack(0, txid, ts - base_ts, length).join((b"", *payloads))
    framing = _framing_by_runs(txids, timestamps_ms, base_ts, lens)
    if framing is None:
        pack = _REC.pack
        framing = list(map(pack, repeat(0, n), txids, map(sub, timestamps_ms, repeat(base_ts, n)),
                           lens))  # fmt: skip
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = framing
    parts[1::2] = payloads if isinstance(payloads, list | tuple) else list(payloads)
    return b"".join(parts)


def _framing_by_runs(
    txids: Sequence[int], timestamps_ms: Sequence[int], base_ts: int, lens: list[int]
) -> list[bytes] | None:
    """Every record's framing, built per run of equal (txid, timestamp); None as soon
    as runs turn out short (under ``FRAMING_RUN_RECORDS_MIN`` records on average after
    a few): the per-record path is cheaper then. Runs are found by bisecting -- a
    writer's txids and timestamps never decrease -- and each one is checked, so
    unsorted input only ends up on the per-record path."""
    n = len(lens)
    txid_list = txids if isinstance(txids, list) else list(txids)
    ts_list = timestamps_ms if isinstance(timestamps_ms, list) else list(timestamps_ms)
    pack = _REC.pack
    framing: list[bytes] = []
    i = runs = 0
    while i < n:
        if runs >= 4 and i < runs * FRAMING_RUN_RECORDS_MIN:
            return None
        txid, ts = txid_list[i], ts_list[i]
        j = min(bisect_right(txid_list, txid, i), bisect_right(ts_list, ts, i))
        if j <= i or txid_list[i:j].count(txid) != j - i or ts_list[i:j].count(ts) != j - i:
            return None  # not sorted: bisect's answer is not a run
        run_lens = lens[i:j]
        distinct = set(run_lens)
        if len(distinct) * 2 > len(run_lens):  # mostly different lengths: pack each
            framing += map(pack, repeat(0), repeat(txid), repeat(ts - base_ts), run_lens)
        else:
            by_len = {length: pack(0, txid, ts - base_ts, length) for length in distinct}
            framing += map(by_len.__getitem__, run_lens)
        i = j
        runs += 1
    return framing


def _body_with_extras(  # noqa: PLR0917 - private; the parallel sequences of one set
    payloads: Sequence[bytes],
    txids: Sequence[int],
    timestamps_ms: Sequence[int],
    base_ts: int,
    keys: Sequence[bytes | None] | None,
    headers: Sequence[HeadersIn | None] | None,
) -> bytes:
    n = len(payloads)
    marked = _few_with_headers(keys, headers)
    if marked is not None:
        return _body_with_few_headers(payloads, txids, timestamps_ms, base_ts, headers, marked)
    pack = _REC.pack
    parts: list[bytes] = []
    append = parts.append
    ks = keys if keys is not None else [None] * n
    hs = headers if headers is not None else [None] * n
    for payload, txid, ts, key, hdrs in zip(payloads, txids, timestamps_ms, ks, hs, strict=True):
        flags = (F_KEY if key is not None else 0) | (F_HEADERS if hdrs is not None else 0)
        append(pack(flags, txid, ts - base_ts, len(payload)))
        if flags:
            append(_encode_extras(key, hdrs))
        append(payload)
    return b"".join(parts)


def _few_with_headers(
    keys: Sequence[bytes | None] | None, headers: Sequence[HeadersIn | None] | None
) -> list[int] | None:
    """The indexes of the records with headers when no record has a key and at most one
    in ``FRAMING_RUN_RECORDS_MIN`` has headers (a write proxy's batch: its marker rides on
    the first record), else None. C-level scans only."""
    if headers is None or (keys is not None and keys.count(None) != len(keys)):
        return None
    n = len(headers)
    with_headers = n - headers.count(None)
    if with_headers * FRAMING_RUN_RECORDS_MIN > n:
        return None
    marked = list(compress(range(n), headers))
    # compress skips an empty dict (falsy), which still has the headers flag
    return marked if len(marked) == with_headers else None


def _body_with_few_headers(  # noqa: PLR0917 - private; the parallel sequences of one set
    payloads: Sequence[bytes],
    txids: Sequence[int],
    timestamps_ms: Sequence[int],
    base_ts: int,
    headers: Sequence[HeadersIn | None] | None,
    marked: list[int],
) -> bytes:
    """The same bytes as the per-record loop: the plain records between the ``marked``
    ones (those with headers) take :func:`_plain_body`'s C-level path."""
    assert headers is not None  # marked indexes into it
    parts: list[bytes] = []
    start = 0
    for k in [*marked, len(payloads)]:
        if k > start:
            parts.append(
                _plain_body(payloads[start:k], txids[start:k], timestamps_ms[start:k], base_ts)
            )
        if k < len(payloads):
            payload = payloads[k]
            parts += (_REC.pack(F_HEADERS, txids[k], timestamps_ms[k] - base_ts, len(payload)),
                      _encode_extras(None, headers[k]), payload)  # fmt: skip
        start = k + 1
    return b"".join(parts)


def encode_control(
    *,
    first_index: int,
    bytes_before: int,
    last_txid: int,
    timestamp_ms: int,
    end_of_stream: bool = False,
) -> bytes:
    """A set holding one control record (or the end-of-stream marker) and no user record."""
    flags = F_END_OF_STREAM if end_of_stream else F_CONTROL
    body = _REC.pack(flags, last_txid, 0, 0)
    return _seal(
        body, 1, 0, first_index, -1, last_txid, timestamp_ms, bytes_before, Compression.NONE
    )


# -- decoding --------------------------------------------------------------------


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
    if data[0] != RECORD_SET_VERSION:
        raise BadRequestError(f"record set version {data[0]} is not {RECORD_SET_VERSION}")
    fields = _HEADER.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    stored = data[HEADER_BYTES:]
    if crc32c.crc32c(stored, crc32c.crc32c(data[: _HEADER.size])) != crc:
        raise ChecksumError("record set checksum mismatch")
    (_v, flags, count, user, first, ftx, ltx, base, before, stored_len, raw_len) = fields
    if stored_len != len(stored) or raw_len > RECORD_SET_BYTES_MAX or user > count:
        raise BadRequestError("record set header lengths are inconsistent")
    comp_bits = flags & _COMPRESSION_MASK
    if comp_bits > Compression.ZSTD or flags & ~_COMPRESSION_MASK:
        raise BadRequestError(f"record set flags {flags:#x} unknown")
    compression = Compression(comp_bits)
    header = RecordSetHeader(compression, count, user, first, ftx, ltx, base, before,
                             stored_len, raw_len)  # fmt: skip
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


def _extras(body: bytes, pos: int, flags: int) -> tuple[bytes | None, Headers | None, int]:
    key: bytes | None = None
    headers: Headers | None = None
    end = len(body)
    if flags & F_KEY:
        _need(pos + 4, end)
        (klen,) = _U32.unpack_from(body, pos)
        pos += 4
        _need(pos + klen, end)
        key = body[pos : pos + klen]
        pos += klen
    if flags & F_HEADERS:
        _need(pos + 2, end)
        (hcount,) = _U16.unpack_from(body, pos)
        pos += 2
        headers = []
        for _ in range(hcount):
            _need(pos + 2, end)
            (nlen,) = _U16.unpack_from(body, pos)
            pos += 2
            _need(pos + nlen + 4, end)
            try:
                name = body[pos : pos + nlen].decode()
            except UnicodeDecodeError as exc:
                raise BadRequestError("record header name is not UTF-8") from exc
            pos += nlen
            (vlen,) = _U32.unpack_from(body, pos)
            pos += 4
            _need(pos + vlen, end)
            headers.append((name, body[pos : pos + vlen]))
            pos += vlen
    return key, headers, pos


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
    return _decode_each(body, header, stream, segment_seqno, entry_id, seq, from_slot)


def _decode_each(  # noqa: PLR0917 - private hot path
    body: bytes,
    header: RecordSetHeader,
    stream: str,
    segment_seqno: int,
    entry_id: int,
    seq: int,
    from_slot: int,
) -> tuple[list[ReadRecord], bool]:
    """One record at a time. Lengths are checked once, not per record: a length that
    runs past the body makes the next header unpack fail or leaves the end misaligned,
    and either raises before any record is returned."""
    out: list[ReadRecord] = []
    append = out.append
    unpack = _REC.unpack_from
    base_ts = header.base_ts_ms
    seq0 = seq
    pos = 0
    eos = False
    try:
        for slot in range(header.count):
            flags, txid, dts, plen = unpack(body, pos)
            pos += 17  # RECORD_OVERHEAD_BYTES, a literal in the hot loop
            if flags:
                if flags & _F_SKIP:
                    eos = eos or bool(flags & F_END_OF_STREAM)
                    pos += plen
                    continue
                key, hdrs, pos = _extras(body, pos, flags)
            else:
                key = hdrs = None
            stop = pos + plen
            if slot >= from_slot:
                append(_new(ReadRecord, (stream, segment_seqno, entry_id, slot, seq, txid,
                                         base_ts + dts, body[pos:stop], key, hdrs, CREATE_TIME)))  # fmt: skip
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
