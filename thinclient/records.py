"""What the thin client accepts as a record: ``bytes``, ``str`` or a
:class:`~httpapi.writes.WireRecord` (key, headers, txid). Pure.

Plain ``bytes`` stay ``bytes`` all the way to the request body (no object per record:
the common case is fast); anything else becomes a WireRecord.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from httpapi.writes import WireRecord

__all__ = ["RecordLike", "as_record", "as_records", "size_of"]

RecordLike = bytes | str | WireRecord


def as_record(value: RecordLike) -> WireRecord:
    if isinstance(value, WireRecord):
        return value
    if isinstance(value, str):
        return WireRecord(value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return WireRecord(bytes(value))
    raise TypeError(f"a record is bytes, str or WireRecord, not {type(value).__name__}")


def as_records(values: Sequence[RecordLike]) -> list[bytes] | list[WireRecord]:
    """Plain bytes stay a list of payloads (the common case, no object per record)."""
    if all(type(v) is bytes for v in values):
        return cast("list[bytes]", list(values))
    return [as_record(v) for v in values]


def size_of(record: bytes | WireRecord) -> int:
    """The size every record limit counts (:func:`foundation.limits.record_bytes`)."""
    return len(record) if type(record) is bytes else record.size_bytes  # type: ignore[union-attr]
