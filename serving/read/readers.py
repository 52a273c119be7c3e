"""Private readers of one read core (:class:`ReaderPool`): range reads, and catch-up
for a client behind a feed's ring. A read answers nothing only when its reader has read
everything the stream holds (``LogReader.settle``): a reader still fetching gets up to
``range_read_timeout_ms`` more, and one that cannot read (bookies down) raises its error,
so a client is never told "no records" for records that exist (503, retriable).

A reader is kept between pages, found again by ``(stream, next sequence id)``, so paging
through a stream reuses one core reader; idle ones are closed after
``private_reader_idle_ms``, and at most ``private_readers_max`` exist (then 429). A page
cut short by its bytes keeps the records it read past its end with the reader (the next
page starts with them): without them the next page found no reader at its offset and
opened another, which began its read-ahead from nothing (a Kafka consumer's every
fetch did, 1 MiB a partition: 0.5-3 s a page on a loaded machine, issue 25)."""

from __future__ import annotations

import asyncio
import collections
import logging
import operator
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeVar

from foundation.errors import BooklineError, TooManyRequestsError
from serving.read.config import ReadConfig
from serving.read.metrics import ReadMetrics
from streams.dlsn import StartPosition
from streams.records import ReadRecord

if TYPE_CHECKING:
    from streams.namespace import Namespace
    from streams.reader import LogReader, RawRecordSet

log = logging.getLogger(__name__)
# At the stream's readable end, a record already acknowledged to its writer becomes
# visible one LAC round trip later (the explicit LAC): a read that found nothing gives
# it this long before answering an empty page (range reads waited 300 ms before).
AT_END_GRACE_S = 0.3

__all__ = ["ReaderPool", "close_quietly", "within_bytes"]

# A ReadRecord is a tuple: [7] is its payload, [8] its key.
_VALUE: Final = operator.itemgetter(7)
_KEY: Final = operator.itemgetter(8)


def within_bytes(
    recs: list[ReadRecord], bytes_max: int
) -> tuple[list[ReadRecord], list[ReadRecord]]:
    """The leading records within ``bytes_max`` of values and keys (at least one), and
    the rest. The sizes are summed in C first (a per-record Python loop was 10 % of a
    page's CPU in py-spy)."""
    payloads = list(map(_VALUE, recs))
    if None in payloads:  # null values (rare) count nothing
        payloads = [p or b"" for p in payloads]
    values = list(map(len, payloads))
    if sum(values) + sum(map(len, filter(None, map(_KEY, recs)))) <= bytes_max:
        return recs, []
    size = 0
    for i, r in enumerate(recs):
        size += values[i] + len(r[8] or b"")
        if size > bytes_max and i > 0:
            return recs[:i], recs[i:]
    return recs, []


async def close_quietly(reader: LogReader) -> None:
    try:
        await reader.close()
    except BooklineError as exc:
        log.warning("closing a reader of %s: %s", reader.stream, exc)


T = TypeVar("T")
# Idle readers by (stream, the sequence id their next page starts at), oldest first.
# With each: when it was given back, and records it read that no page took yet (the
# next page's first ones; record sets: always none).
_Pool = collections.OrderedDict[tuple[str, int], tuple["LogReader", float, list[ReadRecord]]]


def _key(name: str, start: StartPosition) -> tuple[str, int] | None:
    """Where a kept reader is found again: only reads from a sequence id."""
    return (name, start.value) if start.kind.value == "sequence" else None


