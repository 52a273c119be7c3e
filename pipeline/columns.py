"""Arrow record batches built straight from record-set bodies (the read tasks' path).

A read task used to decode each entry into :class:`~streams.records.ReadRecord`
tuples, transpose them and hand Arrow Python lists: three Python objects per record
before Arrow saw a byte. Here :func:`streams.columns.scan_entry` only locates the user
records (an ``array`` of framing offsets, checked as the record decoder checks), and
the columns are cut from the bodies with numpy: the framing fields are gathered in one
pass per entry, the payloads copied out of the body through a mask of their byte
ranges into one Arrow binary column (offsets from the lengths). Records with extras (a
key, headers, a null value, a timestamp stored whole: rare) bring them along as Python
values; every record of a set has the set's timestamp type.

:func:`layout_batch` must give exactly the rows :func:`pipeline.schema.records_to_arrow`
gives for the same records (tests/test_pipeline_columns.py pins that); the tuple path
(``arrow=false``) still goes through ReadRecords.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np

from foundation.errors import TooLargeError
from foundation.invariants import invariant
from pipeline.schema import visible_headers
from streams.columns import FRAMING_FIELDS, EntryLayout
from streams.records import RECORD_OVERHEAD_BYTES

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.planning import Slice

__all__ = ["LayoutPart", "layout_batch"]

_FRAMING = np.dtype({
    "names": [f[0] for f in FRAMING_FIELDS],
    "formats": [f[1] for f in FRAMING_FIELDS],
    "offsets": [f[2] for f in FRAMING_FIELDS],
    "itemsize": RECORD_OVERHEAD_BYTES,
})  # fmt: skip
_SPAN = np.arange(RECORD_OVERHEAD_BYTES, dtype=np.int64)
#: Bytes of one binary column's values: Arrow's 32-bit offsets.
BINARY_COLUMN_BYTES_MAX: Final = (1 << 31) - 1
# [pa.Array of "0", "1", ...]: see _slot_strings
_slot_cache: list[Any] = []


class LayoutPart(NamedTuple):
    """User records ``lo..hi-1`` (indexes into ``layout.starts``) of one entry."""

    layout: EntryLayout
    lo: int
    hi: int


class _Cut(NamedTuple):
    """One part's columns as numpy arrays (payload bytes concatenated)."""

    values: Any  # uint8
    lengths: Any  # int64
    txids: Any
    ts_ms: Any
    slots: Any


def _payload_starts(lay: EntryLayout, starts: Any, lo: int) -> Any:
    pstarts = starts + RECORD_OVERHEAD_BYTES
    for index, pstart, *_rest in lay.extras:
        if lo <= index < lo + len(starts):
            pstarts[index - lo] = pstart
    return pstarts


def _payload_mask(lay: EntryLayout, lo: int, spans: Any, pstarts: Any, lengths: Any) -> Any:
    """The body's bytes that are payloads of the part: its span from the first payload
    to the end of the last, less the framing, keys and headers of the records inside
    it and any control record between them."""
    keep = np.zeros(len(lay.body), dtype=np.bool_)
    keep[int(pstarts[0]) : int(pstarts[-1] + lengths[-1])] = True
    keep[spans[1:]] = False
    for index, pstart, *_rest in lay.extras:  # a key or headers
        if lo <= index < lo + len(spans):
            keep[int(spans[index - lo, 0]) : pstart] = False
    for a, b in lay.skipped:
        keep[a:b] = False
    return keep


def _cut(part: LayoutPart) -> _Cut:
    lay, lo, hi = part
    body = np.frombuffer(lay.body, dtype=np.uint8)
    starts = np.frombuffer(lay.starts, dtype=np.int64)[lo:hi]
    spans = starts[:, None] + _SPAN
    framing = body[spans].reshape(-1).view(_FRAMING)
    lengths = framing["length"].astype(np.int64)
    pstarts = _payload_starts(lay, starts, lo)
    values = body[_payload_mask(lay, lo, spans, pstarts, lengths)]
    invariant(
        len(values) == int(lengths.sum()),
        "entry %d: payload mask holds %d bytes, the records %d",
        lay.entry_id,
        len(values),
        int(lengths.sum()),
    )
    slots = (
        np.arange(lo, hi, dtype=np.int64)
        if lay.slots is None
        else np.frombuffer(lay.slots, dtype=np.int64)[lo:hi]
    )
    return _Cut(
        values=values,
        lengths=lengths,
        txids=framing["txid"].astype(np.int64),
        ts_ms=framing["ts_delta"].astype(np.int64) + lay.header.base_ts_ms,
        slots=slots,
    )


def _extras_column(parts: Sequence[LayoutPart], n: int, which: int) -> list[Any] | None:
    """Keys (``which`` 2) or headers (3) per row; None when no row has any."""
    if not any(p.layout.extras for p in parts):
        return None
    out: list[Any] = [None] * n
    base = 0
    for lay, lo, hi in parts:
        for extra in lay.extras:
            if lo <= extra[0] < hi:
                out[base + extra[0] - lo] = extra[which]
        base += hi - lo
    return out


