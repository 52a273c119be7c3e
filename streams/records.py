"""The records users see: what a writer appends (:class:`LogRecord`) and what a reader
returns (:class:`ReadRecord`), and the compression a record set may use.

How records are laid out in a ledger entry is :mod:`streams.recordset`'s job.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

from foundation.errors import BadRequestError
from foundation.invariants import invariant
from streams.dlsn import DLSN

__all__ = ["RECORD_OVERHEAD_BYTES", "Compression", "LogRecord", "ReadRecord", "RecordColumns"]

# What a record costs beyond its payload, key and headers: its framing in a record set
# (flags, txid, timestamp delta, payload length; streams.recordset checks it). Writers
# and the write proxy count it against their byte limits.
RECORD_OVERHEAD_BYTES = 17
# Builds tuples (DLSN, ReadRecord) without a Python-level call.
_new = tuple.__new__


class Compression(enum.IntEnum):
    NONE = 0
    LZ4 = 1
    ZSTD = 2

    @classmethod
    def parse(cls, name: str | Compression) -> Compression:
        if isinstance(name, Compression):
            return name
        try:
            return cls[name.upper()]
        except KeyError as exc:
            raise BadRequestError(f"compression must be none, lz4 or zstd, got {name!r}") from exc


@dataclass(slots=True)
class LogRecord:
    """What a writer appends. ``txid=None``: the writer assigns wall-clock ms (kept
    non-decreasing)."""

    payload: bytes
    txid: int | None = None
    key: bytes | None = None
    headers: dict[str, bytes] | None = None


class RecordColumns(Sequence[LogRecord]):
    """Records to write as parallel columns: the writer's own shape (issue 23).

    ``payloads``, and ``keys``, ``headers`` or ``txids`` only when some record has one
    (``None`` entries for the records without). A write front end that decoded a
    request into lists hands them on as they are, and :class:`~streams.writer.LogWriter`
    buffers them with slices instead of splitting one :class:`LogRecord` per record back
    into lists. It is a sequence of LogRecords for everyone else (each made when it is
    asked for), so it goes wherever a list of them does."""

    __slots__ = ("headers", "keys", "payloads", "txids")

    def __init__(
        self,
        payloads: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[dict[str, bytes] | None] | None = None,
        txids: Sequence[int | None] | None = None,
    ) -> None:
        n = len(payloads)
        for column in (keys, headers, txids):
            invariant(column is None or len(column) == n, "record columns of unequal length")
        self.payloads = payloads
        self.keys = keys
        self.headers = headers
        self.txids = txids

    @classmethod
    def of(cls, records: Sequence[LogRecord]) -> RecordColumns:
        """``records`` as columns (themselves when they are columns already)."""
        if isinstance(records, RecordColumns):
            return records
        payloads = [r.payload for r in records
                    if r.key is None and r.headers is None and r.txid is None]  # fmt: skip
        if len(payloads) == len(records):
            return cls(payloads)
        payloads = [r.payload for r in records]
        keys = [r.key for r in records]
        headers = [r.headers for r in records]
        txids = [r.txid for r in records]
        return cls(
            payloads,
            None if keys.count(None) == len(keys) else keys,
            None if headers.count(None) == len(headers) else headers,
            None if txids.count(None) == len(txids) else txids,
        )

    def __len__(self) -> int:
        return len(self.payloads)

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    def __getitem__(self, index: int | slice) -> LogRecord | RecordColumns:
        keys, headers, txids = self.keys, self.headers, self.txids
        if isinstance(index, slice):
            return RecordColumns(
                self.payloads[index],
                None if keys is None else keys[index],
                None if headers is None else headers[index],
                None if txids is None else txids[index],
            )
        return LogRecord(
            self.payloads[index],
            None if txids is None else txids[index],
            None if keys is None else keys[index],
            None if headers is None else headers[index],
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordColumns | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable columns, like a list

    def __repr__(self) -> str:
        return f"RecordColumns({len(self)} records)"


class _RecordRow(NamedTuple):
    """ReadRecord's storage: the DLSN kept as its three parts (built on access)."""

    stream: str
    segment_seqno: int
    entry_id: int
    slot_id: int
    sequence_id: int
    txid: int
    timestamp_ms: int
    payload: bytes
    key: bytes | None
    headers: dict[str, bytes] | None


class ReadRecord(_RecordRow):
    """What a reader returns: ``ReadRecord(stream, dlsn, sequence_id, txid,
    timestamp_ms, payload, key=None, headers=None)``.

    A tuple underneath so the decoder builds records with C-level calls
    (``tuple.__new__`` through ``map``, no Python ``__init__`` per record), with the
    DLSN stored as its parts and made on access: the catch-up read path builds
    millions of records per second and most consumers never look at every DLSN. It
    compares equal only to another ``ReadRecord`` and is not hashable (headers may be
    a dict)."""

    __slots__ = ()

    def __new__(  # noqa: PLR0917 - the contract's field order
        cls,
        stream: str,
        dlsn: DLSN,
        sequence_id: int,
        txid: int,
        timestamp_ms: int,
        payload: bytes,
        key: bytes | None = None,
        headers: dict[str, bytes] | None = None,
    ) -> ReadRecord:
        seg, entry, slot = dlsn
        row = (stream, seg, entry, slot, sequence_id, txid, timestamp_ms, payload, key, headers)
        return tuple.__new__(cls, row)

    @property
    def dlsn(self) -> DLSN:
        return _new(DLSN, (self[1], self[2], self[3]))

    def __getnewargs__(self) -> tuple[Any, ...]:  # pickle by the public fields
        return (self[0], self.dlsn, *self[4:])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReadRecord):
            return NotImplemented
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, ReadRecord):
            return NotImplemented
        return tuple.__ne__(self, other)

    __hash__ = None  # type: ignore[assignment]  # headers may be a dict

    def __repr__(self) -> str:
        return (
            f"ReadRecord(stream={self.stream!r}, dlsn={self.dlsn!s}, "
            f"sequence_id={self.sequence_id}, txid={self.txid}, "
            f"timestamp_ms={self.timestamp_ms}, payload={self.payload[:32]!r}"
            f"{'...' if len(self.payload) > 32 else ''}, key={self.key!r})"
        )
