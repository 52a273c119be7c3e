"""What the thin client accepts as a record: ``bytes``, ``str``, ``None`` (Kafka's null
value), a :class:`~httpapi.writes.WireRecord` or the core library's
:class:`~streams.records.LogRecord` (key, headers, txid, timestamp). Pure.

Headers are Kafka's: ordered ``(name, value)`` pairs (names may repeat, a value may be
None); a mapping is taken as its items.

Plain ``bytes`` stay ``bytes`` all the way to the request body (no object per record:
the common case is fast); anything else becomes a WireRecord.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from httpapi.writes import HeadersLike, WireRecord, checked_headers
from streams.records import LogRecord

__all__ = [
    "RecordLike",
    "Records",
    "as_record",
    "as_records",
    "is_plain",
    "key_of",
    "keyed",
    "one",
    "size_of",
    "sizes_of",
]

RecordLike = bytes | str | WireRecord | LogRecord | None
# What a request is made of: plain payloads (the fast path), or full records -- never
# both in one list (so its first record says which: ``is_plain``).
Records = list[bytes] | list[WireRecord]


def one(record: bytes | WireRecord) -> Records:
    return cast("Records", [record])


def as_record(value: RecordLike) -> WireRecord:
    if isinstance(value, WireRecord):
        return value
    if isinstance(value, LogRecord):
        headers = checked_headers(value.headers)
        return WireRecord(value.payload, value.key, headers, value.txid, value.timestamp_ms)
    if value is None:
        return WireRecord(None)
    if isinstance(value, str):
        return WireRecord(value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return WireRecord(bytes(value))
    raise TypeError(
        f"a record is bytes, str, None, WireRecord or LogRecord, not {type(value).__name__}"
    )


def keyed(
    value: RecordLike,
    key: bytes | str | None,
    headers: HeadersLike | None,
    timestamp_ms: int | None = None,
) -> bytes | WireRecord:
    """One record from a value and the ``key=``/``headers=``/``timestamp_ms=`` given
    beside it (text is UTF-8); a plain value stays plain bytes."""
    if key is None and headers is None and timestamp_ms is None:
        return value if type(value) is bytes else as_record(value)
    if isinstance(value, WireRecord | LogRecord):
        raise TypeError("give key, headers and timestamp inside the record, not beside it")
    rec = as_record(value)
    k = key.encode() if isinstance(key, str) else key
    return WireRecord(rec.payload, k, checked_headers(headers), None, timestamp_ms)


def key_of(record: bytes | WireRecord) -> bytes | None:
    return None if type(record) is bytes else record.key  # type: ignore[union-attr]


def as_records(values: Sequence[RecordLike]) -> Records:
    """Plain bytes stay a list of payloads (the common case, no object per record)."""
    if not set(map(type, values)) - {bytes}:  # every one bytes (a C-level scan)
        return cast("list[bytes]", list(values))
    return [as_record(v) for v in values]


def size_of(record: bytes | WireRecord) -> int:
    """The size every record limit counts (:func:`foundation.limits.record_bytes`)."""
    if type(record) is bytes:
        return len(record)
    assert isinstance(record, WireRecord)
    if record.headers is None and record.payload is not None:  # the common keyed record
        return len(record.payload) + (0 if record.key is None else len(record.key))
    return record.size_bytes


def is_plain(records: Records) -> bool:
    """Plain payloads (one kind per list: :data:`Records`)."""
    return not records or type(records[0]) is bytes


def sizes_of(records: Records) -> list[int]:
    """Every record's :func:`size_of` (C-level for plain payloads)."""
    if is_plain(records):
        return list(map(len, cast("list[bytes]", records)))
    return list(map(size_of, records))
