"""Where a consumer's records come from: one partition read by offset, two ways.

* :class:`CoreFetchers` -- straight from the bookies with the core library: one
  :class:`~streams.reader.LogReader` per partition stream ``t~p`` (speculative reads,
  read-ahead), reopened only when the consumer seeks;
* :class:`ProxyFetchers` -- through a read proxy with the thin client
  (``GET /v1/topics/{t}/partitions/{p}/records``, long polls at the end).

Both answer :class:`ConsumerRecord` batches and the same offset lookups (earliest,
latest, first offset at or after a time). :class:`PartitionFetch` runs one partition's
fetch loop into a bounded buffer that ``GroupConsumer.poll`` takes from.

Offsets are the partition stream's sequence ids: contiguous, so a batch from offset
``o`` holds ``o, o+1, ...`` (checked). An offset past the end or before the first one
kept raises OutOfRangeError (the consumer then applies ``auto_offset_reset``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from foundation.backoff import Backoff, BackoffPolicy
from foundation.errors import (
    BooklineError,
    ClosedError,
    NotFoundError,
    OutOfRangeError,
    TruncatedError,
)
from foundation.invariants import invariant
from foundation.names import partition_stream
from groups.assignors import TopicPartition
from groups.offsets import check_offset, offset_at
from httpapi.partitions import PartitionRow
from httpapi.writes import HeaderPairs as Headers
from streams.dlsn import StartPosition
from streams.records import ReadRecord
from thinclient import reads

if TYPE_CHECKING:
    from streams.namespace import Namespace
    from streams.reader import LogReader
    from thinclient.transport import Transport

log = logging.getLogger(__name__)

__all__ = [
    "ConsumerRecord",
    "CoreFetchers",
    "Fetchers",
    "PartitionFetch",
    "PartitionSource",
    "ProxyFetchers",
]

# Builds records without a Python-level __init__ per record.
_new = tuple.__new__
# Back-off after a fetch failed for a reason that may pass (a proxy or bookie away).
FETCH_RETRY: Final = BackoffPolicy(delay_s=0.1, max_delay_s=2.0)


class ConsumerRecord(tuple[Any, ...]):
    """One record as a consumer sees it: ``topic, partition, offset, key, value,
    headers, timestamp_ms, timestamp_type``. A tuple underneath (built in C, cheap to
    keep) compared by value. ``value`` None is Kafka's null value; ``headers`` ordered
    ``(name, value)`` pairs (names may repeat, values may be None), None when the
    record has none; ``timestamp_type`` Kafka's (0 CreateTime, 1 LogAppendTime)."""

    __slots__ = ()

    def __new__(  # noqa: PLR0917 - the record's field order
        cls,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        timestamp_ms: int = 0,
        timestamp_type: int = 0,
    ) -> ConsumerRecord:
        row = (topic, partition, offset, key, value, headers, timestamp_ms, timestamp_type)
        return _new(cls, row)

    @property
    def topic(self) -> str:
        return self[0]  # type: ignore[no-any-return]

    @property
    def partition(self) -> int:
        return self[1]  # type: ignore[no-any-return]

    @property
    def offset(self) -> int:
        return self[2]  # type: ignore[no-any-return]

    @property
    def key(self) -> bytes | None:
        return self[3]  # type: ignore[no-any-return]

    @property
    def value(self) -> bytes | None:
        return self[4]  # type: ignore[no-any-return]

    @property
    def headers(self) -> Headers | None:
        return self[5]  # type: ignore[no-any-return]

    @property
    def timestamp_ms(self) -> int:
        return self[6]  # type: ignore[no-any-return]

    @property
    def timestamp_type(self) -> int:
        return self[7]  # type: ignore[no-any-return]

    @property
    def tp(self) -> TopicPartition:
        return (self[0], self[1])

    def __repr__(self) -> str:
        value = self[4]
        shown = "None" if value is None else f"{value[:32]!r}{'...' if len(value) > 32 else ''}"
        return f"ConsumerRecord({self[0]}/{self[1]}@{self[2]}, key={self[3]!r}, value={shown})"


