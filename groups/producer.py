"""The core library's topic producer: records to a topic's partitions, straight to the
bookies (:class:`TopicProducer`, and :class:`SyncTopicProducer` for threads).

::

    producer = TopicProducer(ns)
    partition, offset = await producer.send("orders", b"...", key=b"customer-7")
    sent = await producer.send_many("orders", [LogRecord(b"a", key=b"k"), b"unkeyed"])
    await producer.close()

* **Partitioning** (:mod:`groups.partitioner`): a keyed record goes to Kafka's
  ``murmur2(key) mod N``; an unkeyed one to the topic's *sticky* partition, which moves
  on when that partition's batch is cut (KIP-480); ``partition=`` picks one outright
  (UNKNOWN_PARTITION when the topic does not have it, after one metadata refresh).
* **Writers**: one :class:`~streams.writer.LogWriter` per partition, opened on its first
  record -- a partition stream has a single writer, so a core producer is *the*
  producer of the partitions it writes (many producers go through the write proxies).
  Records sent in one event-loop iteration form one batch per partition, cut earlier at
  ``batch_bytes_max``; a partition's batches go to its writer in order, pipelined (the
  next is handed over before the previous is durable). Per partition, offsets follow
  send order.
* **Offsets**: ``send`` resolves to ``(partition, offset)`` once the record is durable;
  the offset is the partition stream's sequence id (``LogWriter.append_many_offsets``).
* **Failures**: a partition whose writer fails answers the records it had been handed
  OUTCOME_UNKNOWN (they may be in the log; the core writer does not de-duplicate a
  resend) and opens a new writer for the records after them.
* **Metadata**: partition counts are cached per topic for ``metadata_max_age_ms`` and
  re-read on an unknown partition, so a topic's growth is picked up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    NotFoundError,
    OutcomeUnknownError,
    UnknownPartitionError,
)
from foundation.limits import record_bytes
from foundation.loopthread import LoopThread
from foundation.names import partition_stream
from foundation.partitioner import StickyPartitioner, partition_for_key
from groups.topics import TopicAdmin
from httpapi.writes import TIMESTAMP_MAX, HeadersLike, checked_headers
from streams.dlsn import DLSN
from streams.namespace import Namespace
from streams.records import LogRecord
from streams.sync import SyncNamespace
from streams.writer import LogWriter

log = logging.getLogger(__name__)

__all__ = ["ProducerConfig", "SyncTopicProducer", "TopicProducer", "as_log_record"]

# A closing producer waits this long for its writers to flush and seal.
CLOSE_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    # A partition's batch is cut past this many bytes (else at the end of the loop
    # iteration); unkeyed records then stick to another partition.
    batch_bytes_max: int = 256 * 1024
    # A topic's partition count is re-read from ZooKeeper at least this often.
    metadata_max_age_ms: int = 30_000
    # Opening a partition's writer waits this long for its lock (None: fail at once
    # with LOCK_OWNED when another writer holds it).
    lock_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.batch_bytes_max <= 0 or self.metadata_max_age_ms < 0:
            raise BadRequestError("producer batch_bytes_max > 0, metadata_max_age_ms >= 0")


def as_log_record(
    value: bytes | str | LogRecord | None,
    key: bytes | str | None = None,
    headers: HeadersLike | None = None,
    timestamp_ms: int | None = None,
) -> LogRecord:
    """A record to send: a LogRecord as is, or built from value (None: Kafka's null
    value), key, headers (ordered ``(name, value)`` pairs or a mapping; text is UTF-8)
    and the producer's timestamp. BAD_REQUEST for a malformed header or the reserved
    ``bl.`` prefix (:func:`httpapi.writes.checked_headers`), or a bad timestamp."""
    h: HeadersLike | None
    if isinstance(value, LogRecord):
        if key is not None or headers is not None or timestamp_ms is not None:
            raise BadRequestError(
                "give key, headers and timestamp inside the LogRecord, not beside it"
            )
        payload, k, h, ts = value.payload, value.key, value.headers, value.timestamp_ms
    else:
        payload = value.encode() if isinstance(value, str) else value
        k, h, ts = key.encode() if isinstance(key, str) else key, headers, timestamp_ms
    if payload is not None and not isinstance(payload, bytes):
        raise BadRequestError(f"a record's value is bytes, str or None, not {type(value).__name__}")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)
                           or not 0 <= ts <= TIMESTAMP_MAX):  # fmt: skip
        raise BadRequestError(f"a record's timestamp is ms within 0..{TIMESTAMP_MAX}, not {ts!r}")
    if isinstance(value, LogRecord) and h is None:
        return value
    return LogRecord(payload, value.txid if isinstance(value, LogRecord) else None, k,
                     checked_headers(h), ts)  # fmt: skip


# A record waiting in a partition's batch and who waits for its offset.
_Item = tuple[LogRecord, asyncio.Future[int]]


@dataclass(eq=False)
class _Partition:
    topic: str
    partition: int
    stream: str
    pending: list[_Item] = field(default_factory=list)  # the batch being filled
    pending_bytes: int = 0
    ready: collections.deque[list[_Item]] = field(default_factory=collections.deque)
    writer: LogWriter | None = None
    task: asyncio.Task[None] | None = None


class TopicProducer:
    """Produce to topics of ``ns``; use from one event loop, close when done."""

    def __init__(
        self,
        ns: Namespace,
        *,
        config: ProducerConfig | None = None,
        identity: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._ns = ns
        self._admin = TopicAdmin(ns)
        self.config = config or ProducerConfig()
        self._identity = identity
        self._sticky = StickyPartitioner(rng)
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (partitions, read at)
        self._lookups: dict[str, asyncio.Future[int]] = {}
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._closed = False

    # -- sending -----------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | str | LogRecord | None,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> tuple[int, int]:
        """Send one record; ``(partition, offset)`` once it is durable. ``value=None``
        is Kafka's null value (a tombstone when keyed); ``headers`` ordered ``(name,
        value)`` pairs, names may repeat, values may be None; ``timestamp_ms`` the
        record's CreateTime (None: the writer stamps it)."""
        record = as_log_record(value, key, headers, timestamp_ms)
        count = await self.partitions_for(topic)
        p = await self._choose(topic, count, record.key, partition)
        return p, await self._enqueue(topic, p, record)

    async def send_many(
        self,
        topic: str,
        records: Sequence[bytes | str | LogRecord | None],
        partition: int | None = None,
    ) -> list[tuple[int, int]]:
        """Send records (keys inside LogRecords); ``(partition, offset)`` of each once
        all are durable. Per partition they keep their order."""
        recs = [as_log_record(r) for r in records]
        count = await self.partitions_for(topic)
        futs: list[asyncio.Future[int]] = []
        parts: list[int] = []
        for rec in recs:
            p = await self._choose(topic, count, rec.key, partition)
            parts.append(p)
            futs.append(self._enqueue(topic, p, rec))
        offsets = await asyncio.gather(*futs)
        return list(zip(parts, offsets, strict=True))

    async def partitions_for(self, topic: str, *, refresh: bool = False) -> int:
        """The topic's partition count (cached for ``metadata_max_age_ms``)."""
        if self._closed:
            raise ClosedError("TopicProducer was closed")
        cached = self._counts.get(topic)
        max_age_s = self.config.metadata_max_age_ms / 1000
        if cached is not None and not refresh and time.monotonic() - cached[1] < max_age_s:
            return cached[0]
        lookup = self._lookups.get(topic)
        if lookup is None:
            lookup = asyncio.ensure_future(self._admin.partitions(topic))
            self._lookups[topic] = lookup
            lookup.add_done_callback(functools.partial(self._looked_up, topic))
        return await asyncio.shield(lookup)

    def _looked_up(self, topic: str, fut: asyncio.Future[int]) -> None:
        self._lookups.pop(topic, None)
        if not fut.cancelled() and fut.exception() is None:
            self._counts[topic] = (fut.result(), time.monotonic())
        else:
            self._counts.pop(topic, None)

    async def _choose(
        self, topic: str, count: int, key: bytes | None, partition: int | None
    ) -> int:
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise BadRequestError(f"a partition is an int >= 0, not {partition!r}")
            if partition >= count:
                count = await self.partitions_for(topic, refresh=True)  # grown meanwhile?
                if partition >= count:
                    raise UnknownPartitionError(
                        f"topic {topic} has {count} partitions; there is no partition {partition}"
                    )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        return self._sticky.partition(topic, count)

    def _enqueue(self, topic: str, p: int, record: LogRecord) -> asyncio.Future[int]:
        part = self._parts.get((topic, p))
        if part is None:
            part = self._parts[(topic, p)] = _Partition(topic, p, partition_stream(topic, p))
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        part.pending.append((record, fut))
        if record.key is None and record.headers is None and record.payload is not None:
            part.pending_bytes += len(record.payload)
        else:
            part.pending_bytes += record_bytes(record.payload, record.key, record.headers)
        if part.pending_bytes >= self.config.batch_bytes_max:
            self._cut(part)
        if part.task is None:
            part.task = asyncio.ensure_future(self._send_loop(part))
        return fut

    def _cut(self, part: _Partition) -> None:
        """The partition's batch is complete: queue it; unkeyed records move on."""
        if not part.pending:
            return
        part.ready.append(part.pending)
        part.pending, part.pending_bytes = [], 0
        count = self._counts.get(part.topic)
        if count is not None and self._sticky.partition(part.topic, count[0]) == part.partition:
            self._sticky.next_batch(part.topic, count[0])

    async def _send_loop(self, part: _Partition) -> None:
        """Hand the partition's batches to its writer in order (opening it first)."""
        try:
            while part.ready or part.pending:
                if not part.ready:
                    self._cut(part)
                batch = part.ready.popleft()
                writer = part.writer
                if writer is not None and writer.failed is not None:
                    self._drop_writer(part)  # failed since the last batch: a new one
                    writer = None
                if writer is None:
                    try:
                        writer = await self._open(part)
                    except BooklineError as exc:  # nothing of the batch was handed over
                        if isinstance(exc, NotFoundError):
                            self._counts.pop(part.topic, None)  # deleted? look again
                        _fail(batch, exc)
                        continue
                try:
                    acked = await writer.append_many_offsets([r for r, _f in batch])
                except BooklineError as exc:
                    # Refused up front (a bad record) -- or the writer failed while
                    # taking the batch, and some of it may be in the log.
                    self._failed(part, batch, exc, handed=writer.failed is not None)
                    continue
                acked.add_done_callback(functools.partial(self._acked, part, batch))
        except BaseException as exc:
            left = [item for b in (*part.ready, part.pending) for item in b]
            part.ready.clear()
            part.pending, part.pending_bytes = [], 0
            _fail(left, ClosedError(f"producer of {part.stream} stopped: {exc!r}"))
            raise
        finally:
            part.task = None

    async def _open(self, part: _Partition) -> LogWriter:
        part.writer = await self._ns.open_writer(
            part.stream, self._identity, lock_timeout_s=self.config.lock_timeout_s
        )
        return part.writer

    def _drop_writer(self, part: _Partition) -> None:
        writer, part.writer = part.writer, None
        if writer is not None:
            asyncio.ensure_future(writer.close()).add_done_callback(_consume)

    def _acked(
        self,
        part: _Partition,
        batch: list[_Item],
        fut: asyncio.Future[tuple[Sequence[DLSN], list[int]]],
    ) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None:
            error = exc if isinstance(exc, BooklineError) else ClosedError("writer cancelled")
            self._failed(part, batch, error, handed=True)
            return
        _dlsns, offsets = fut.result()
        for (_rec, waiter), offset in zip(batch, offsets, strict=True):
            if not waiter.done():
                waiter.set_result(offset)

    def _failed(
        self, part: _Partition, batch: list[_Item], exc: BooklineError, *, handed: bool
    ) -> None:
        """A batch failed. Records its writer was ``handed`` may be in the log:
        OUTCOME_UNKNOWN, never a definite failure; the next batch opens a new writer
        (which recovers and fences this one's segment)."""
        if part.writer is not None and part.writer.failed is not None:
            self._drop_writer(part)
        if not handed:
            _fail(batch, exc)
            return
        error = OutcomeUnknownError(
            f"the writer of {part.stream} failed after it was handed records: they may or "
            f"may not be in the log ({exc.message})"
        )
        error.__cause__ = exc
        _fail(batch, error)

    # -- flushing and closing --------------------------------------------------------

    async def flush(self) -> None:
        """Wait until every record sent so far is answered."""
        waiters = [f for part in self._parts.values() for b in (*part.ready, part.pending)
                   for _r, f in b]  # fmt: skip
        tasks = [part.task for part in self._parts.values() if part.task is not None]
        if tasks:
            await asyncio.wait(tasks)
        for part in self._parts.values():
            if part.writer is not None and part.writer.failed is None:
                with contextlib.suppress(BooklineError):
                    await part.writer.flush()
        if waiters:
            await asyncio.wait(waiters)

    async def close(self) -> None:
        """Flush, then close every partition's writer (sealing its segment)."""
        if self._closed:
            return
        try:
            await asyncio.wait_for(self.flush(), CLOSE_TIMEOUT_S)
        finally:
            self._closed = True
            writers = [p.writer for p in self._parts.values() if p.writer is not None]
            for part in self._parts.values():
                part.writer = None
            await asyncio.gather(*(w.close() for w in writers), return_exceptions=True)

    async def __aenter__(self) -> TopicProducer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _fail(items: Sequence[_Item], error: BooklineError) -> None:
    for _rec, fut in items:
        if not fut.done():
            fut.set_exception(error)
            fut.add_done_callback(_consume)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class SyncTopicProducer:
    """:class:`TopicProducer` for threads, on a :class:`~streams.sync.SyncNamespace`'s
    loop: ``send`` blocks until the record is durable."""

    def __init__(self, ns: SyncNamespace, *, config: ProducerConfig | None = None) -> None:
        self._run: LoopThread = ns.runner
        self._producer = TopicProducer(ns.ns, config=config)

    def send(
        self,
        topic: str,
        value: bytes | str | LogRecord | None,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> tuple[int, int]:
        return self._run.call(
            self._producer.send(topic, value, key, headers, partition, timestamp_ms=timestamp_ms)
        )

    def send_many(
        self,
        topic: str,
        records: Sequence[bytes | str | LogRecord | None],
        partition: int | None = None,
    ) -> list[tuple[int, int]]:
        return self._run.call(self._producer.send_many(topic, records, partition))

    def flush(self) -> None:
        self._run.call(self._producer.flush())

    def close(self) -> None:
        self._run.call(self._producer.close())

    def __enter__(self) -> SyncTopicProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
