"""Encoding record sets, format v3 (pure, no I/O). The byte layout is documented in
:mod:`streams.recordset_layout`; :mod:`streams.recordset` re-exports these functions.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import sub

import crc32c
import lz4.block
import zstandard

from foundation.errors import BadRequestError, TooLargeError
from foundation.limits import RESERVED_HEADER_PREFIX
from streams.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    Compression,
    HeadersIn,
    ProducerMarker,
    header_pairs,
)
from streams.recordset_layout import (
    CRC,
    F_CONTROL,
    F_END_OF_STREAM,
    F_HEADERS,
    F_KEY,
    F_MARKER,
    F_NULL,
    F_TIMESTAMP,
    FRAMING_RUN_RECORDS_MIN,
    HEADER,
    HEADER_NAME_BYTES_MAX,
    HEADERS_PER_RECORD_MAX,
    I32,
    I64,
    I_MARKER,
    I_TAG,
    MARKER_TAIL,
    ORIGIN_TAG_BYTES_MAX,
    PRODUCER_ID_BYTES_MAX,
    REC,
    RECORD_SET_BYTES_MAX,
    RECORD_SET_VERSION,
    SET_LOG_APPEND_TIME,
    SET_SPARSE,
    TS_DELTA_MAX,
    TS_DELTA_MIN,
    U16,
    U32,
)

__all__ = ["check_headers", "encode_control", "encode_record_set"]

# Slot (in the set) -> the producer marker its record carries.
Markers = Mapping[int, ProducerMarker]
# Slot (in the set) -> the origin tag its record carries.
Tags = Mapping[int, bytes]


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
    timestamp_type: int = CREATE_TIME,
    sparse: bool = False,
) -> bytes:
    if len(body) > RECORD_SET_BYTES_MAX:
        raise TooLargeError(f"record set of {len(body)} bytes exceeds {RECORD_SET_BYTES_MAX}")
    stored, used = _compress(body, compression)
    flags = int(used) | (SET_LOG_APPEND_TIME if timestamp_type == LOG_APPEND_TIME else 0)
    flags |= SET_SPARSE if sparse else 0  # streams.recordset_sparse
    header = HEADER.pack(RECORD_SET_VERSION, flags, count, user_count, first_index, first_txid,
                         last_txid, base_ts_ms, bytes_before, len(stored), len(body))  # fmt: skip
    crc = crc32c.crc32c(stored, crc32c.crc32c(header))
    return b"".join((header, CRC.pack(crc), stored))


def encode_record_set(
    payloads: Sequence[bytes | None],
    txids: Sequence[int],
    timestamps_ms: Sequence[int],
    *,
    first_index: int,
    bytes_before: int,
    last_txid: int,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[HeadersIn | None] | None = None,
    markers: Markers | None = None,
    tags: Tags | None = None,
    compression: Compression = Compression.NONE,
    timestamp_type: int = CREATE_TIME,
    appended_ms: int = -1,
) -> bytes:
    """Encode user records (parallel sequences) into one record set.

    ``last_txid`` is the segment's last txid after this set (the writer's running
    value). ``keys``/``headers`` are None when no record has any, ``markers`` maps a
    record's index to its producer marker, ``tags`` to its origin tag (both internal
    extras); ``timestamp_type`` is the set's (every
    record's). ``appended_ms``: the writer's clock when the set's first record was
    appended, its base timestamp (-1: the first record's timestamp) -- so the sets'
    base timestamps never go back even when producers set theirs (seeks by time search
    them). Records without headers, internal extras or null value whose timestamps are
    near the base take the C-level path (keyed ones too, when every one has a key)."""
    n = len(payloads)
    if n == 0 or len(txids) != n or len(timestamps_ms) != n:
        raise BadRequestError("a record set needs >= 1 record and parallel txids/timestamps")
    if timestamp_type not in {CREATE_TIME, LOG_APPEND_TIME}:
        raise BadRequestError(f"timestamp type {timestamp_type} is neither 0 nor 1")
    base_ts = timestamps_ms[0] if appended_ms < 0 else appended_ms
    if keys is not None and keys.count(None) == n:
        keys = None  # a buffer's all-None column: the records have no key
    body = None
    if _deltas_fit(timestamps_ms, base_ts):
        flagged = _sparse_extras(headers, markers, tags, n)
        if flagged is not None:
            try:
                body = _body_sparse(payloads, txids, timestamps_ms, base_ts, headers, markers,
                                    tags, flagged, keys)  # fmt: skip
            except TypeError:  # a null value or key among the plain records: one by one
                body = None
    if body is None:
        body = _body_each(payloads, txids, timestamps_ms, base_ts, keys, headers, markers, tags)
    return _seal(body, n, n, first_index, txids[0], last_txid, base_ts, bytes_before,
                 compression, timestamp_type)  # fmt: skip


def _deltas_fit(timestamps_ms: Sequence[int], base_ts: int) -> bool:
    """Whether every timestamp's delta from the base fits the framing's 32 bits (a
    write_many's records share one timestamp object: counted, not compared)."""
    if timestamps_ms.count(base_ts) == len(timestamps_ms):
        return True
    return (
        min(timestamps_ms) - base_ts >= TS_DELTA_MIN
        and max(timestamps_ms) - base_ts <= TS_DELTA_MAX
    )


def _plain_body(
    payloads: Sequence[bytes], txids: Sequence[int], timestamps_ms: Sequence[int], base_ts: int
) -> bytes:
    """The body of records without extras (all deltas fit): each record's framing, then
    its payload. A writer's records come in runs sharing a txid and a timestamp (a
    write_many gives all its records one of each), so within a run a record's framing
    depends on its length only: it is packed once per distinct length and the body is
    assembled with C-level calls -- instead of one ``pack`` per record, which was most
    of the encoder's time; when all of them share one framing (same-size records),
    it is the separator of one ``join``. Records in no such run (every txid
    different) are packed one by one; the bytes are the same either way. A None
    payload raises TypeError (the caller frames such records with their flag)."""
    n = len(payloads)
    lens = list(map(len, payloads))
    txid, ts, length = txids[0], timestamps_ms[0], lens[0]
    if lens.count(length) == n and txids.count(txid) == n and timestamps_ms.count(ts) == n:
        # One framing for every record (a write_many of same-size records): it is the
        # separator, so nothing is built per record.
        return REC.pack(0, txid, ts - base_ts, length).join((b"", *payloads))
    framing = _framing_by_runs(txids, timestamps_ms, base_ts, lens)
    if framing is None:
        pack = REC.pack
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
    pack = REC.pack
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


def _sparse_extras(
    headers: Sequence[HeadersIn | None] | None, markers: Markers | None, tags: Tags | None,
    n: int,
) -> list[int] | None:  # fmt: skip
    """The indexes of the records with headers or internal extras when at most one in
    ``FRAMING_RUN_RECORDS_MIN`` has any (a write proxy's batch: its marker rides on the
    first record), else None. C-level scans only."""
    if headers is None and not markers and not tags:
        return []
    flagged = set(markers) if markers else set()
    if tags:
        flagged.update(tags)
    if headers is not None:
        with_headers = n - headers.count(None)
        if (with_headers + len(flagged)) * FRAMING_RUN_RECORDS_MIN > n:
            return None
        indexes = list(compress(range(n), headers))
        if len(indexes) != with_headers:  # compress skips empty headers, still flagged
            return None
        flagged.update(indexes)
    elif len(flagged) * FRAMING_RUN_RECORDS_MIN > n:
        return None
    return sorted(flagged)


def _body_sparse(  # noqa: PLR0917 - private; the parallel sequences of one set
    payloads: Sequence[bytes | None],
    txids: Sequence[int],
    timestamps_ms: Sequence[int],
    base_ts: int,
    headers: Sequence[HeadersIn | None] | None,
    markers: Markers | None,
    tags: Tags | None,
    flagged: list[int],
    keys: Sequence[bytes | None] | None = None,
) -> bytes:
    """The same bytes as :func:`_body_each`: the plain records between the
    ``flagged`` ones take :func:`_plain_body`'s C-level path (:func:`_keyed_body`'s
    when keyed)."""
    if not flagged and keys is None:
        return _plain_body(payloads, txids, timestamps_ms, base_ts)  # type: ignore[arg-type]  # None: TypeError
    parts: list[bytes] = []
    start = 0
    n = len(payloads)
    for k in [*flagged, n]:
        if k > start:
            plain, run = payloads[start:k], (txids[start:k], timestamps_ms[start:k], base_ts)
            if keys is None:
                parts.append(_plain_body(plain, *run))  # type: ignore[arg-type]  # None: TypeError
            else:
                parts.append(_keyed_body(plain, keys[start:k], *run))  # type: ignore[arg-type]  # None: TypeError
        if k < n:
            hdrs = None if headers is None else headers[k]
            marker = None if markers is None else markers.get(k)
            tag = None if tags is None else tags.get(k)
            key = None if keys is None else keys[k]
            parts += _frame_one(payloads[k], txids[k], timestamps_ms[k], base_ts, key, hdrs,
                                marker, tag)  # fmt: skip
        start = k + 1
    return b"".join(parts)


def _keyed_body(
    payloads: Sequence[bytes], keys: Sequence[bytes], txids: Sequence[int],
    timestamps_ms: Sequence[int], base_ts: int,
) -> bytes:  # fmt: skip
    """The body of records with a key each and nothing else (all deltas fit), the bytes
    :func:`_frame_one` gives -- framing, key length, key, payload -- built by C-level
    maps instead of a call per record (a Kafka producer's keyed records). A None key
    or payload raises TypeError (the caller frames such records one by one)."""
    n = len(payloads)
    deltas = map(sub, timestamps_ms, repeat(base_ts, n))
    parts: list[bytes] = [b""] * (4 * n)
    parts[0::4] = list(map(REC.pack, repeat(F_KEY, n), txids, deltas, map(len, payloads)))
    parts[1::4] = list(map(U32.pack, map(len, keys)))
    parts[2::4] = keys if isinstance(keys, list | tuple) else list(keys)
    parts[3::4] = payloads if isinstance(payloads, list | tuple) else list(payloads)
    return b"".join(parts)


def _body_each(  # noqa: PLR0917 - private; the parallel sequences of one set
    payloads: Sequence[bytes | None],
    txids: Sequence[int],
    timestamps_ms: Sequence[int],
    base_ts: int,
    keys: Sequence[bytes | None] | None,
    headers: Sequence[HeadersIn | None] | None,
    markers: Markers | None,
    tags: Tags | None = None,
) -> bytes:
    n = len(payloads)
    ks = keys if keys is not None else [None] * n
    hs = headers if headers is not None else [None] * n
    marks = markers or {}
    tagged = tags or {}
    parts: list[bytes] = []
    rows = zip(payloads, txids, timestamps_ms, ks, hs, strict=True)
    for k, (payload, txid, ts, key, hdrs) in enumerate(rows):
        parts += _frame_one(payload, txid, ts, base_ts, key, hdrs, marks.get(k), tagged.get(k))
    return b"".join(parts)


def _frame_one(  # noqa: PLR0917 - private; one record's fields
    payload: bytes | None,
    txid: int,
    ts: int,
    base_ts: int,
    key: bytes | None,
    headers: HeadersIn | None,
    marker: ProducerMarker | None,
    tag: bytes | None = None,
) -> list[bytes]:
    """One record: framing, extras, payload."""
    flags = 0
    extras: list[bytes] = []
    delta = ts - base_ts
    if not TS_DELTA_MIN <= delta <= TS_DELTA_MAX:  # far from the set's: stored whole
        flags |= F_TIMESTAMP
        extras.append(I64.pack(ts))
        delta = 0
    if key is not None:
        flags |= F_KEY
        extras += (U32.pack(len(key)), key)
    if headers is not None:
        flags |= F_HEADERS
        extras.append(_encode_headers(headers))
    if marker is not None or tag is not None:
        flags |= F_MARKER
        extras.append(_encode_internal(marker, tag))
    if payload is None:
        flags |= F_NULL
        payload = b""
    return [REC.pack(flags, txid, delta, len(payload)), *extras, payload]


def check_headers(headers: HeadersIn) -> None:
    """Refuse (BadRequestError) headers the encoder would not take, or that use
    Bookline's reserved ``bl.`` prefix: a writer checks a record before accepting it,
    so a bad one fails its call, never the writer's pipe. No reader ever returns a
    ``bl.*`` header (format v1's are removed on decoding, and none is written since)."""
    _encode_headers(headers)
    for name, _value in header_pairs(headers):
        if name.startswith(RESERVED_HEADER_PREFIX):
            raise BadRequestError(
                f"header names starting {RESERVED_HEADER_PREFIX!r} are reserved: {name!r}"
            )


def _encode_headers(headers: HeadersIn) -> bytes:
    try:
        pairs = header_pairs(headers)
    except (TypeError, ValueError) as exc:
        raise BadRequestError("record headers are (name, value) pairs or a mapping") from exc
    if len(pairs) > HEADERS_PER_RECORD_MAX:
        raise BadRequestError(f"at most {HEADERS_PER_RECORD_MAX} headers per record")
    parts: list[bytes] = [U16.pack(len(pairs))]
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError) as exc:
            raise BadRequestError(f"record header {pair!r} is not a (name, value) pair") from exc
        if type(name) is not str:
            raise BadRequestError(f"record header name {name!r} is not a string")
        raw_name = name.encode()
        if len(raw_name) > HEADER_NAME_BYTES_MAX:
            raise BadRequestError(f"header name longer than {HEADER_NAME_BYTES_MAX} bytes")
        parts += (U16.pack(len(raw_name)), raw_name)
        if value is None:
            parts.append(I32.pack(-1))
        elif isinstance(value, bytes | bytearray | memoryview):
            parts += (I32.pack(len(value)), bytes(value))
        else:
            raise BadRequestError(f"record header {name!r}: value is not bytes or None")
    return b"".join(parts)


def _encode_internal(marker: ProducerMarker | None, tag: bytes | None) -> bytes:
    """A record's internal extras: the kinds byte, then the marker and the tag."""
    kinds = (I_MARKER if marker is not None else 0) | (I_TAG if tag is not None else 0)
    parts = [bytes((kinds,))]
    if marker is not None:
        parts.append(_encode_marker(marker))
    if tag is not None:
        if len(tag) > ORIGIN_TAG_BYTES_MAX:
            raise BadRequestError(f"origin tag longer than {ORIGIN_TAG_BYTES_MAX} bytes")
        parts += (U16.pack(len(tag)), tag)
    return b"".join(parts)


def _encode_marker(marker: ProducerMarker) -> bytes:
    producer = marker.producer.encode()
    if len(producer) > PRODUCER_ID_BYTES_MAX:
        raise BadRequestError(f"producer id longer than {PRODUCER_ID_BYTES_MAX} bytes")
    tail = MARKER_TAIL.pack(marker.epoch, marker.seq, marker.count)
    return b"".join((U16.pack(len(producer)), producer, tail))


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
    body = REC.pack(flags, last_txid, 0, 0)
    return _seal(
        body, 1, 0, first_index, -1, last_txid, timestamp_ms, bytes_before, Compression.NONE
    )
