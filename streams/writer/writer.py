"""The single writer of a log stream: what :meth:`Namespace.open_writer` returns.

Opening takes the stream's exclusive ZooKeeper lock (or fails with
``LockOwnedError(owner=)``), then :class:`~streams.writer.segments.Segments` recovers
the previous segment -- fencing any old writer -- and opens this writer's own.

Writing validates each record (size, txid, timestamp) and hands it to the
:class:`~streams.writer.sender.Sender`, which batches records into entries and
transmits them in order; futures resolve to DLSNs once an entry is acknowledged by the
ack quorum. The first failure fails the writer for good (``WriterFailedError``, cause
chained; ``OwnershipLostError`` when the lock is lost); a suspended ZooKeeper session
pauses transmits until the lock is confirmed again. Here too: flush, truncation, the
end-of-stream marker, close, and the stream's retention policy.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import os
import socket
from collections.abc import Sequence

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    EndOfStreamError,
    OutOfRangeError,
    OwnershipLostError,
    TooLargeError,
    TooManyRequestsError,
    fresh,
)
from foundation.limits import RECORD_BYTES_MAX, record_bytes
from metadata.ownership import LockState, StreamLock
from metadata.streams import LOG_APPEND_TIME as LOG_APPEND_TIME_NAME
from metadata.streams import StreamOptions
from metadata.zk_watch import Watch
from streams.context import CoreContext
from streams.dlsn import DLSN, DLSNSequence
from streams.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    RECORD_OVERHEAD_BYTES,
    LogRecord,
    RecordColumns,
)
from streams.recordset_encode import check_headers
from streams.recordset_layout import ORIGIN_TAG_BYTES_MAX
from streams.retention import apply_retention, truncate_before
from streams.writer.buffer import Batch
from streams.writer.options import watch_options
from streams.writer.segments import Segments
from streams.writer.sender import Sender

# A producer's timestamp at most (ms; the record set stores it as a signed 64-bit int).
TIMESTAMP_MS_MAX = 2**63 - 1
log = logging.getLogger(__name__)

__all__ = ["LogWriter", "default_identity"]


def _records_fitting(ends: list[int], i: int, room: int) -> int:
    """The largest ``j >= i`` such that records ``[i, j)``, framing included, take at
    most ``room`` bytes; ``ends[k]`` is the user bytes of the records before ``k``."""
    overhead = RECORD_OVERHEAD_BYTES
    target = ends[i] + i * overhead + room
    past = bisect.bisect_right(range(len(ends)), target, lo=i, key=lambda k: ends[k] + k * overhead)
    return max(past - 1, i)


def _user_bytes(cols: RecordColumns, payloads: list[bytes | None]) -> list[int]:
    """Each record's size as the limits count it (:func:`record_bytes`): C-level for
    payloads alone, per record only for the records with headers. An origin tag
    counts with each record (it is stored with each, as its header was before format
    v3), so entries stay within their limits however small the records."""
    keys, headers = cols.keys, cols.headers
    try:
        user = list(map(len, payloads))  # type: ignore[arg-type]  # None: TypeError
    except TypeError:  # null values (count 0): rare, so not checked for up front
        user = [0 if p is None else len(p) for p in payloads]
    if keys is not None:
        user = [u if k is None else u + len(k) for u, k in zip(user, keys, strict=True)]
    if headers is not None:
        for k in itertools.compress(range(len(user)), headers):  # the records with headers
            hdrs = headers[k]
            assert hdrs is not None  # compress skipped the records without
            check_headers(hdrs)
            user[k] = record_bytes(payloads[k], None if keys is None else keys[k], hdrs)
    if cols.tag is not None:
        tag = len(_checked_tag(cols.tag))
        user = [u + tag for u in user]
    return user


def _checked_tag(tag: object) -> bytes:
    """An origin tag (:class:`RecordColumns`) the encoder takes, checked before the
    write is accepted (the encoder runs in the writer's pipe)."""
    if not isinstance(tag, bytes) or len(tag) > ORIGIN_TAG_BYTES_MAX:
        raise BadRequestError(f"an origin tag is bytes, at most {ORIGIN_TAG_BYTES_MAX} long")
    return tag


def _checked_timestamp(stamp: int) -> int:
    """A producer's timestamp: ms since the epoch, not negative (as Kafka's)."""
    if type(stamp) is not int or not 0 <= stamp <= TIMESTAMP_MS_MAX:
        raise BadRequestError(f"record timestamp {stamp!r} is not ms since the epoch")
    return stamp


def default_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LogWriter:
    """Use from one event loop. Open with :meth:`Namespace.open_writer`."""

    def __init__(
        self,
        ctx: CoreContext,
        stream: str,
        lock: StreamLock,
        options: StreamOptions,
    ) -> None:
        self._ctx = ctx
        self._cfg = ctx.config
        self.stream = stream
        self._lock = lock
        self._options = options
        # The largest record a write may carry: the stream's (a topic's
        # max.message.bytes) when it sets one, never more than Bookline's.
        self._record_bytes_max = min(options.record_bytes_max or RECORD_BYTES_MAX, RECORD_BYTES_MAX)
        self._loop = asyncio.get_running_loop()
        self._segments = Segments(ctx, stream, lock, options, self._failure)
        # LogAppendTime: every record gets the writer's clock at append, the producer's
        # timestamp is overwritten (Kafka's message.timestamp.type).
        self._log_append_time = options.timestamp_type == LOG_APPEND_TIME_NAME
        ts_type = LOG_APPEND_TIME if self._log_append_time else CREATE_TIME
        self._sender = Sender(stream, ctx.config, self._segments, self._now, ts_type)
        self._retention_task: asyncio.Task[None] | None = None
        self._options_watch: Watch[tuple[bytes, int] | None] | None = None
        self._ended = False
        self._ending = False  # the end-of-stream marker is queued: nothing may follow it
        self._closed = False
        self._last_txid = -1
        self._last_ts = 0

    # -- opening -----------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        ctx: CoreContext,
        stream: str,
        identity: str | None = None,
        *,
        lock_timeout_s: float | None = None,
    ) -> LogWriter:
        record, _version = await ctx.md.streams.get_stream(ctx.namespace, stream)
        lock = ctx.md.stream_lock(ctx.namespace, stream, identity or default_identity())
        if lock_timeout_s is None:
            await lock.try_acquire()
        else:
            await lock.acquire(lock_timeout_s)
        writer = cls(ctx, stream, lock, record.options)
        try:
            await writer._start()
        except BaseException:
            await writer._segments.abort_open()
            await lock.release()
            raise
        return writer

    async def _start(self) -> None:
        self._lock.add_listener(self._on_lock_state)
        self._sender.owned.set()
        self._last_txid = await self._segments.open()
        assert self._segments.current is not None
        self._last_ts = self._segments.current.opened_ms
        self._options_watch = await watch_options(self._ctx, self.stream, self._apply_options)
        self._retention_task = asyncio.ensure_future(self._retention_loop())

    def _apply_options(self, options: StreamOptions) -> None:
        """The stream's options changed (a topic's configs altered): the record limit
        and retention apply now, rolls and quorums from the next segment."""
        if options == self._options or self._closed:
            return
        self._options = options
        self._record_bytes_max = min(options.record_bytes_max or RECORD_BYTES_MAX, RECORD_BYTES_MAX)
        self._segments.apply_options(options)
        if self._retention_task is not None and self._retention_task.done():
            self._retention_task = asyncio.ensure_future(self._retention_loop())
        log.info("writer of %s: options now %s", self.stream, options)

    # -- properties ------------------------------------------------------------------

    @property
    def last_dlsn(self) -> DLSN | None:
        """The DLSN of the last acknowledged record (None before the first)."""
        return self._sender.last_dlsn

    @property
    def last_txid(self) -> int:
        return self._last_txid

    @property
    def identity(self) -> str:
        return self._lock.identity

    @property
    def segment_seqno(self) -> int:
        return self._segments.seqno

    @property
    def failed(self) -> BooklineError | None:
        return self._sender.error

    def _failure(self) -> BooklineError | None:
        return self._sender.error

    # -- writing ---------------------------------------------------------------------

    def _check(self) -> None:
        error = self._sender.error
        if error is not None:
            raise fresh(error)
        if self._closed:
            raise ClosedError(f"writer of {self.stream} was closed")
        if self._ended or self._ending:
            raise EndOfStreamError(f"stream {self.stream} was marked ended")

    def _txid_for(self, txid: int | None, now_ms: int) -> int:
        if txid is None:
            return max(now_ms, self._last_txid)
        if txid < self._last_txid:
            raise BadRequestError(
                f"txid {txid} is below the stream's last txid {self._last_txid} "
                "(txids must not decrease)"
            )
        return txid

    def write_nowait(self, record: LogRecord) -> asyncio.Future[DLSN]:
        """Buffer ``record``; the future resolves to its DLSN once durable. Order is
        kept across write_nowait/write/write_many calls."""
        self._check()
        if record.key is None and record.headers is None and record.payload is not None:
            user = len(record.payload)
        else:
            if record.headers is not None:
                check_headers(record.headers)
            user = record_bytes(record.payload, record.key, record.headers)
        if user > self._record_bytes_max:
            raise TooLargeError(f"record of {user} bytes; at most {self._record_bytes_max}")
        size = user + RECORD_OVERHEAD_BYTES
        sender = self._sender
        if sender.pending_bytes + size > self._cfg.pending_bytes_max:
            raise TooManyRequestsError(f"writer of {self.stream}: too many bytes pending")
        now = self._now()
        txid = self._txid_for(record.txid, now)
        stamp = record.timestamp_ms
        if stamp is not None:
            stamp = None if self._log_append_time else _checked_timestamp(stamp)
        fut: asyncio.Future[DLSN] = self._loop.create_future()
        sender.add(record, txid, now, fut, size, stamp)
        self._last_txid = txid
        return fut

    async def write(self, record: LogRecord) -> DLSN:
        await self._wait_room(len(record.payload or b"") + RECORD_OVERHEAD_BYTES)
        return await self.write_nowait(record)

    async def write_many(self, records: Sequence[LogRecord]) -> Sequence[DLSN]:
        """Append many records in order; resolves to their DLSNs once all are durable:
        an immutable :class:`~streams.dlsn.DLSNSequence` (equal to the list of them;
        each DLSN is made when it is read)."""
        if not records:
            self._check()
            return DLSNSequence()
        fut: asyncio.Future[Sequence[DLSN]] = self._loop.create_future()
        await self._append_many(records, Batch(fut, len(records)))
        return await fut

    async def write_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> tuple[Sequence[DLSN], list[int]]:
        """:meth:`write_many` that also answers the records' offsets: their sequence ids
        in the stream (0, 1, 2, ... across segments), known when their entries are
        acknowledged. Consecutive unless another write call interleaved while this one
        waited for room (``pending_bytes_max``)."""
        return await (await self.append_many_offsets(records))

    async def append_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> asyncio.Future[tuple[Sequence[DLSN], list[int]]]:
        """Buffer ``records`` in order -- waiting for room like :meth:`write_many` --
        and return a future of ``(dlsns, offsets)`` that resolves once they are durable.
        Awaiting each call before making the next keeps a caller's batches in order
        and consecutive without waiting for their acknowledgements (pipelining)."""
        fut: asyncio.Future[tuple[Sequence[DLSN], list[int]]] = self._loop.create_future()
        if not records:
            self._check()
            fut.set_result((DLSNSequence(), []))
            return fut
        await self._append_many(records, Batch(fut, len(records), offsets=True))
        return fut

    async def _append_many(self, records: Sequence[LogRecord], batch: Batch) -> None:
        """Buffer ``records`` (non-empty) for ``batch``, cutting entries as they fill.

        Per record only C-level work where it can be (issues 17, 23): the records as
        columns (:class:`RecordColumns`: what a write front end hands over as it
        decoded them, or one pass over LogRecords), all taking the call's txid unless
        some carry their own, and entries cut by bisecting the running byte count
        instead of adding sizes one by one."""
        self._check()
        cols = RecordColumns.of(records)
        payloads = cols.payloads if isinstance(cols.payloads, list) else list(cols.payloads)
        n = len(payloads)
        now = self._now()
        user = _user_bytes(cols, payloads)
        largest = max(user)
        if largest > self._record_bytes_max:
            raise TooLargeError(f"record of {largest} bytes; at most {self._record_bytes_max}")
        if cols.txids is None:
            txids = [max(now, self._last_txid)] * n
        else:
            txids = self._txids_many(cols.txids, now)
        stamps = None
        if cols.timestamps is not None and not self._log_append_time:
            stamps = [now if t is None else _checked_timestamp(t) for t in cols.timestamps]
        self._last_txid = txids[-1]
        ends = list(itertools.accumulate(user, initial=0))  # user bytes before record k
        sender = self._sender
        limit = self._cfg.buffer_bytes_max
        i = 0
        while i < n:
            await self._wait_room(ends[i + 1] - ends[i] + RECORD_OVERHEAD_BYTES)
            self._check()
            buffered = sender.buffer.nbytes
            j = _records_fitting(ends, i, limit - buffered)
            if j == i:
                if buffered:
                    sender.cut()
                    continue
                j = i + 1  # a record bigger than a whole buffer is an entry of its own
            added = ends[j] - ends[i] + (j - i) * RECORD_OVERHEAD_BYTES
            sender.buffer.append_many(cols, payloads, txids, now, batch, i, j, added, stamps)
            sender.pending_bytes += added
            if j < n or buffered + added >= limit:
                sender.cut()
            i = j
        sender.arm_timer()

    def _txids_many(self, given: Sequence[int | None], now: int) -> list[int]:
        """Every record's txid: its own, or the call's (``given`` has some)."""
        default = max(now, self._last_txid)
        txids = [default if t is None else t for t in given]
        last = self._last_txid
        for t in txids:
            if t < last:
                raise BadRequestError(f"txid {t} is below {last} (txids must not decrease)")
            last = t
        # records without a txid after ones with a larger txid take that txid
        running = self._last_txid
        for k, t in enumerate(txids):
            running = max(running, t)
            txids[k] = running
        return txids

    def _now(self) -> int:
        now = max(self._ctx.clock_ms(), self._last_ts)  # timestamps never go back
        self._last_ts = now
        return now

    async def _wait_room(self, size: int) -> None:
        sender = self._sender
        while sender.pending_bytes + size > self._cfg.pending_bytes_max and sender.pending_bytes:
            self._check()
            sender.room.clear()
            await sender.room.wait()
        self._check()

    # -- failing -----------------------------------------------------------------------

    def _on_lock_state(self, state: LockState) -> None:
        if state is LockState.OWNED:
            self._sender.owned.set()
        elif state is LockState.SUSPENDED:
            self._sender.owned.clear()  # hold transmits until the lock is confirmed ours
        elif state is LockState.LOST and not self._closed:
            self._sender.fail(OwnershipLostError(f"writer of {self.stream} lost the stream's lock"))

    # -- flush, truncate, end, close -------------------------------------------------

    async def flush(self) -> None:
        """Transmit what is buffered and wait until everything written so far is durable."""
        self._check()
        self._sender.cut()
        out = self._sender.last_out
        if out is not None:
            await asyncio.shield(out.done)
        self._check()

    async def truncate(self, dlsn: DLSN) -> bool:
        """Mark everything before ``dlsn`` truncated and delete the segments (and their
        ledgers) that lie wholly before it. Returns whether anything changed.

        Everything written before the call is made durable first; a point past its end
        (:meth:`durable_end`) raises OutOfRangeError and changes nothing, since such a
        point would hide records written later."""
        await self.flush()
        point = DLSN(*dlsn)
        async with self._segments.meta_lock:
            self._lock.check_owner()
            end = self.durable_end()
            if point > end:
                raise OutOfRangeError(
                    f"truncation point {point} of {self.stream} is beyond the durable end "
                    f"{end} (the position after the last acknowledged record)"
                )
            changed = await truncate_before(self._ctx, self.stream, point, end)
        return changed

    def durable_end(self) -> DLSN:
        """The position just after the last acknowledged record: the next record goes
        at or after it. Before this writer acknowledged anything, the start of its own
        segment (every segment before it is sealed)."""
        last = self.last_dlsn
        if last is None:
            return DLSN(self.segment_seqno, 0, 0)
        return DLSN(last.segment_seqno, last.entry_id + 1, 0)

    async def mark_end_of_stream(self) -> None:
        """Write the end-of-stream marker and seal the segment; later writes raise
        EndOfStreamError and readers end with it."""
        await self.flush()
        self._check()
        # From here no write and no control record may be queued behind the marker:
        # readers and the next writer look for it in the segment's last entry.
        self._ending = True
        self._sender.stop_control()
        out = self._sender.enqueue_marker("eos")
        await asyncio.shield(out.done)
        self._ended = True
        await self._segments.seal(None)

    async def close(self) -> None:
        """Flush, seal the segment, release the lock. Idempotent; after a failure it
        only releases what it holds (the next writer recovers the segment)."""
        if self._closed:
            return
        try:
            if self._sender.error is None and not (self._ended or self._ending):
                try:
                    await self.flush()
                    self._closed = True
                    self._sender.stop_control()
                    await self._sender.drain()
                    await self._segments.seal(None)
                except BooklineError as exc:
                    log.warning("closing writer of %s: %s; next writer recovers", self.stream, exc)
        finally:
            self._closed = True
            await self._release()

    async def _release(self) -> None:
        if self._options_watch is not None:
            self._options_watch.cancel()
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, BooklineError):
                await self._retention_task
        await self._sender.stop()
        await self._segments.release()
        await self._lock.release()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- retention ---------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        if self._options.retention_ms is None and self._options.retention_bytes is None:
            return
        interval_s = self._cfg.retention_check_interval_ms / 1000.0
        while not self._closed and self._sender.error is None:
            await asyncio.sleep(interval_s)
            try:
                async with self._segments.meta_lock:
                    await apply_retention(self._ctx, self.stream, self._options, self.durable_end())
            except BooklineError as exc:
                log.warning("retention of %s failed (will retry): %s", self.stream, exc)