class ReaderPool:
    """Private readers for range reads and catch-up, kept between pages: the reader a
    page ended with is found again by ``(stream, next sequence id)``."""

    def __init__(self, ns: Namespace, config: ReadConfig, metrics: ReadMetrics) -> None:
        self.ns = ns
        self.cfg = config
        self.metrics = metrics
        self._idle: _Pool = collections.OrderedDict()
        # Readers of record sets (read_sets) are kept apart: one that handed out whole
        # sets is never left mid-set, which a records reader may be.
        self._idle_sets: _Pool = collections.OrderedDict()
        self.busy = 0

    async def read(
        self,
        name: str,
        start: StartPosition,
        records_max: int,
        wait_s: float,
        *,
        before_open: Callable[[], Awaitable[None]] | None = None,
        grace_s: float = AT_END_GRACE_S,
        bytes_max: int | None = None,
    ) -> list[ReadRecord]:
        """Up to ``records_max`` records from ``start`` (within about ``bytes_max`` of
        values and keys, at least one), by the reader a previous page ended at when there
        is one: waits up to ``wait_s`` for a record, and answers none only at the
        stream's end (see the module), after ``grace_s`` there. ``before_open`` runs (and
        may raise) only when a new reader has to be opened (a check that one kept between
        pages needs not)."""
        key = _key(name, start)

        async def use(reader: LogReader, wait: float, held: list[ReadRecord]) -> list[ReadRecord]:
            if not held:
                new = await reader.read_many(records_max, timeout_s=wait)
            else:  # what a page cut short left, then only what is read ahead
                new = await reader.read_many(records_max - len(held), timeout_s=0.0)
            self._count(new)
            return held + new if held else new

        reader, recs = await self._borrow(
            self._idle, key, name, start, use, wait_s, before_open=before_open, grace_s=grace_s
        )
        page, rest = within_bytes(recs, bytes_max) if bytes_max is not None else (recs, [])
        # The next page starts after this one's last offset; ``rest`` from there on.
        after = (name, page[-1].sequence_id + 1) if page else key
        await self._give_back(self._idle, after, reader, rest)
        return page

    async def read_sets(
        self,
        name: str,
        start: StartPosition,
        bytes_max: int,
        wait_s: float,
        *,
        before_open: Callable[[], Awaitable[None]] | None = None,
        grace_s: float = AT_END_GRACE_S,
    ) -> list[RawRecordSet]:
        """Whole record sets from ``start`` (about ``bytes_max`` of them), by the reader
        a previous call ended at when there is one, as :meth:`read`."""
        key = _key(name, start)
        reader, sets = await self._borrow(
            self._idle_sets, key, name, start,
            lambda r, t, _held: r.read_record_sets(bytes_max, timeout_s=t), wait_s,
            before_open=before_open, grace_s=grace_s,
        )  # fmt: skip
        if sets:
            self.metrics.count_core("private", entries=len(sets))
        after = (name, sets[-1].next_sequence_id) if sets else None
        await self._give_back(self._idle_sets, after or key, reader)
        return sets

    async def _borrow(  # noqa: PLR0917 - private, two call sites
        self,
        pool: _Pool,
        key: tuple[str, int] | None,
        name: str,
        start: StartPosition,
        use: Callable[[LogReader, float, list[ReadRecord]], Awaitable[list[T]]],
        wait_s: float,
        *,
        before_open: Callable[[], Awaitable[None]] | None = None,
        grace_s: float = AT_END_GRACE_S,
    ) -> tuple[LogReader, list[T]]:
        """``use`` the reader kept in ``pool`` under ``key``, else a new one (within
        ``private_readers_max``: the oldest idle one is closed first, 429 when every
        one is busy), waiting ``wait_s`` and then until it settles; a reader whose
        ``use`` failed is closed. ``use`` gets the records the kept reader holds."""
        entry = pool.pop(key, None) if key is not None else None
        if entry is None and self._count_all() >= self.cfg.private_readers_max:
            await self._close_oldest()
            if self.busy >= self.cfg.private_readers_max:
                raise TooManyRequestsError("every private reader of this proxy is busy")
        self.busy += 1
        try:
            if entry is None and before_open is not None:
                await before_open()
            reader = (
                entry[0]
                if entry is not None
                else await self.ns.open_reader(
                    name, start, skip_truncated=start.kind.value == "earliest"
                )
            )
            held = entry[2] if entry is not None else []
            try:
                got = await use(reader, wait_s, held)
                if not got:  # nothing yet: empty only at the end (settle raises else)
                    await reader.settle(self.cfg.range_read_timeout_ms / 1000)
                    got = await use(reader, max(0.0, grace_s - wait_s), [])
            except BaseException:
                await close_quietly(reader)
                raise
        finally:
            self.busy -= 1
        return reader, got

    async def _give_back(
        self,
        pool: _Pool,
        key: tuple[str, int] | None,
        reader: LogReader,
        held: list[ReadRecord] | None = None,
    ) -> None:
        """Keep ``reader`` (and the records it ``held`` for the next page) for the page
        that starts at ``key``; closed when there is no such key (a read not from a
        sequence id that returned nothing)."""
        if key is None:
            await close_quietly(reader)
            return
        old = pool.pop(key, None)
        pool[key] = (reader, time.monotonic(), held or [])
        if old is not None:
            asyncio.get_running_loop().create_task(close_quietly(old[0]))
        self.metrics.set_private_readers(len(self._idle) + len(self._idle_sets))

    def _count_all(self) -> int:
        return self.busy + len(self._idle) + len(self._idle_sets)

    def _count(self, recs: list[ReadRecord]) -> None:
        if not recs:
            return
        # A ReadRecord is a tuple: [1] segment seqno, [2] entry id (no DLSN built).
        entries = len({(r[1], r[2]) for r in recs})
        self.metrics.count_core("private", records=len(recs), entries=entries)

    async def _close_oldest(self) -> None:
        pool = self._idle if self._idle or not self._idle_sets else self._idle_sets
        if pool:
            _key, (reader, _t, _held) = pool.popitem(last=False)
            await close_quietly(reader)
            self.metrics.set_private_readers(len(self._idle) + len(self._idle_sets))

    async def reap(self) -> None:
        cutoff = time.monotonic() - self.cfg.private_reader_idle_ms / 1000
        for pool in (self._idle, self._idle_sets):
            for key, (reader, t, _held) in list(pool.items()):
                if t < cutoff:
                    del pool[key]
                    await close_quietly(reader)
        self.metrics.set_private_readers(len(self._idle) + len(self._idle_sets))

    async def close(self) -> None:
        while self._idle or self._idle_sets:
            await self._close_oldest()