def records_from_core(
    topic: str, partition: int, recs: Sequence[ReadRecord]
) -> list[ConsumerRecord]:
    # A ReadRecord is a tuple: [4] sequence id, [6] timestamp, [7] payload, [8] key,
    # [9] headers, [10] timestamp type (indexes skip the property calls: this runs per
    # record). Readers never return Bookline's own markers (streams.recordset).
    return [
        _new(ConsumerRecord, (topic, partition, r[4], r[8], r[7], r[9] or None, r[6], r[10]))
        for r in recs
    ]


def records_from_rows(
    topic: str, partition: int, rows: Sequence[PartitionRow]
) -> list[ConsumerRecord]:
    return [
        _new(ConsumerRecord, (topic, partition, o, k, v, h, ts, tt)) for o, ts, k, v, h, tt in rows
    ]


def _check_contiguous(tp: TopicPartition, offset: int, recs: Sequence[ConsumerRecord]) -> None:
    if recs:
        invariant(
            recs[0][2] == offset and recs[-1][2] == offset + len(recs) - 1,
            "%s/%d: a fetch from offset %d returned offsets %d..%d for %d records",
            tp[0], tp[1], offset, recs[0][2], recs[-1][2], len(recs),
        )  # fmt: skip


# -- offset lookups on the core library (the read proxy serves the same) ----------------


# -- sources ------------------------------------------------------------------------------


class PartitionSource(Protocol):
    async def read(self, offset: int, records_max: int, wait_s: float) -> list[ConsumerRecord]:
        """Records from ``offset`` (contiguous); waits up to ``wait_s`` for the first."""

    async def close(self) -> None: ...


class Fetchers(Protocol):
    """How a consumer reads partitions and looks offsets up."""

    def source(self, tp: TopicPartition) -> PartitionSource: ...

    async def offset_at(self, tp: TopicPartition, at: str) -> int: ...


class _CoreSource:
    """One partition through a core reader, kept open while reads follow each other."""

    def __init__(self, ns: Namespace, tp: TopicPartition) -> None:
        self._ns = ns
        self._tp = tp
        self._name = partition_stream(*tp)
        self._reader: LogReader | None = None
        self._next = -1  # the offset the reader is at

    async def read(self, offset: int, records_max: int, wait_s: float) -> list[ConsumerRecord]:
        topic, partition = self._tp
        if self._reader is None or offset != self._next:
            await self.close()
            await check_offset(self._ns, topic, partition, offset)
            self._reader = await self._ns.open_reader(self._name, StartPosition.sequence(offset))
            self._next = offset
        try:
            recs = await self._reader.read_many(records_max, timeout_s=wait_s)
        except TruncatedError as exc:
            await self.close()
            raise OutOfRangeError(f"{topic}/{partition} at {offset}: {exc.message}") from exc
        out = records_from_core(topic, partition, recs)
        _check_contiguous(self._tp, offset, out)
        self._next = offset + len(out)
        return out

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(BooklineError):
                await reader.close()


class CoreFetchers:
    """Partitions read straight from the bookies through ``ns`` (the core library)."""

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns

    def source(self, tp: TopicPartition) -> PartitionSource:
        return _CoreSource(self.ns, tp)

    async def offset_at(self, tp: TopicPartition, at: str) -> int:
        return await offset_at(self.ns, tp[0], tp[1], at)


class _ProxySource:
    def __init__(self, transport: Transport, tp: TopicPartition) -> None:
        self._transport = transport
        self._tp = tp

    async def read(self, offset: int, records_max: int, wait_s: float) -> list[ConsumerRecord]:
        topic, partition = self._tp
        page = await reads.read_partition(
            self._transport, topic, partition, offset,
            limit=records_max, wait_ms=int(wait_s * 1000),
        )  # fmt: skip
        out = records_from_rows(topic, partition, page.rows)
        _check_contiguous(self._tp, offset, out)
        return out

    async def close(self) -> None:
        return None


