"""Shared tail feeds: one core reader per hot stream, fanned out to every tailer.

A :class:`Feed` reads a stream forward from some sequence id with one core
:class:`~streams.reader.LogReader` and keeps the most recent records in a bounded
ring (by records and bytes), each with its msgpack encoding made once. Every tailing
client of that stream -- long polls and WebSockets alike -- is served from the ring, so
N tailers cost one bookie read per entry instead of N. A client behind the ring's start
catches up with a private reader (:class:`~serving.read.readers.ReaderPool`) and joins the
feed once it reaches the ring. Records are packed by :mod:`serving.read.frames`.

Positions inside the read core are sequence ids (contiguous per stream).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from foundation.errors import BooklineError, ClosedError, TooManyRequestsError
from foundation.waits import waiting
from serving.read.config import ReadConfig
from serving.read.frames import CachedRecord, pack_record
from serving.read.metrics import ReadMetrics
from serving.read.readers import close_quietly
from streams.dlsn import DLSN, StartPosition
from streams.records import ReadRecord

if TYPE_CHECKING:
    from streams.namespace import Namespace
    from streams.reader import LogReader

log = logging.getLogger(__name__)

__all__ = ["Feed", "FeedRegistry"]

# Records one pump read takes from the core reader at once.
PUMP_BATCH_RECORDS = 1_000
# The pump's long poll; only bounds how fast an idle feed notices it should close.
PUMP_WAIT_S = 1.0
# After a core reader error the feed retries this often (bookies/ZK come back).
PUMP_RETRY_S = 0.5


class Feed:
    def __init__(
        self,
        ns: Namespace,
        name: str,
        start_seq: int,
        *,
        config: ReadConfig,
        metrics: ReadMetrics,
        on_bytes: Callable[[int], None],
    ) -> None:
        self.ns = ns
        self.name = name
        self._cfg = config
        self._metrics = metrics
        self._on_bytes = on_bytes
        self.ring: collections.deque[CachedRecord] = collections.deque()
        self.first_seq = start_seq
        self.next_seq = start_seq
        self.bytes = 0
        self.subscribers = 0
        self.last_used = time.monotonic()
        self.error: BooklineError | None = None
        self._reader: LogReader | None = None  # the pump's
        self._new = asyncio.Event()
        self._last_entry: tuple[int, int] | None = None
        self._task = asyncio.get_running_loop().create_task(self._pump(start_seq))

    # -- reading the ring ----------------------------------------------------------

    @property
    def at_head(self) -> bool:
        """The ring ends where the stream does: the pump's reader is caught up (an
        empty slice at ``next_seq`` then means "no more records", not "not read yet")."""
        reader = self._reader
        return self.error is None and reader is not None and reader.caught_up

    def covers(self, seq: int) -> bool:
        return self.first_seq <= seq <= self.next_seq

    def seq_of(self, dlsn: DLSN) -> int | None:
        """Sequence id of the first cached record at or after ``dlsn`` (None: not
        within the ring)."""
        if not self.ring or dlsn < self.ring[0].record.dlsn:
            return None
        if dlsn > self.ring[-1].record.dlsn:
            return self.next_seq if dlsn == self.ring[-1].record.dlsn.next_slot() else None
        lo, hi = 0, len(self.ring) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ring[mid].record.dlsn < dlsn:
                lo = mid + 1
            else:
                hi = mid
        return self.first_seq + lo

    def slice(self, seq: int, records_max: int, bytes_max: int) -> list[CachedRecord]:
        """Cached records from ``seq`` on (empty when ``seq`` is the head)."""
        self.last_used = time.monotonic()
        start = seq - self.first_seq
        if start < 0:
            raise IndexError("behind the feed")
        out: list[CachedRecord] = []
        size = 0
        for i in range(start, min(len(self.ring), start + records_max)):
            item = self.ring[i]
            if out and size + item.size > bytes_max:
                break
            out.append(item)
            size += item.size
        return out

    async def wait_beyond(self, seq: int, timeout_s: float) -> bool:
        """Wait until a record with sequence ``seq`` is cached; False on timeout. The
        time is the request's waiting, not its serving (:mod:`foundation.waits`)."""
        with waiting():
            return await self._wait_beyond(seq, timeout_s)

    async def _wait_beyond(self, seq: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.next_seq <= seq:
            if self.error is not None and self._task.done():
                raise self.error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            event = self._new
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return True

    # -- the pump ------------------------------------------------------------------

    async def _pump(self, start_seq: int) -> None:
        try:
            while True:
                try:
                    if self._reader is None:
                        self._reader = await self.ns.open_reader(
                            self.name, StartPosition.sequence(self.next_seq), skip_truncated=True
                        )
                    recs = await self._reader.read_many(PUMP_BATCH_RECORDS, timeout_s=PUMP_WAIT_S)
                except (ClosedError, asyncio.CancelledError):
                    raise
                except BooklineError as exc:
                    log.warning("feed %s: reader failed (%s); reopening", self.name, exc)
                    self.error = exc
                    reader, self._reader = self._reader, None
                    if reader is not None:
                        await close_quietly(reader)
                    await asyncio.sleep(PUMP_RETRY_S)
                    continue
                self.error = None
                if recs:
                    self._append(recs)
        finally:
            reader, self._reader = self._reader, None
            if reader is not None:
                await close_quietly(reader)

    def _append(self, recs: list[ReadRecord]) -> None:
        entries = 0
        added = 0
        for rec in recs:
            if rec.sequence_id != self.next_seq:
                # Truncation skipped ahead (or a first record after a gap): restart the ring.
                log.info(
                    "feed %s: jump from seq %d to %d", self.name, self.next_seq, rec.sequence_id
                )
                self._on_bytes(-self.bytes)
                self.ring.clear()
                self.bytes = 0
                self.first_seq = rec.sequence_id
            item = pack_record(rec)
            self.ring.append(item)
            self.bytes += item.size
            added += item.size
            self.next_seq = rec.sequence_id + 1
            entry = (rec.dlsn.segment_seqno, rec.dlsn.entry_id)
            if entry != self._last_entry:
                entries += 1
                self._last_entry = entry
        self._metrics.count_core("feed", records=len(recs), entries=entries)
        self._on_bytes(added)
        self._evict()
        old, self._new = self._new, asyncio.Event()
        old.set()

    def _evict(self) -> None:
        self._drop_oldest(self._cfg.feed_records_max, self._cfg.feed_bytes_max)

    def shrink(self, keep_fraction: float) -> None:
        """Give memory back under global cache pressure (oldest first)."""
        self._drop_oldest(int(len(self.ring) * keep_fraction), self.bytes)

    def _drop_oldest(self, records_max: int, bytes_max: int) -> None:
        """Drop the oldest records until at most ``records_max`` and ``bytes_max`` remain,
        always keeping the newest one."""
        removed = 0
        while len(self.ring) > 1 and (len(self.ring) > records_max or self.bytes > bytes_max):
            item = self.ring.popleft()
            self.bytes -= item.size
            removed += item.size
            self.first_seq += 1
        if removed:
            self._on_bytes(-removed)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if not self._task.cancelled() and self._task.exception() is not None:
            log.warning("feed %s ended with %s", self.name, self._task.exception())
        self._on_bytes(-self.bytes)
        self.ring.clear()
        self.bytes = 0


class FeedRegistry:
    """The feeds of one read core, bounded in count and in total cached bytes."""

    def __init__(self, ns: Namespace, config: ReadConfig, metrics: ReadMetrics) -> None:
        self.ns = ns
        self.cfg = config
        self.metrics = metrics
        self.feeds: dict[str, Feed] = {}
        self.cache_bytes = 0
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    def get(self, name: str) -> Feed | None:
        return self.feeds.get(name)

    def _account(self, delta: int) -> None:
        self.cache_bytes += delta
        self.metrics.set_cache_bytes(self.cache_bytes)
        if self.cache_bytes > self.cfg.cache_bytes_max:
            for feed in sorted(self.feeds.values(), key=lambda f: f.last_used):
                feed.shrink(0.5)
                if self.cache_bytes <= self.cfg.cache_bytes_max * 0.8:
                    break

    async def open(self, name: str, start_seq: int) -> Feed:
        feed = self.feeds.get(name)
        if feed is not None:
            return feed
        if len(self.feeds) >= self.cfg.feeds_max:
            idle = [f for f in self.feeds.values() if f.subscribers == 0]
            if not idle:
                raise TooManyRequestsError(f"{len(self.feeds)} streams tailed; the limit")
            victim = min(idle, key=lambda f: f.last_used)
            await self.close_feed(victim.name)
            feed = self.feeds.get(name)
            if feed is not None:
                return feed
        feed = Feed(
            self.ns, name, start_seq, config=self.cfg, metrics=self.metrics, on_bytes=self._account
        )
        self.feeds[name] = feed
        self.metrics.set_feeds(len(self.feeds))
        return feed

    async def close_feed(self, name: str) -> None:
        feed = self.feeds.pop(name, None)
        if feed is not None:
            await feed.close()
            self.metrics.set_feeds(len(self.feeds))

    async def _reap(self) -> None:
        idle_s = self.cfg.feed_idle_ms / 1000
        while True:
            await asyncio.sleep(min(idle_s, 5.0))
            now = time.monotonic()
            for feed in list(self.feeds.values()):
                if feed.subscribers == 0 and now - feed.last_used > idle_s:
                    log.info("closing idle feed %s", feed.name)
                    await self.close_feed(feed.name)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for name in list(self.feeds):
            await self.close_feed(name)
