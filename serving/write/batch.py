"""The write core's input and answer, whatever the front end: a :class:`WriteBatch`
(one stream's records, and the producer that orders and de-duplicates them) and a
:class:`WriteResult`.

Records travel in the form the front end decoded them in, without a copy: plain
records (payload, optional key, optional producer timestamp) as columns (``payloads``,
``keys``, ``timestamps``), the form the core writer's fast path takes; records with
headers, txids or null values as ``records``, any objects with the fields of
:class:`BatchRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import add
from typing import NamedTuple, Protocol, cast

from foundation.invariants import invariant
from foundation.limits import record_bytes
from streams.dlsn import DLSN
from streams.records import LogRecord, RecordColumns

__all__ = ["BatchRecord", "ProducerSeq", "WriteBatch", "WriteResult"]


class BatchRecord(Protocol):
    """One record of a batch (e.g. ``httpapi.writes.WireRecord``)."""

    @property
    def payload(self) -> bytes | None: ...  # None: Kafka's null value

    @property
    def key(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...

    @property
    def txid(self) -> int | None: ...

    @property
    def timestamp_ms(self) -> int | None: ...  # the producer's; None: the log's


@dataclass(frozen=True, slots=True)
class ProducerSeq:
    """Who wrote a batch, for ordering and de-duplication: record ``i`` of the batch has
    sequence ``seq + i`` within the producer's ``epoch`` (:mod:`serving.write.dedup`).
    ``strict``: the producer takes a later batch's success as the acknowledgement of its
    earlier ones (Kafka's producers), so a first sequence is never accepted over a gap
    its history here cannot account for (:func:`serving.write.dedup.ahead_refusal`)."""

    producer: str
    seq: int
    epoch: int = 0
    strict: bool = False


@dataclass(frozen=True, slots=True)
class WriteBatch:
    """Records to append to ``stream``: ``payloads`` (with ``keys`` when keyed and
    ``timestamps`` when the producer set them, one each) or ``records``, never both;
    ``producer`` None for a fire-and-forget write."""

    stream: str
    producer: ProducerSeq | None
    payloads: Sequence[bytes] | None = None
    keys: Sequence[bytes | None] | None = None
    records: Sequence[BatchRecord] | None = None
    timestamps: Sequence[int | None] | None = None  # ms; None entries: the log's
    # Called once the batch is handed to the stream's writer (its place in the stream
    # taken: a later batch of the producer may follow at once) -- not if it is refused
    # or answered from the de-duplication before. A front end that holds a producer's
    # next batch back to keep its order releases it then (kafkaapi.produce).
    on_handed: Callable[[], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        invariant((self.payloads is None) != (self.records is None), "payloads or records")
        payloads = self.payloads
        for column in (self.keys, self.timestamps):
            fits = column is None or (payloads is not None and len(column) == len(payloads))
            invariant(fits, "keys and timestamps go with payloads, one each")

    @property
    def count(self) -> int:
        return len(self.payloads) if self.payloads is not None else len(self._records)

    @property
    def _records(self) -> Sequence[BatchRecord]:
        assert self.records is not None  # payloads is None (checked at construction)
        return self.records

    def size_bytes(self, start: int = 0) -> int:
        """Payload, key and header bytes of the records from ``start`` on (what every
        record limit counts: :func:`foundation.limits.record_bytes`)."""
        if self.payloads is None:
            return sum(_record_sizes(self._records[start:]))
        payloads = self.payloads if start == 0 else self.payloads[start:]
        if self.keys is None:
            return sum(map(len, payloads))
        keys = self.keys if start == 0 else self.keys[start:]
        return sum(map(len, payloads)) + sum(map(len, filter(None, keys)))

    @property
    def record_bytes_max(self) -> int:
        """The largest record's size."""
        if self.payloads is None:
            return max(_record_sizes(self._records), default=0)
        if self.keys is None:
            return max(map(len, self.payloads), default=0)
        if None not in self.keys:  # C-level sums, no call per record
            keys = cast("Sequence[bytes]", self.keys)
            return max(map(add, map(len, self.payloads), map(len, keys)), default=0)
        return max(map(_key_and_payload_bytes, self.payloads, self.keys), default=0)

    def columns(self, start: int) -> RecordColumns:
        """The records from ``start`` on as the writer takes them: the payload and key
        columns as they are (sliced only past retries), no object per record."""
        if self.payloads is not None:
            keys, stamps = self.keys, self.timestamps
            if start == 0:
                return RecordColumns(self.payloads, keys, timestamps=stamps)
            keys = None if keys is None else keys[start:]
            stamps = None if stamps is None else stamps[start:]
            return RecordColumns(self.payloads[start:], keys, timestamps=stamps)
        return RecordColumns.of(
            [
                LogRecord(r.payload, r.txid, r.key, r.headers, r.timestamp_ms)
                for r in self._records[start:]
            ]
        )


def _record_sizes(records: Iterable[BatchRecord]) -> Iterator[int]:
    return (record_bytes(r.payload, r.key, r.headers) for r in records)


def _key_and_payload_bytes(payload: bytes, key: bytes | None) -> int:
    return len(payload) + (len(key) if key else 0)


class WriteResult(NamedTuple):
    """Every record's DLSN and offset (sequence id in the stream), in batch order, and
    how many of the first records were retries answered with their original positions
    (not written again)."""

    dlsns: Sequence[DLSN]
    offsets: list[int]
    duplicates: int
