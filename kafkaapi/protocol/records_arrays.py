"""Record batch v2 encoded from numpy columns: no Python object per record (no I/O).

The bytes are exactly :func:`kafkaapi.protocol.records.encode_columns`'s for records
without headers (the format is documented there): a fetch answer's batch cut from
stored record sets by :mod:`kafkaapi.fetch_sets`, where the per-record encoder was a
quarter of a catch-up fetch's CPU (issue 25). Every record's fields are varints
written column by column: each field's size per record first (a zigzag varint takes
one byte per 7 bits), the records' positions from the sizes' running sum, then the
fields' bytes scattered to their positions, one pass per byte of the longest varint.
The keys' and values' bytes come as one array, in record order (key then value, a
null one taking none), and fill what the varints leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from foundation.invariants import invariant
from kafkaapi.protocol.records import seal_plain

__all__ = ["encode_arrays"]

# The largest varint field (a 64-bit timestamp delta) takes 10 bytes.
_VARINT_BYTES_MAX: Final = 10


def _zigzag(values: Any) -> Any:
    signed = values.astype(np.int64)
    return ((signed << 1) ^ (signed >> 63)).view(np.uint64)


def _sizes(raw: Any) -> Any:
    """Bytes of each unsigned varint: one, plus one per 7 bits beyond the first 7."""
    sizes = np.ones(len(raw), dtype=np.int64)
    for shift in range(7, 7 * _VARINT_BYTES_MAX, 7):
        over = raw >= np.uint64(1 << shift)
        if not over.any():
            break
        sizes += over
    return sizes


def encode_arrays(
    offsets: Any,
    timestamps: Any,
    key_lengths: Any,
    value_lengths: Any,
    payload: Any,
    *,
    keys_apart: Mapping[int, bytes] | None = None,
    log_append_time: bool = False,
) -> bytes:
    """An uncompressed batch of records without headers, given as int64 arrays
    (offsets increasing; a length of -1 is a null key or value) and ``payload``: the
    keys' and values' bytes (uint8), record after record, but for the keys in
    ``keys_apart`` (by record index: a few records' keys not found in the payload's
    source; their lengths are taken from there). At least one record."""
    if keys_apart:
        key_lengths = key_lengths.copy()
        key_lengths[list(keys_apart)] = [len(k) for k in keys_apart.values()]
    base_offset, base_ts = int(offsets[0]), int(timestamps[0])
    keys, values = np.maximum(key_lengths, 0), np.maximum(value_lengths, 0)
    fields = [_zigzag(v) for v in (timestamps - base_ts, offsets - base_offset,
                                   key_lengths, value_lengths)]  # fmt: skip
    sizes = [_sizes(f) for f in fields]
    ts_size, off_size, key_size, value_size = sizes
    # After the length: attributes, the four varints, key, value, header count (0).
    lengths = 2 + ts_size + off_size + key_size + value_size + keys + values
    fields.insert(0, _zigzag(lengths))
    sizes.insert(0, _sizes(fields[0]))
    ends = np.cumsum(sizes[0] + lengths)
    total = int(ends[-1])
    at = ends - (sizes[0] + lengths)  # each record's first byte
    attributes = at + sizes[0]
    starts = [at, attributes + 1, attributes + 1 + ts_size]
    starts.append(starts[2] + off_size)
    starts.append(starts[3] + key_size + keys)  # the value's length
    headers = starts[4] + value_size + values
    spots, raw = [attributes, headers], [np.zeros(2 * len(at), dtype=np.uint8)]
    for field, size, start in zip(fields, sizes, starts, strict=True):
        for index in range(int(size.max())):
            rows = size > index
            part = field if index == 0 else field[rows]
            more = (size if index == 0 else size[rows]) > index + 1
            spots.append(start + index if index == 0 else start[rows] + index)
            raw.append(((part >> np.uint64(7 * index)) & np.uint64(0x7F)).astype(np.uint8)
                       | (more.astype(np.uint8) << 7))  # fmt: skip
    out = np.empty(total, dtype=np.uint8)
    framing = np.concatenate(spots)
    out[framing] = np.concatenate(raw)
    data = np.ones(total, dtype=np.bool_)
    data[framing] = False
    apart = 0
    for row, key in (keys_apart or {}).items():
        where = int(starts[3][row] + key_size[row])
        out[where : where + len(key)] = np.frombuffer(key, dtype=np.uint8)
        data[where : where + len(key)] = False
        apart += len(key)
    invariant(
        len(payload) == total - len(framing) - apart,
        "%d payload bytes for %d of keys and values", len(payload), total - len(framing) - apart,
    )  # fmt: skip
    out[data] = payload
    count = len(at)
    return seal_plain(
        base_offset, out.tobytes(), int(offsets[-1]) - base_offset, base_ts,
        int(timestamps.max()), count, log_append_time=log_append_time,
    )  # fmt: skip
