"""A fetch answer's record batch cut from record sets as stored (:func:`sets_batch`).

A catch-up fetch gets whole record sets from the read core
(:func:`serving.read.partitions.fetch_partition`). Building a ``ReadRecord`` per
record from them and encoding those one by one was most of a catch-up fetch's CPU
(38 % and 25 % in py-spy, issue 25), so the sets are located column-wise instead
(:func:`streams.columns.scan_entry`, the Spark source's scan: verified as the record
decoder verifies, keyed records listed without an object each) and the batch is
encoded from numpy columns (:func:`kafkaapi.protocol.records_arrays.encode_arrays`):
the framing fields gathered from the set bodies at the records' starts, the keys'
and values' bytes taken from the bodies through one mask of the bytes that are
neither framing nor extras. Records with extras beyond a key (a producer marker on
each producer batch's first record, a timestamp stored whole, a null value) bring
theirs as Python values, a handful per set.

A set with a record that has headers is encoded the record way (``decode_verified``
then ``encode_columns``): the bytes are the same either way, which
tests/test_kafka_fetch_sets.py checks over random sets.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from kafkaapi.protocol.records import encode_columns
from kafkaapi.protocol.records_arrays import encode_arrays
from streams.columns import FRAMING_FIELDS, EntryLayout, scan_entry
from streams.reader_items import RawRecordSet
from streams.records import LOG_APPEND_TIME, RECORD_OVERHEAD_BYTES, ReadRecord
from streams.recordset import decode_verified

__all__ = ["records_batch", "sets_batch"]

_FRAMING: Final = np.dtype({
    "names": [f[0] for f in FRAMING_FIELDS],
    "formats": [f[1] for f in FRAMING_FIELDS],
    "offsets": [f[2] for f in FRAMING_FIELDS],
    "itemsize": RECORD_OVERHEAD_BYTES,
})  # fmt: skip
_SPAN: Final = np.arange(RECORD_OVERHEAD_BYTES, dtype=np.int64)
_KEY_LENGTH: Final = np.arange(4, dtype=np.int64)  # a key's u32 length after the framing


def sets_batch(sets: Sequence[RawRecordSet], offset: int, stream: str) -> tuple[bytes, int]:
    """The batch of the sets' user records at or after ``offset`` and the offset after
    the last of them (b"" and ``offset``: none)."""
    layouts = [scan_entry(s.payload, s.entry_id, s.start_sequence_id, keys_inline=True)
               for s in sets]  # fmt: skip
    if any(extra.headers for lay in layouts for extra in lay.extras):
        recs = [r for s, lay in zip(sets, layouts, strict=True)
                for r in _decoded(s, lay, stream) if r.sequence_id >= offset]  # fmt: skip
        return (records_batch(recs), recs[-1].sequence_id + 1) if recs else (b"", offset)
    return _columns_batch(layouts, offset)


def _decoded(s: RawRecordSet, lay: EntryLayout, stream: str) -> list[ReadRecord]:
    recs, _eos = decode_verified(
        lay.header, lay.body, stream, s.segment_seqno, s.entry_id, s.start_sequence_id
    )
    return recs


# A ReadRecord is a tuple: its columns, taken in C (operator.itemgetter over map).
_OFFSET, _TIMESTAMP, _VALUE, _KEY, _HEADERS = (operator.itemgetter(i) for i in (4, 6, 7, 8, 9))


def records_batch(recs: list[ReadRecord]) -> bytes:
    """The batch of ``recs`` (at least one), record by record."""
    return encode_columns(
        list(map(_OFFSET, recs)),
        list(map(_TIMESTAMP, recs)),
        list(map(_KEY, recs)),
        list(map(_VALUE, recs)),
        list(map(_HEADERS, recs)),
        log_append_time=recs[0].timestamp_type == LOG_APPEND_TIME,
    )


def _concat(parts: list[Any], dtype: Any = np.int64) -> Any:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _columns_batch(layouts: list[EntryLayout], offset: int) -> tuple[bytes, int]:
    """:func:`sets_batch` for sets without headers, column-wise."""
    body = np.frombuffer(b"".join(lay.body for lay in layouts), dtype=np.uint8)
    shifts = np.cumsum([0] + [len(lay.body) for lay in layouts])  # each body's first byte
    rows = np.cumsum([0] + [lay.count for lay in layouts])  # each set's first record
    starts = _concat([np.frombuffer(lay.starts, dtype=np.int64) + shift
                      for lay, shift in zip(layouts, shifts, strict=False)])  # fmt: skip
    seqs = _concat([
        np.arange(lay.first_sequence_id, lay.first_sequence_id + lay.count, dtype=np.int64)
        if lay.offsets is None else np.frombuffer(lay.offsets, dtype=np.int64)
        for lay in layouts
    ])  # fmt: skip
    first = int(np.searchsorted(seqs, offset))
    if first == len(seqs):
        return b"", offset
    stamps, keys, values, data = _framing_columns(layouts, body, starts, rows)
    data[: starts[first]] = False  # the records before the offset
    apart = _extras(layouts, shifts, rows, starts, data, stamps, values)
    for lay, shift in zip(layouts, shifts, strict=False):
        for a, b in lay.skipped:  # control records and end-of-stream markers
            data[shift + a : shift + b] = False
    payload = body[data]
    seqs, stamps, keys, values = seqs[first:], stamps[first:], keys[first:], values[first:]
    apart = {row - first: key for row, key in apart.items() if row >= first}
    ts_type = layouts[int(np.searchsorted(rows, first, side="right")) - 1].header.timestamp_type
    batch = encode_arrays(seqs, stamps, keys, values, payload, keys_apart=apart,
                          log_append_time=ts_type == LOG_APPEND_TIME)  # fmt: skip
    return batch, int(seqs[-1]) + 1


def _framing_columns(
    layouts: list[EntryLayout], body: Any, starts: Any, rows: Any
) -> tuple[Any, Any, Any, Any]:
    """Every record's timestamp, key length (-1: none, or kept with its extras) and
    value length from its framing and a keyed record's key length; and the mask of the
    bodies' bytes that are keys and values (framing and key lengths out)."""
    framing = body[starts[:, None] + _SPAN].reshape(-1).view(_FRAMING)
    base_ts = np.repeat([lay.header.base_ts_ms for lay in layouts], [lay.count for lay in layouts])
    stamps = framing["ts_delta"].astype(np.int64) + base_ts
    values = framing["length"].astype(np.int64)
    keys = np.full(len(starts), -1, dtype=np.int64)
    data = np.ones(len(body), dtype=np.bool_)
    data[starts[:, None] + _SPAN] = False
    keyed = _concat([np.frombuffer(lay.keyed, dtype=np.int64) + row
                     for lay, row in zip(layouts, rows, strict=False) if lay.keyed])  # fmt: skip
    if len(keyed):
        at = starts[keyed][:, None] + RECORD_OVERHEAD_BYTES + _KEY_LENGTH
        keys[keyed] = body[at].reshape(-1).view(">u4").astype(np.int64)
        data[at] = False
    return stamps, keys, values, data


def _extras(  # noqa: PLR0917 - private; the columns it completes
    layouts: list[EntryLayout],
    shifts: Any,
    rows: Any,
    starts: Any,
    data: Any,
    stamps: Any,
    values: Any,
) -> dict[int, bytes]:
    """Write the records with extras into the columns (timestamp, a null value; their
    extras' bytes out of ``data``); their keys by row (the encoder puts them in)."""
    keys: dict[int, bytes] = {}
    for lay, shift, row0 in zip(layouts, shifts, rows, strict=False):
        for extra in lay.extras:
            row = int(row0) + extra.record
            data[starts[row] : shift + extra.payload_start] = False
            stamps[row] = extra.timestamp_ms
            if extra.null:
                values[row] = -1
            if extra.key is not None:
                keys[row] = extra.key
    return keys
