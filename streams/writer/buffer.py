"""The records of one ledger entry-to-be and what waits on them (pure, no I/O).

The writer fills one :class:`RecordBuffer`; the sender cuts it off, encodes it as one
record set and, once the entry is acknowledged, :meth:`RecordBuffer.resolve` hands every
waiter its DLSN -- and a write_many that asked for them its records' offsets (sequence
ids: the entry's ``first_offset`` + slot; user records of an entry have consecutive
slots) -- or :meth:`RecordBuffer.fail` the writer's error. A control record or
the end-of-stream marker travels as a buffer without records.

Shape, for the hot path: one object per *entry* holding parallel lists -- payloads
(None: a null value), txids, timestamps (the writer's clock, or the producer's), and
keys/headers only once a record has any, plus the producer markers and origin tags by
slot -- never an
object per record. A single write's waiter is its bare future, a write_many's one ``(batch,
count)`` per slice; the slices cover the records in order, so slots follow from the
counts. A writer with tens of thousands of records in flight thus keeps few objects
alive per record for the cyclic GC to walk (docs/architecture.md, "Garbage collector").
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from foundation.errors import BooklineError, fresh
from streams.dlsn import DLSN, DLSNRun, DLSNSequence
from streams.records import HeadersIn, LogRecord, ProducerMarker, RecordColumns

__all__ = ["Batch", "RecordBuffer", "Waiter", "consume"]

# Builds a DLSN (a tuple subclass) without a Python-level call.
_NEW_DLSN = tuple.__new__


class Batch:
    """The caller's side of one write_many: resolves once all its records are durable,
    to their DLSNs (a :class:`DLSNSequence`: one run per entry, no DLSN object per
    record) -- or, with ``offsets``, to ``(dlsns, offsets)``."""

    __slots__ = ("future", "offsets", "remaining", "runs")

    def __init__(self, future: asyncio.Future[Any], count: int, *, offsets: bool = False) -> None:
        self.future = future
        self.remaining = count
        self.runs: list[DLSNRun] = []
        self.offsets: list[int] | None = [] if offsets else None


# What waits on a slice of an entry: a single write's future (one record) or a
# write_many's (batch, record count).
Waiter = asyncio.Future[DLSN] | tuple[Batch, int]


class RecordBuffer:
    """User records of one entry-to-be (parallel lists), or a control/end-of-stream set."""

    __slots__ = (
        "appended_ms",
        "control",
        "done",
        "first_offset",
        "headers",
        "keys",
        "markers",
        "nbytes",
        "payloads",
        "sent_at",
        "tags",
        "timestamps",
        "txids",
        "waiters",
    )

    def __init__(self, done: asyncio.Future[None], control: str = "") -> None:
        self.payloads: list[bytes | None] = []
        self.txids: list[int] = []
        self.timestamps: list[int] = []
        self.appended_ms = -1  # the writer's clock at the first record (the set's base)
        # None until a record has a key or headers (the fast path encodes without them).
        self.keys: list[bytes | None] | None = None
        self.headers: list[HeadersIn | None] | None = None
        # slot -> the producer marker its record carries (a write proxy's batch's first)
        self.markers: dict[int, ProducerMarker] | None = None
        # slot -> the origin tag its record carries (every record of a tagged write)
        self.tags: dict[int, bytes] | None = None
        self.waiters: list[Waiter] = []  # in slot order, covering every record
        self.nbytes = 0  # the records' bytes, framing included (RECORD_OVERHEAD_BYTES each)
        self.done = done  # resolves once the entry is acknowledged (fails with the writer)
        self.control = control  # "": user records; "control" or "eos": none
        # Sequence id (offset) of the first record, set when the entry is submitted:
        # its segment's start sequence id + the user records before it in the segment.
        self.first_offset = -1
        self.sent_at = 0.0  # the loop's time when submitted (the writer's pace)

    def append_one(  # noqa: PLR0917 - the hot path is called positionally
        self,
        record: LogRecord,
        txid: int,
        now: int,
        fut: asyncio.Future[DLSN],
        size: int,
        stamp: int | None = None,
    ) -> None:
        """One record of a single write; ``fut`` gets its DLSN; its timestamp is
        ``stamp`` (the producer's) or ``now`` (the writer's clock)."""
        if (record.key is not None or record.headers is not None) and self.keys is None:
            self._start_extras()
        if not self.payloads:
            self.appended_ms = now
        self.payloads.append(record.payload)
        self.txids.append(txid)
        self.timestamps.append(now if stamp is None else stamp)
        if self.keys is not None and self.headers is not None:
            self.keys.append(record.key)
            self.headers.append(record.headers)
        self.waiters.append(fut)
        self.nbytes += size

    def append_many(  # noqa: PLR0917 - the hot path is called positionally
        self,
        cols: RecordColumns,
        payloads: list[bytes | None],
        txids: list[int],
        now: int,
        batch: Batch,
        i: int,
        j: int,
        nbytes: int,
        stamps: list[int] | None = None,
    ) -> None:
        """Records ``[i, j)`` of a write_many (``payloads`` is ``cols.payloads`` as a
        list), ``nbytes`` with their framing: slices of the columns, no per-record step.
        Their timestamps are ``stamps`` (every record's), or ``now`` when None."""
        keys, headers = cols.keys, cols.headers
        if (keys is not None or headers is not None) and self.keys is None:
            self._start_extras()
        if not self.payloads:
            self.appended_ms = now
        if cols.marker is not None and i == 0:
            if self.markers is None:
                self.markers = {}
            self.markers[len(self.payloads)] = cols.marker
        if cols.tag is not None:
            if self.tags is None:
                self.tags = {}
            start = len(self.payloads)
            self.tags.update(zip(range(start, start + j - i), itertools.repeat(cols.tag)))
        self.payloads.extend(payloads[i:j])
        self.txids.extend(txids[i:j])
        self.timestamps.extend([now] * (j - i) if stamps is None else stamps[i:j])
        if self.keys is not None and self.headers is not None:
            self.keys.extend(itertools.repeat(None, j - i) if keys is None else keys[i:j])
            self.headers.extend(itertools.repeat(None, j - i) if headers is None else headers[i:j])
        self.waiters.append((batch, j - i))
        self.nbytes += nbytes

    def _start_extras(self) -> None:
        self.keys = [None] * len(self.payloads)
        self.headers = [None] * len(self.payloads)

    def resolve(self, seqno: int, entry_id: int) -> int:
        """The entry is acknowledged: every waiter gets its records' DLSNs. Returns the
        number of slots the waiters covered (the caller checks it is every record)."""
        slot = 0
        for waiter in self.waiters:
            if type(waiter) is tuple:
                batch, n = waiter
                batch.runs.append((seqno, entry_id, slot, n))
                if batch.offsets is not None:
                    first = self.first_offset + slot
                    batch.offsets.extend(range(first, first + n))
                batch.remaining -= n
                if batch.remaining == 0 and not batch.future.done():
                    dlsns = DLSNSequence(batch.runs)
                    offsets = batch.offsets
                    batch.future.set_result(dlsns if offsets is None else (dlsns, offsets))
                slot += n
            else:
                assert isinstance(waiter, asyncio.Future)
                if not waiter.done():
                    waiter.set_result(_NEW_DLSN(DLSN, (seqno, entry_id, slot)))
                slot += 1
        return slot

    def fail(self, error: BooklineError) -> None:
        """Every waiter and ``done`` raise ``error`` (chained)."""
        for waiter in self.waiters:
            fut = waiter[0].future if isinstance(waiter, tuple) else waiter
            _fail_future(fut, error)
        _fail_future(self.done, error)


def consume(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception retrieved (the caller may have stopped waiting)."""
    if not fut.cancelled():
        fut.exception()


def _fail_future(fut: asyncio.Future[Any], error: BooklineError) -> None:
    if not fut.done():
        fut.set_exception(fresh(error))
        fut.add_done_callback(consume)