class ProxyFetchers:
    """Partitions read through the read proxies (the thin client's transport)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def source(self, tp: TopicPartition) -> PartitionSource:
        return _ProxySource(self.transport, tp)

    async def offset_at(self, tp: TopicPartition, at: str) -> int:
        return await reads.partition_offset(self.transport, tp[0], tp[1], at)


# -- one partition's fetch loop ------------------------------------------------------------


class PartitionFetch:
    """Fetches one partition from ``offset`` into a bounded buffer of batches, one
    read in flight, until closed. ``take`` hands records to ``poll``; ``wake`` is called
    whenever records (or an error) arrive. A failure that may pass is retried with
    back-off; OUT_OF_RANGE (and NOT_FOUND) stop the loop and wait in ``error`` for the
    consumer."""

    def __init__(
        self,
        tp: TopicPartition,
        source: PartitionSource,
        offset: int,
        *,
        fetch_records_max: int,
        buffered_records_max: int,
        fetch_wait_s: float,
        wake: Callable[[], None],
    ) -> None:
        self.tp = tp
        self.source = source
        self.fetch_offset = offset  # the offset the next read starts at
        self.batches: collections.deque[list[ConsumerRecord]] = collections.deque()
        self.buffered = 0
        # Why fetching stopped: OUT_OF_RANGE or NOT_FOUND for the consumer to act on,
        # or a bug (anything not a BooklineError), which poll raises.
        self.error: BaseException | None = None
        self._fetch_records_max = fetch_records_max
        self._buffered_records_max = buffered_records_max
        self._wait_s = fetch_wait_s
        self._wake = wake
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:
            log.exception("fetch of %s/%d failed", *self.tp)
            self.error = exc
            self._wake()

    async def _loop(self) -> None:
        backoff = Backoff(FETCH_RETRY)
        # The flag as well as the cancellation: asyncio.wait_for (deep in a read) can
        # swallow a cancel that races its own completion, and a loop that went on to
        # wait for room nobody makes any more would never end.
        while not self.stopped():
            await self._room.wait()
            if self.stopped():
                return
            want = min(self._fetch_records_max, self._buffered_records_max - self.buffered)
            try:
                recs = await self.source.read(self.fetch_offset, max(1, want), self._wait_s)
            except (OutOfRangeError, NotFoundError) as exc:
                self.error = exc
                self._wake()
                return
            except ClosedError:
                return
            except BooklineError as exc:
                log.warning("fetch of %s/%d at %d failed (%s); retrying", *self.tp,
                            self.fetch_offset, exc)  # fmt: skip
                await backoff.sleep()
                continue
            backoff.reset()
            if recs and not self.stopped():
                self.batches.append(recs)
                self.buffered += len(recs)
                self.fetch_offset += len(recs)
                if self.buffered >= self._buffered_records_max:
                    self._room.clear()
                self._wake()

    def stopped(self) -> bool:
        return self._closed

    def take(self, records_max: int) -> list[ConsumerRecord]:
        """Up to ``records_max`` buffered records, oldest first."""
        out: list[ConsumerRecord] = []
        while self.batches and len(out) < records_max:
            batch = self.batches[0]
            room = records_max - len(out)
            if len(batch) <= room:
                out.extend(self.batches.popleft())
            else:
                out.extend(batch[:room])
                self.batches[0] = batch[room:]
        self.buffered -= len(out)
        if self.buffered < self._buffered_records_max:
            self._room.set()
        return out

    async def close(self) -> None:
        """Stop fetching and drop what is buffered (the source stays open)."""
        self._closed = True
        self._room.set()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.batches.clear()
        self.buffered = 0