def _binary(values: Any, lengths: Any, nulls: Any = None) -> pa.Array:
    """One Arrow binary column (32-bit offsets, what Spark's schema maps to); ``nulls``
    (a bool array, or None for none) marks null values."""
    import pyarrow as pa

    total = int(lengths.sum())
    if total > BINARY_COLUMN_BYTES_MAX:
        raise TooLargeError(
            f"{len(lengths)} values of {total} bytes do not fit one Arrow binary column "
            f"(at most {BINARY_COLUMN_BYTES_MAX}): lower the option arrowBatchRows"
        )
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    valid = None if nulls is None else pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), len(lengths), [valid, pa.py_buffer(offsets), pa.py_buffer(values)]
    )


def _extras_fixes(parts: Sequence[LayoutPart], ts_ms: Any) -> Any:
    """Rows with extras whose framing does not say all: their timestamps (stored whole)
    written into ``ts_ms`` (a copy), and a bool array of null values (None: none)."""
    ts_ms = ts_ms.copy()
    nulls = None
    base = 0
    for lay, lo, hi in parts:
        for extra in lay.extras:
            if lo <= extra.record < hi:
                row = base + extra.record - lo
                ts_ms[row] = extra.timestamp_ms
                if extra.null:
                    nulls = np.zeros(len(ts_ms), dtype=np.bool_) if nulls is None else nulls
                    nulls[row] = True
        base += hi - lo
    return ts_ms, nulls


def _timestamp_types(parts: Sequence[LayoutPart]) -> pa.Array:
    """Kafka's timestampType per row: each set says it for all of its records."""
    import pyarrow as pa

    kinds = {p.layout.header.timestamp_type for p in parts}
    n = sum(p.hi - p.lo for p in parts)
    if len(kinds) == 1:
        return pa.repeat(pa.scalar(kinds.pop(), pa.int32()), n)
    return pa.array(np.concatenate([
        np.full(p.hi - p.lo, p.layout.header.timestamp_type, dtype=np.int32) for p in parts
    ]))  # fmt: skip


def _slot_strings(upto: int) -> pa.Array:
    """``str(slot)`` for slots 0..upto-1 and maybe more (kept per process, grown by
    doubling: a set holds at most some 250,000 records)."""
    import pyarrow as pa

    have = len(_slot_cache[0]) if _slot_cache else 0
    if have < upto:
        grown = pa.array([str(i) for i in range(max(upto, 2 * have, 4096))], pa.string())
        _slot_cache[:] = [grown]
    cache: pa.Array = _slot_cache[0]
    return cache


def _dlsns(parts: Sequence[LayoutPart], seqno: int, slots: Any) -> pa.Array:
    """``"seg:entry:slot"`` per row from one prefix per entry and cached slot strings
    (``str(DLSN)`` per record was half the task's time; casting every entry id and
    slot to a string in Arrow still a third of the batch)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    prefixes = pa.array([f"{seqno}:{p.layout.entry_id}:" for p in parts], pa.string())
    which = np.repeat(np.arange(len(parts)), [p.hi - p.lo for p in parts])
    return pc.binary_join_element_wise(
        pc.take(prefixes, which), pc.take(_slot_strings(int(slots.max()) + 1), slots), ""
    )


def layout_batch(
    parts: Sequence[LayoutPart], sl: Slice, schema: pa.Schema, include_headers: bool = False
) -> pa.RecordBatch:
    """One record batch of the records ``parts`` select (consecutive, all of ``sl``) in
    ``schema``: the rows :func:`pipeline.schema.records_to_arrow` makes of them."""
    import pyarrow as pa

    parts = [p for p in parts if p.hi > p.lo]
    n = sum(p.hi - p.lo for p in parts)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)
    cuts = [_cut(p) for p in parts]
    cat = (lambda i: np.concatenate([c[i] for c in cuts])) if len(cuts) > 1 else (
        lambda i: cuts[0][i]
    )  # fmt: skip
    first_seq = parts[0].layout.first_sequence_id + parts[0].lo
    seqs = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64))
    keys = _extras_column(parts, n, 2)
    ts_ms, nulls = cat(3), None
    if any(p.layout.extras for p in parts):
        ts_ms, nulls = _extras_fixes(parts, ts_ms)
    columns: list[pa.Array] = [
        pa.nulls(n, pa.binary()) if keys is None else pa.array(keys, pa.binary()),
        _binary(cat(0), cat(1), nulls),
        pa.repeat(pa.scalar(sl.topic or sl.stream, pa.string()), n),
        pa.repeat(pa.scalar(sl.partition, pa.int32()), n),
        seqs,
        pa.array(ts_ms * 1000).cast(pa.timestamp("us", tz="UTC")),
        _timestamp_types(parts),
    ]
    if include_headers:
        headers = _extras_column(parts, n, 3)
        field_type = schema.field("headers").type
        columns.append(
            pa.nulls(n, field_type)
            if headers is None
            else pa.array([visible_headers(h) for h in headers], field_type)
        )
    columns += [
        pa.repeat(pa.scalar(sl.stream, pa.string()), n),
        _dlsns(parts, sl.seqno, cat(4)),
        seqs,
        pa.array(cat(2)),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
