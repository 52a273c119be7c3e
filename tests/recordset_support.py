"""Hand-framed record sets for the readers' edge cases (tests only)."""

from __future__ import annotations

from streams.records import Compression
from streams.recordset_encode import _seal
from streams.recordset_layout import REC
from streams.recordset_layout import U32 as _U32


def mixed_set(first_index: int, base_ts_ms: int, last_ts_delta: int) -> bytes:
    """A set of user, control, user (keyed), end-of-stream, user records -- slots 0, 2
    and 4 hold the user records. The writer never mixes them; the codec allows it, so
    every reader must cope. ``last_ts_delta``: the last record's timestamp delta."""
    pack = REC.pack
    body = b"".join([
        pack(0, 11, 0, 3), b"abc",
        pack(0x01, 11, 0, 0),
        pack(0x04, 12, 5, 2), _U32.pack(3), b"key", b"de",
        pack(0x02, 12, 0, 0),
        pack(0, 13, last_ts_delta, 0),
    ])  # fmt: skip
    return _seal(body, 5, 3, first_index, 11, 13, base_ts_ms, 0, Compression.NONE)
