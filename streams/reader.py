"""A log stream reader: catch-up from the bookies, then tailing with long polls.

One fetch task walks the stream segment by segment and puts decoded entries into a
bounded read-ahead queue (``read_ahead_entries`` entries and ``read_cache_bytes_max``
bytes, whichever comes first); the application takes records from it.

* A sealed segment is read from its first wanted entry to its recorded last entry,
  with ``reads_in_flight_max`` pipelined (speculative) entry reads.
* The in-progress segment is read up to the LAC learnt from the bookies, never beyond:
  entries past it may still vanish in recovery. When caught up, the task long-polls
  the bookies for a LAC past the last entry read and, at the same time, watches the
  segment's znode: sealing it (a roll, a new writer's recovery, a close) ends the long
  poll at once and gives the segment's true last entry.
* The next segment is found through a ZooKeeper watch on its znode.

A timeout of :meth:`LogReader.read_next`/:meth:`~LogReader.read_many` says only that no
record came in time. Whether the reader has read everything the stream holds (it waits
at the readable end: a long poll past the LAC, or a watch for the next segment) is
:attr:`LogReader.caught_up`, and :meth:`LogReader.settle` waits for that -- so "no
records" is never answered for records not read yet. While the bookies cannot be reached
the long polls fail and are retried; meanwhile a read that times out raises their error
(retriable; the reader goes on when they are back) instead of returning nothing.

Control records and the end-of-stream marker are dropped by the decoder; the marker
ends the stream (``EndOfStreamError`` after the last record). Positions the stream
no longer holds raise ``TruncatedError`` unless the reader was opened with
``skip_truncated``, in which case it moves on to the first readable record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Final

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    ConnectionLostError,
    EndOfStreamError,
    NoEntryError,
    NoLedgerError,
    NotFoundError,
    TimeoutError_,
    TruncatedError,
    fresh,
)
from foundation.waits import count_wait
from ledger.reader import LedgerReader
from metadata.segments import SegmentMetadata, TruncationState
from streams.context import CoreContext
from streams.dlsn import DLSN
from streams.reader_items import END, End, Entry, Item, RawRecordSet
from streams.records import ReadRecord
from streams.recordset import decode_verified, verify_record_set
from streams.seek import first_readable

log = logging.getLogger(__name__)

__all__ = ["LogReader", "RawRecordSet"]

# Pause after a failed long poll (a bookie restarting, a ledger not seen yet) so the
# loop cannot spin.
_RETRY_PAUSE_S = 0.05
# A take from a queue that holds an entry: no wait to count (foundation.waits).
_SERVED: Final = contextlib.nullcontext()


class LogReader:
    """Use from one event loop. Open with :meth:`Namespace.open_reader`."""

    def __init__(self, ctx: CoreContext, stream: str, start: DLSN, *, skip_truncated: bool) -> None:
        self._ctx = ctx
        self.stream = stream
        self._skip_truncated = skip_truncated
        cfg = ctx.config
        self._queue: asyncio.Queue[Item] = asyncio.Queue(cfg.read_ahead_entries)
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._current: list[ReadRecord] = []
        self._index = 0
        self._position = start
        self._next_entry = 0  # the entry after the last one read (see _read_range)
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        # Time the fetch task spent caught up (everything confirmed read ahead, waiting
        # at the readable end: a long poll, a watch): closed intervals' sum, and since
        # when it waits there now (None: it is fetching).
        self._head_s = 0.0
        self._head_since: float | None = None
        # Why its long polls fail (bookies unreachable), until one is answered again.
        self._stall: BooklineError | None = None
        # Set whenever an entry is queued or the two above change (settle waits on it).
        self._progress = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._fetch(start))

    # -- the application's side ---------------------------------------------------

    @property
    def position(self) -> DLSN:
        """DLSN of the next record to read (or where it will be)."""
        if self._index < len(self._current):
            return self._current[self._index].dlsn
        return self._position

    @property
    def caught_up(self) -> bool:
        """True when every record the stream holds so far was handed out: the fetch
        waits at the readable end, its long polls are answered, nothing is read ahead."""
        return (
            self._head_since is not None
            and self._stall is None
            and self._queue.empty()
            and self._index >= len(self._current)
        )

    async def settle(self, timeout_s: float) -> None:
        """Wait until there is something to hand out (records, the end of the stream, a
        failure: the next read gives it) or the reader is :attr:`caught_up`. Raises the
        error of a fetch whose long polls fail (bookies down; retriable) and
        ``TimeoutError_`` when neither happened within ``timeout_s``: an empty read
        after this means "no more records", never "not read yet"."""
        if self._closed:
            raise ClosedError(f"reader of {self.stream} was closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._progress.clear()
            if self._index < len(self._current) or not self._queue.empty():
                return
            if self._ended or self._error is not None:
                return
            if self._stall is not None:
                raise _again(self._stall)
            if self._head_since is not None:  # waiting at the readable end
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError_(
                    f"reader of {self.stream} got neither a record nor to the stream's "
                    f"end within {timeout_s:g} s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)

    async def read_next(self, timeout_s: float | None = None) -> ReadRecord | None:
        """The next record; None if none arrived within ``timeout_s`` (raises instead
        while the bookies cannot be reached: records may exist beyond)."""
        if self._index >= len(self._current) and not await self._refill(timeout_s):
            return None
        rec = self._current[self._index]
        self._index += 1
        self._position = rec.dlsn.next_slot()
        return rec

    async def read_many(self, max_records: int, timeout_s: float | None = None) -> list[ReadRecord]:
        """Up to ``max_records`` records: waits up to ``timeout_s`` for the first, then
        takes only what is already read ahead (an empty list on timeout)."""
        out: list[ReadRecord] = []
        while len(out) < max_records:
            if self._index >= len(self._current):
                ready = await (self._refill(0.0, raise_now=False) if out
                               else self._refill(timeout_s))  # fmt: skip
                if not ready:
                    break
            take = self._current[self._index : self._index + max_records - len(out)]
            self._index += len(take)
            out.extend(take)
        if out:
            self._position = out[-1].dlsn.next_slot()
        return out

    async def read_record_sets(
        self, bytes_max: int, timeout_s: float | None = None
    ) -> list[RawRecordSet]:
        """Whole record sets as stored, up to about ``bytes_max`` of them (at least
        one): waits up to ``timeout_s`` for the first, then takes only what is read
        ahead (an empty list on timeout). For a proxy handing sets through; do not mix
        with :meth:`read_many` on one reader (records it took are not sets any more).
        EndOfStreamError past the end, as :meth:`read_next`."""
        if self._index < len(self._current):
            raise BadRequestError("read_record_sets after read_many left records unread")
        out: list[RawRecordSet] = []
        size = 0
        while size < bytes_max:
            item = await self._take(timeout_s if not out else 0.0, raise_now=not out)
            if item is None:
                break
            raw = item.raw()
            out.append(raw)
            size += len(raw.payload)
            self._position = DLSN(raw.segment_seqno, raw.entry_id + 1, 0)
        return out

    async def _take(self, timeout_s: float | None, *, raise_now: bool) -> Entry | None:
        """The next read-ahead entry, as :meth:`_refill` takes it (None: timeout, or a
        stored end/error with ``raise_now=False``)."""
        if self._closed:
            raise ClosedError(f"reader of {self.stream} was closed")
        if self._error is None and not self._ended:
            waits = self._waiting_at_head() if self._queue.empty() else _SERVED
            with waits:
                if timeout_s is None:
                    item = await self._queue.get()
                else:
                    got = await self._get_within(timeout_s, raise_now=raise_now)
                    if got is None:
                        return None
                    item = got
            if isinstance(item, Entry):
                self._queued_bytes -= item.size
                self._room.set()
                return item
            if isinstance(item, End):
                self._ended = True
            else:
                self._error = item
        if not raise_now:
            return None
        if self._error is not None:
            raise _again(self._error)
        raise EndOfStreamError(f"stream {self.stream} ended")

    @contextlib.contextmanager
    def _waiting_at_head(self) -> Iterator[None]:
        """The part of the block's time during which the fetch task was caught up is
        the request's waiting for new records (foundation.waits), not serving time."""
        before = self._head_time()
        try:
            yield
        finally:
            count_wait(self._head_time() - before)

    def _head_time(self) -> float:
        since = self._head_since
        return self._head_s + (time.perf_counter() - since if since is not None else 0.0)

    @contextlib.contextmanager
    def _at_head(self) -> Iterator[None]:
        """The fetch task is caught up for the block's duration: readers waiting with
        a timeout may say "nothing more" (settle), and the time counts as waiting."""
        self._head_since = since = time.perf_counter()
        self._progress.set()  # settle() may answer "nothing more" now
        try:
            yield
        finally:
            self._head_s += time.perf_counter() - since
            self._head_since = None

    async def _get_within(self, timeout_s: float, *, raise_now: bool) -> Item | None:
        """The next queued item within ``timeout_s``; None when none came. While the
        long polls fail (bookies down) raises their error at once with ``raise_now``:
        a timed read then says why nothing came instead of "nothing"."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._progress.clear()
            with contextlib.suppress(asyncio.QueueEmpty):
                return self._queue.get_nowait()
            if raise_now and self._stall is not None:
                raise _again(self._stall)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)

    def __aiter__(self) -> AsyncIterator[ReadRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ReadRecord]:
        while True:
            rec = await self.read_next()
            if rec is not None:
                yield rec

    async def _refill(self, timeout_s: float | None, *, raise_now: bool = True) -> bool:
        """Take the next read-ahead entry. False on timeout; at the end of the stream or
        after a failure raise (or, with ``raise_now=False``, return False and raise on
        the next call, so records already taken are not lost)."""
        item = await self._take(timeout_s, raise_now=raise_now)
        if item is None:
            return False
        try:
            self._current, self._index = item.build(self.stream), 0
        except BooklineError as exc:
            self._error = exc
            if not raise_now:
                return False
            raise _again(exc) from exc
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the fetch task ------------------------------------------------------------

    async def _put(self, item: Item) -> None:
        if isinstance(item, Entry):
            size = item.size
            while (
                self._queued_bytes
                and self._queued_bytes + size > self._ctx.config.read_cache_bytes_max
            ):
                self._room.clear()
                await self._room.wait()
            self._queued_bytes += size
        await self._queue.put(item)
        self._progress.set()

    def _stalled(self, exc: BooklineError | None) -> None:
        if exc is None and self._stall is None:
            return
        if exc is not None and self._stall is None:
            log.warning("reader of %s: the bookies do not answer (%s); retrying", self.stream, exc)
        elif exc is None and self._stall is not None:
            log.info("reader of %s: the bookies answer again", self.stream)
        self._stall = exc
        self._progress.set()

    async def _fetch(self, start: DLSN) -> None:
        seqno, entry, slot = start
        try:
            while True:
                seg = await self._await_segment(seqno)
                if seg is None:  # truncated away and skipping: jump ahead
                    floor = await self._floor()
                    seqno, entry, slot = floor
                    continue
                if seg.truncation is TruncationState.PARTIALLY_TRUNCATED:
                    floor_here = DLSN(*seg.min_active_dlsn)
                    if DLSN(seqno, entry, slot) < floor_here:
                        self._truncated(DLSN(seqno, entry, slot), floor_here)
                        seqno, entry, slot = floor_here
                ended = await self._read_segment(seg, entry, slot)
                if ended:
                    await self._put(END)
                    return
                seqno, entry, slot = seqno + 1, 0, 0
        except asyncio.CancelledError:
            raise
        except BooklineError as exc:
            await self._put(exc)
        except Exception as exc:
            log.exception("reader of %s crashed", self.stream)
            await self._put(exc)

    async def _floor(self) -> DLSN:
        return first_readable([s for s, _v in await self._ctx.segments(self.stream)])

    def _truncated(self, position: DLSN, floor: DLSN) -> None:
        if not self._skip_truncated:
            raise TruncatedError(
                f"{self.stream}: position {position} was truncated (first readable {floor})"
            )
        log.info("reader of %s skips truncated %s..%s", self.stream, position, floor)

    async def _await_segment(self, seqno: int) -> SegmentMetadata | None:
        """Segment ``seqno`` once it exists; None if it was truncated (and skipping)."""
        ctx = self._ctx
        path = ctx.md.layout.segment(ctx.namespace, self.stream, seqno)
        changed = asyncio.Event()
        latest: list[tuple[bytes, int] | None] = [None]

        def on_change(snapshot: tuple[bytes, int] | None) -> None:
            latest[0] = snapshot
            changed.set()

        watch = await ctx.md.zk.watch_data(path, on_change)
        try:
            while True:
                changed.clear()
                snapshot = latest[0]
                if snapshot is not None:
                    seg = SegmentMetadata.decode(snapshot[0], path)
                    if seg.truncation is TruncationState.TRUNCATED:
                        self._truncated(DLSN(seqno, 0, 0), await self._floor())
                        return None
                    return seg
                segments = await ctx.segments(self.stream)
                if any(s.seqno > seqno for s, _v in segments):
                    self._truncated(DLSN(seqno, 0, 0), first_readable([s for s, _ in segments]))
                    return None
                if latest[0] is None:
                    with self._at_head():  # no next segment yet: nothing to read
                        await changed.wait()
        finally:
            watch.cancel()

    async def _read_segment(self, seg: SegmentMetadata, entry: int, slot: int) -> bool:
        """Read ``seg`` from ``entry``/``slot`` to its end; True if the stream ended."""
        ctx = self._ctx
        try:
            reader = await ctx.open_segment_reader(seg)
        except TruncatedError:
            newer = await self._compacted(seg)
            if newer is None:
                self._truncated(DLSN(seg.seqno, entry, slot), await self._floor())
                return False
            seg, reader = newer, await ctx.open_segment_reader(newer)
        if seg.is_sealed:
            return await self._read_range(reader, seg, entry, seg.last_entry_id, slot)
        return await self._tail(reader, seg, entry, slot)

    async def _read_range(
        self, reader: LedgerReader, seg: SegmentMetadata, first: int, last: int, slot: int
    ) -> bool:
        stream, seqno = self.stream, seg.seqno
        start = first
        while True:
            try:
                return await self._read_entries(reader, seg, start, first, last, slot)
            except (NoLedgerError, NoEntryError) as exc:
                newer = await self._compacted(seg)
                if newer is None:
                    if isinstance(exc, NoEntryError):
                        raise
                    raise TruncatedError(
                        f"{stream}: segment {seqno} was deleted while reading"
                    ) from exc
                seg, reader = newer, await self._ctx.open_segment_reader(newer)
                start = self._next_entry  # where the old ledger's reading stopped

    async def _compacted(self, seg: SegmentMetadata) -> SegmentMetadata | None:
        """The segment again if compaction pointed it at another ledger (the same
        entries, at the same ids, minus dropped records: reading goes on where it
        was), else None."""
        ctx = self._ctx
        try:
            now, _v = await ctx.md.segments.get_segment(ctx.namespace, self.stream, seg.seqno)
        except NotFoundError:
            return None
        if now.ledger_id == seg.ledger_id or now.truncation is TruncationState.TRUNCATED:
            return None
        log.info("reader of %s: segment %d was compacted; reading on in ledger %d",
                 self.stream, seg.seqno, now.ledger_id)  # fmt: skip
        return now

    async def _read_entries(  # noqa: PLR0917 - private; the range and where it resumes
        self,
        reader: LedgerReader,
        seg: SegmentMetadata,
        start: int,
        first: int,
        last: int,
        slot: int,
    ) -> bool:
        stream, seqno, base = self.stream, seg.seqno, seg.start_sequence_id
        self._next_entry = start
        async for e in reader.iter_entries(start, last):
            header, body = verify_record_set(e.payload)
            from_slot = slot if e.entry_id == first else 0
            self._next_entry = e.entry_id + 1
            if from_slot == 0 and header.user_count == header.count > 0:
                # Only user records (the decoder checks the count): build them
                # when the application gets here.
                await self._put(Entry(None, header, body, seqno, e.entry_id, base, e.payload, 0))
                continue
            records, eos = decode_verified(header, body, stream, seqno, e.entry_id, base,
                                           from_slot)  # fmt: skip
            if records:
                await self._put(Entry(records, header, body, seqno, e.entry_id, base,
                                       e.payload, from_slot))  # fmt: skip
            if eos:
                return True
        return False

    async def _tail(
        self, reader: LedgerReader, seg: SegmentMetadata, entry: int, slot: int
    ) -> bool:
        ctx = self._ctx
        path = ctx.md.layout.segment(ctx.namespace, self.stream, seg.seqno)
        sealed: list[SegmentMetadata] = []
        polls: list[asyncio.Future[int]] = []  # the long poll in progress, if any

        def on_change(snapshot: tuple[bytes, int] | None) -> None:
            if snapshot is not None:
                meta = SegmentMetadata.decode(snapshot[0], path)
                if meta.is_sealed and not sealed:
                    sealed.append(meta)
            for poll in polls:  # the segment changed: look again instead of waiting
                poll.cancel()

        watch = await ctx.md.zk.watch_data(path, on_change)
        nxt = entry
        try:
            while True:
                lac = reader.last_add_confirmed
                if nxt <= lac:
                    if await self._read_range(reader, seg, nxt, lac, slot):
                        return True
                    nxt, slot = lac + 1, 0
                    continue
                if sealed:
                    await reader.refresh_metadata()
                    return await self._read_range(
                        reader, sealed[0], nxt, sealed[0].last_entry_id, slot
                    )
                with self._at_head():  # everything confirmed is read ahead
                    await self._wait_lac_or_seal(reader, nxt - 1, polls)
        finally:
            watch.cancel()

    async def _wait_lac_or_seal(
        self, reader: LedgerReader, previous: int, polls: list[asyncio.Future[int]]
    ) -> None:
        """One long poll; the segment's watch cancels it when the segment changes (a
        seal). One task and one wake-up per round: a tail's latency is counted in
        event-loop iterations, and a busy loop makes each of them cost."""
        poll = asyncio.ensure_future(
            reader.wait_lac(previous, self._ctx.config.long_poll_timeout_ms)
        )
        polls.append(poll)
        try:
            await asyncio.wait((poll,))
        finally:
            polls.remove(poll)
            if not poll.done():  # we were cancelled (the reader is closing)
                poll.cancel()
                await asyncio.gather(poll, return_exceptions=True)
        if poll.cancelled():
            return
        exc = poll.exception()
        if isinstance(exc, TimeoutError_ | ConnectionLostError):
            # No bookie answered: what was written past the LAC known is not known
            # (reads that time out now raise this, see settle).
            self._stalled(exc)
            await asyncio.sleep(_RETRY_PAUSE_S)
            return
        if exc is not None and not isinstance(exc, NoEntryError | NoLedgerError):
            raise exc
        self._stalled(None)  # answered (by "not here yet" too): the LAC is current
        if exc is not None:
            log.debug("%s: long poll failed: %s", self.stream, exc)
            await asyncio.sleep(_RETRY_PAUSE_S)


def _again(exc: BaseException) -> BaseException:
    """A fresh exception per raise (the stored one keeps the original traceback)."""
    if isinstance(exc, BooklineError):
        return fresh(exc)
    return exc
