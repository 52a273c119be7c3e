"""The records users see: what a writer appends (:class:`LogRecord`) and what a reader
returns (:class:`ReadRecord`), and the compression a record set may use.

How records are laid out in a ledger entry is :mod:`streams.recordset`'s job.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias, overload

from foundation.errors import BadRequestError
from foundation.invariants import invariant
from streams.dlsn import DLSN

__all__ = [
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "RECORD_OVERHEAD_BYTES",
    "Compression",
    "Header",
    "Headers",
    "HeadersIn",
    "LogRecord",
    "ProducerMarker",
    "ReadRecord",
    "RecordColumns",
    "header_pairs",
]

#: One record header: a name and a value, which may be None (Kafka's null).
Header: TypeAlias = tuple[str, bytes | None]
#: A record's headers as stored and returned: ordered, names may repeat.
Headers: TypeAlias = list[Header]
#: What writers accept: pairs in order, or a mapping (its items, in order) as before.
HeadersIn: TypeAlias = Sequence[Header] | Mapping[str, bytes]

#: A record's timestamp type, numbered as Kafka numbers them: the producer's
#: (CreateTime, or the writer's clock when the producer gave none) or the log's.
CREATE_TIME = 0
LOG_APPEND_TIME = 1

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


def header_pairs(headers: HeadersIn) -> Headers:
    """``headers`` as the stored list of pairs (a mapping's items, in order)."""
    if isinstance(headers, Mapping):
        return list(headers.items())
    return headers if type(headers) is list else list(headers)


@dataclass(frozen=True, slots=True)
class ProducerMarker:
    """What the first record of a write proxy's producer batch carries for
    de-duplication (:mod:`serving.write.dedup`): internal, never a user header -- it
    travels in the record's framing (:mod:`streams.recordset`, format v2)."""

    producer: str
    epoch: int
    seq: int  # the batch's first sequence
    count: int  # records in the batch


@dataclass(slots=True, init=False)
class LogRecord:
    """What a writer appends.

    ``payload=None`` is a null value (Kafka's tombstone when keyed). ``txid=None``: the
    writer assigns wall-clock ms (kept non-decreasing). ``headers``: ordered ``(name,
    value)`` pairs, names may repeat, values may be None; a mapping is accepted and
    kept as its items. ``timestamp_ms``: the producer's timestamp (CreateTime); None,
    the writer's clock at append (a LogAppendTime stream overwrites it anyway)."""

    payload: bytes | None
    txid: int | None
    key: bytes | None
    headers: Headers | None
    timestamp_ms: int | None

    def __init__(
        self,
        payload: bytes | None,
        txid: int | None = None,
        key: bytes | None = None,
        headers: HeadersIn | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.payload = payload
        self.txid = txid
        self.key = key
        self.headers = None if headers is None else header_pairs(headers)
        self.timestamp_ms = timestamp_ms


class RecordColumns(Sequence[LogRecord]):
    """Records to write as parallel columns: the writer's own shape (issue 23).

    ``payloads`` (None entries: null values), and ``keys``, ``headers``, ``txids`` or
    ``timestamps`` only when some record has one (``None`` entries for the records
    without; a headers entry is pairs or a mapping, as :class:`LogRecord` takes).
    ``marker``: the first record's :class:`ProducerMarker` (set by the write proxy);
    ``tag``: every record's *origin tag*, opaque bytes (set by the Spark sink, which
    finds its own earlier writes by them). Both are internal: carried in the record
    framing, returned only by :func:`streams.recordset.decode_internal`, never by a
    reader. A write front end that decoded a
    request into lists hands them on as they are, and :class:`~streams.writer.LogWriter`
    buffers them with slices instead of splitting one :class:`LogRecord` per record back
    into lists. It is a sequence of LogRecords for everyone else (each made when it is
    asked for), so it goes wherever a list of them does."""

    __slots__ = ("headers", "keys", "marker", "payloads", "tag", "timestamps", "txids")

    def __init__(
        self,
        payloads: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersIn | None] | None = None,
        txids: Sequence[int | None] | None = None,
        timestamps: Sequence[int | None] | None = None,
        *,
        marker: ProducerMarker | None = None,
        tag: bytes | None = None,
    ) -> None:
        n = len(payloads)
        for column in (keys, headers, txids, timestamps):
            invariant(column is None or len(column) == n, "record columns of unequal length")
        self.payloads = payloads
        self.keys = keys
        self.headers = headers
        self.txids = txids
        self.timestamps = timestamps
        self.marker = marker
        self.tag = tag

    @classmethod
    def of(cls, records: Sequence[LogRecord]) -> RecordColumns:
        """``records`` as columns (themselves when they are columns already)."""
        if isinstance(records, RecordColumns):
            return records
        payloads = [r.payload for r in records
                    if r.key is None and r.headers is None and r.txid is None
                    and r.timestamp_ms is None]  # fmt: skip
        if len(payloads) == len(records):
            return cls(payloads)
        payloads = [r.payload for r in records]
        keys = [r.key for r in records]
        headers: list[HeadersIn | None] = [r.headers for r in records]
        txids = [r.txid for r in records]
        stamps = [r.timestamp_ms for r in records]
        return cls(
            payloads,
            None if keys.count(None) == len(keys) else keys,
            None if headers.count(None) == len(headers) else headers,
            None if txids.count(None) == len(txids) else txids,
            None if stamps.count(None) == len(stamps) else stamps,
        )

    def __len__(self) -> int:
        return len(self.payloads)

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    def __getitem__(self, index: int | slice) -> LogRecord | RecordColumns:
        keys, headers, txids, stamps = self.keys, self.headers, self.txids, self.timestamps
        if isinstance(index, slice):
            first = index.indices(len(self))[0] == 0 and index.step in (None, 1)
            return RecordColumns(
                self.payloads[index],
                None if keys is None else keys[index],
                None if headers is None else headers[index],
                None if txids is None else txids[index],
                None if stamps is None else stamps[index],
                marker=self.marker if first else None,
                tag=self.tag,
            )
        hdrs = None if headers is None else headers[index]
        return LogRecord(
            self.payloads[index],
            None if txids is None else txids[index],
            None if keys is None else keys[index],
            None if hdrs is None else header_pairs(hdrs),
            None if stamps is None else stamps[index],
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
    payload: bytes | None
    key: bytes | None
    headers: Headers | None
    timestamp_type: int


class ReadRecord(_RecordRow):
    """What a reader returns: ``ReadRecord(stream, dlsn, sequence_id, txid,
    timestamp_ms, payload, key=None, headers=None, timestamp_type=0)``.

    ``payload`` None is a null value; ``headers`` ordered ``(name, value)`` pairs;
    ``timestamp_type`` Kafka's: :data:`CREATE_TIME` (0, the producer's or the writer's
    clock) or :data:`LOG_APPEND_TIME` (1, the stream stamps every record).

    A tuple underneath so the decoder builds records with C-level calls
    (``tuple.__new__`` through ``map``, no Python ``__init__`` per record), with the
    DLSN stored as its parts and made on access: the catch-up read path builds
    millions of records per second and most consumers never look at every DLSN. It
    compares equal only to another ``ReadRecord`` and is not hashable (headers may be
    a list)."""

    __slots__ = ()

    def __new__(  # noqa: PLR0917 - the contract's field order
        cls,
        stream: str,
        dlsn: DLSN,
        sequence_id: int,
        txid: int,
        timestamp_ms: int,
        payload: bytes | None,
        key: bytes | None = None,
        headers: HeadersIn | None = None,
        timestamp_type: int = CREATE_TIME,
    ) -> ReadRecord:
        seg, entry, slot = dlsn
        pairs = None if headers is None else header_pairs(headers)
        row = (stream, seg, entry, slot, sequence_id, txid, timestamp_ms, payload, key, pairs,
               timestamp_type)  # fmt: skip
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

    __hash__ = None  # type: ignore[assignment]  # headers are a list

    def __repr__(self) -> str:
        return (
            f"ReadRecord(stream={self.stream!r}, dlsn={self.dlsn!s}, "
            f"sequence_id={self.sequence_id}, txid={self.txid}, "
            f"timestamp_ms={self.timestamp_ms}, payload={_short(self.payload)}, "
            f"key={self.key!r})"
        )


def _short(payload: bytes | None) -> str:
    if payload is None or len(payload) <= 32:
        return repr(payload)
    return f"{payload[:32]!r}..."
