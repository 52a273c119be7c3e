"""Sparse record sets: what compaction writes in place of an entry some of whose
records it removed (pure, no I/O). The layout is :mod:`streams.recordset_layout`'s
(set flag ``SET_SPARSE``, record flag ``F_GAP``); decoding is
:mod:`streams.recordset`'s, like every set's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from foundation.invariants import invariant
from streams.records import ProducerMarker, ReadRecord
from streams.recordset_encode import _frame_one, _seal  # the encoder's own framing
from streams.recordset_layout import F_GAP, REC, U32, RecordSetHeader

__all__ = ["encode_sparse_set"]


def encode_sparse_set(
    header: RecordSetHeader,
    first_sequence_id: int,
    records: Sequence[ReadRecord],
    markers: Mapping[int, ProducerMarker] | None = None,
    tags: Mapping[int, bytes] | None = None,
) -> bytes:
    """A compacted copy of a user set: ``records`` (those of the set kept, in order,
    with the producer ``markers`` and origin ``tags`` they carried by slot) and their
    offset gaps;
    ``first_sequence_id`` is the set's first offset. The copy keeps the original's
    header fields and covers the same offsets."""
    parts: list[bytes] = []
    expected = first_sequence_id
    base_ts = header.base_ts_ms
    marks = markers or {}
    tagged = tags or {}
    for r in records:
        gap = r.sequence_id - expected
        invariant(gap >= 0, "compacted records must keep their order (gap %d)", gap)
        slot = r.dlsn.slot_id
        one = _frame_one(r.payload, r.txid, r.timestamp_ms, base_ts, r.key, r.headers,
                         marks.get(slot), tagged.get(slot))  # fmt: skip
        if gap:
            flags, txid, delta, length = REC.unpack(one[0])
            one[0:1] = [REC.pack(flags | F_GAP, txid, delta, length), U32.pack(gap)]
        parts += one
        expected = r.sequence_id + 1
    span = header.user_count
    invariant(expected <= first_sequence_id + span, "a record past the set's offsets")
    return _seal(b"".join(parts), len(records), span, header.first_index, header.first_txid,
                 header.last_txid, base_ts, header.bytes_before, header.compression,
                 header.timestamp_type, sparse=True)  # fmt: skip
