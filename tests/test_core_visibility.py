"""When a tailing reader sees a record (issue 26): as soon as it is acknowledged -- not
when a later entry or a timer happens to tell the bookies -- and never before it is
durable on the ack quorum.

Adds are held back in this (the writer's) process: a held send never reaches its
bookie until released, as a bookie whose journal stalls never answers. Through real
bookie processes (E=Qw=3, Qa=2)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from bookline import LogRecord, Namespace, NamespaceConfig
from ledger.inflight import PendingAdd
from ledger.reader import LedgerReader
from ledger.writer import LedgerWriter
from serving.read.config import ReadConfig
from serving.read.feeds import FeedRegistry
from serving.read.follow import follow
from serving.read.pages import Pages
from serving.read.readers import ReaderPool
from streams.dlsn import DLSN, StartPosition
from streams.reader import LogReader
from streams.writer.segments import SegmentState
from streams.writer.writer import LogWriter
from tests.conftest import BookieCluster
from tests.values import values
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

_names = itertools.count()
# No control record while these tests run: a reader must learn the LAC without one.
CONFIG = NamespaceConfig(
    session_timeout_ms=4000, long_poll_timeout_ms=1000, control_interval_ms=600_000
)


class HeldAdds:
    """Adds that ``hold(entry_id, bookie)`` selects are not sent until released."""

    def __init__(self) -> None:
        self.hold: Callable[[int, str], bool] = lambda _e, _b: False
        self.held: list[tuple[LedgerWriter, PendingAdd, int, str]] = []
        self._send = LedgerWriter._send

    def patched(self) -> Callable[..., None]:
        send = self._send

        def held_send(
            writer: LedgerWriter, pa: PendingAdd, pos: int, bookie: str, *args: Any
        ) -> None:
            if self.hold(pa.entry_id, bookie):
                self.held.append((writer, pa, pos, bookie))
                return
            send(writer, pa, pos, bookie, *args)

        return held_send

    def entries(self) -> set[int]:
        return {pa.entry_id for _w, pa, _p, _b in self.held}

    def release(self, entry_id: int) -> None:
        """Send the held adds of ``entry_id`` now (later entries stay held)."""
        later = [h for h in self.held if h[1].entry_id != entry_id]
        now = [h for h in self.held if h[1].entry_id == entry_id]
        self.held = later
        for writer, pa, pos, bookie in now:
            self._send(writer, pa, pos, bookie)

    def release_all(self) -> None:
        self.hold = lambda _e, _b: False
        for entry_id in sorted(self.entries()):
            self.release(entry_id)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldAdds]:
    h = HeldAdds()
    monkeypatch.setattr(LedgerWriter, "_send", h.patched())
    try:
        yield h
    finally:
        h.release_all()  # a writer closing waits for its adds


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"vis{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


def _segment(w: LogWriter) -> SegmentState:
    seg = w._segments.current  # the layer underneath, for the test's holds
    assert seg is not None
    return seg


def _ledger(w: LogWriter) -> LedgerWriter:
    return _segment(w).ledger


async def _next(reader: LogReader, what: str) -> list[bytes]:
    """The records the reader hands out next (waiting for the first)."""
    got = await wait_for(lambda: reader.read_many(100, timeout_s=0.5), what)
    return values(got)


async def test_a_record_acknowledged_while_a_later_entry_is_in_flight_is_visible(
    ns: Namespace, held: HeldAdds
) -> None:
    """Entry A is acknowledged while entry B (sent before A's acknowledgement) is
    still in flight. B carries an older LAC, and no entry comes after it; before the
    fix the bookies learnt A's LAC only from B's acknowledgement (the pipe empty), so
    a tailing reader waited for B -- here forever."""
    name = f"s{next(_names)}"
    await ns.create_stream(name)
    w = await ns.open_writer(name)
    reader = await ns.open_reader(name, "earliest")
    try:
        await w.write(LogRecord(b"first"))
        assert await _next(reader, "the first record") == [b"first"]
        ledger = _ledger(w)
        a_entry = ledger.last_add_confirmed + 1
        held.hold = lambda entry_id, _bookie: entry_id >= a_entry
        a = w.write_nowait(LogRecord(b"A"))
        await wait_for(lambda: a_entry in held.entries(), "entry A submitted")
        b = w.write_nowait(LogRecord(b"B"))
        await wait_for(lambda: a_entry + 1 in held.entries(), "entry B submitted")
        held.release(a_entry)
        await asyncio.wait_for(a, 30)
        assert not b.done()  # B is still in flight: nothing after A told the bookies
        assert await _next(reader, "record A at the tailing reader") == [b"A"]
        held.release_all()
        await asyncio.wait_for(b, 30)
        assert await _next(reader, "record B") == [b"B"]
    finally:
        held.release_all()
        await reader.close()
        await w.close()


async def test_a_record_durable_on_one_bookie_only_is_never_visible(
    ns: Namespace, held: HeldAdds
) -> None:
    """Durability before visibility: a record that reached one bookie of three (Qa=2)
    is not acknowledged, and no reader sees it -- not even one whose long polls ask the
    bookie that holds it -- while explicit LACs keep flowing for the records before
    it. Once the quorum has it, the reader sees it."""
    name = f"s{next(_names)}"
    await ns.create_stream(name)
    w = await ns.open_writer(name)
    reader = await ns.open_reader(name, "earliest")
    try:
        await w.write(LogRecord(b"first"))
        assert await _next(reader, "the first record") == [b"first"]
        ledger = _ledger(w)
        c_entry = ledger.last_add_confirmed + 1
        only = ledger.metadata.replicas(c_entry)[0]  # asked first by a fresh reader
        held.hold = lambda entry_id, bookie: entry_id == c_entry and bookie != only
        c = w.write_nowait(LogRecord(b"C"))
        await wait_for(lambda: len(held.held) == 2, "C held from two bookies")
        pending = held.held[0][1]
        await wait_for(lambda: pending.acked, "C durable on the one bookie it reached")
        ledger.push_lac()  # an explicit LAC now says all the writer knows
        await wait_for(lambda: ledger.lac_told >= c_entry - 1, "the LAC told to the bookies")
        assert not c.done()
        # A whole long poll of the reader's (not a speed bound: the window in which a
        # record past the quorum would have been handed out) brings nothing ...
        assert await reader.read_many(10, timeout_s=CONFIG.long_poll_timeout_ms / 1000) == []
        # ... and the bookie holding C answers a long poll past the LAC with "not yet".
        segment = await ns.context.open_segment_reader(_segment(w).meta)
        assert await segment.wait_lac(c_entry - 1, 200) == c_entry - 1
        assert not c.done()
        held.release_all()
        await asyncio.wait_for(c, 30)
        assert await _next(reader, "record C") == [b"C"]
    finally:
        held.release_all()
        await reader.close()
        await w.close()


class HeldLacPushes:
    """The writer's explicit LAC pushes held back until a reader long-polls for the
    LAC: until then every bookie's LAC is one entry behind the last acknowledged one,
    as it is for a moment after each acknowledgement (a bookie learns the LAC from the
    next entry or the push)."""

    def __init__(self) -> None:
        self.holding = True
        self._ledgers: list[LedgerWriter] = []
        self._push = LedgerWriter.push_lac
        self._wait_lac = LedgerReader.wait_lac

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def held_push(ledger: LedgerWriter) -> None:
            self._ledgers.append(ledger)
            if not self.holding:
                self._push(ledger)

        async def releasing_wait(reader: LedgerReader, *args: Any, **kwargs: Any) -> int:
            self.release()
            return await self._wait_lac(reader, *args, **kwargs)

        monkeypatch.setattr(LedgerWriter, "push_lac", held_push)
        monkeypatch.setattr(LedgerReader, "wait_lac", releasing_wait)

    def release(self) -> None:
        if self.holding:
            self.holding = False
            for ledger in self._ledgers:
                self._push(ledger)


@pytest.fixture
def lagging(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldLacPushes]:
    pushes = HeldLacPushes()
    pushes.patch(monkeypatch)
    try:
        yield pushes
    finally:
        pushes.release()


async def _acknowledged_while_the_lac_lags(ns: Namespace) -> tuple[str, LogWriter, DLSN]:
    """A stream whose second record is acknowledged while every bookie's LAC is still
    at the first; its writer and the acknowledged record's DLSN."""
    name = f"s{next(_names)}"
    await ns.create_stream(name)
    w = await ns.open_writer(name)
    await w.write(LogRecord(b"old"))
    acked = await w.write(LogRecord(b"acknowledged"))
    ledger = _ledger(w)
    assert ledger.lac_told < ledger.last_add_confirmed == acked.entry_id  # the LAC lags
    return name, w, acked


async def test_a_reader_opened_at_latest_after_an_ack_never_sees_that_record(
    ns: Namespace, lagging: HeldLacPushes
) -> None:
    """Latest is after every acknowledged record (Kafka's high watermark). Before the
    fix the reader started at the bookies' LAC and handed the acknowledged record out."""
    name, w, _acked = await _acknowledged_while_the_lac_lags(ns)
    reader = await ns.open_reader(name, "latest")
    try:
        lagging.release()
        await w.write(LogRecord(b"after"))
        assert await _next(reader, "the record written after the reader opened") == [b"after"]
    finally:
        await reader.close()
        await w.close()


async def _end_offset(ns: Namespace, name: str, acked: DLSN) -> bool:
    return await ns.end_offset(name) == 2


async def _info_next_offset(ns: Namespace, name: str, acked: DLSN) -> bool:
    return (await ns.stream_info(name)).next_sequence_id == 2


async def _seek_past_the_end(ns: Namespace, name: str, acked: DLSN) -> bool:
    return await ns.resolve(name, StartPosition.sequence(2)) > acked


@pytest.mark.parametrize("after_ack", [_end_offset, _info_next_offset, _seek_past_the_end])
async def test_the_end_offset_and_a_seek_past_it_count_an_acknowledged_record(
    ns: Namespace,
    lagging: HeldLacPushes,
    after_ack: Callable[[Namespace, str, DLSN], Awaitable[bool]],
) -> None:
    """The end offset (Kafka's ListOffsets latest) and stream info include the
    acknowledged record; a seek to the offset after it starts after it. Before the fix
    each stopped at the lagging LAC."""
    name, w, acked = await _acknowledged_while_the_lac_lags(ns)
    try:
        assert await after_ack(ns, name, acked)
    finally:
        await w.close()


async def test_the_read_proxys_latest_is_after_an_acknowledged_record(
    ns: Namespace, lagging: HeldLacPushes
) -> None:
    """A read-proxy page (and a WebSocket tail) from latest starts after the
    acknowledged record. Before the fix it started at the lagging LAC's offset."""
    name, w, _acked = await _acknowledged_while_the_lac_lags(ns)
    try:
        async with _read_core(ns) as pages:
            assert await pages.read_page(name, StartPosition.latest(), 10, 0.0) == ([], "seq:2")
    finally:
        await w.close()


class _NoMetrics:
    """The read core's metrics, not kept (serving.read.metrics.ReadMetrics)."""

    def count_core(self, source: str, *, records: int = 0, entries: int = 0) -> None: ...
    def count_served(self, path: str, name: str, records: int) -> None: ...
    def set_feeds(self, count: int) -> None: ...
    def set_cache_bytes(self, size: int) -> None: ...
    def set_private_readers(self, count: int) -> None: ...
    def add_subscribers(self, delta: int) -> None: ...


@contextlib.asynccontextmanager
async def _read_core(ns: Namespace) -> AsyncIterator[Pages]:
    """The read proxy's read core on ``ns`` (its WebSocket tails follow its feeds)."""
    config, metrics = ReadConfig(), _NoMetrics()
    feeds = FeedRegistry(ns, config, metrics)
    feeds.start()
    pool = ReaderPool(ns, config, metrics)
    try:
        yield Pages(ns, feeds, pool, config, metrics)
    finally:
        await feeds.close()
        await pool.close()


async def _batch_with_records(tail: AsyncGenerator[Any, None], what: str) -> list[bytes]:
    """The payloads of the tail's next batch that has records (empty batches come every
    wait slice), within the waiting helpers' deadline."""

    async def next_records() -> list[bytes]:
        async for batch in tail:
            if batch.items:
                return [item.record.payload for item in batch.items]
        raise AssertionError("the tail ended")

    return await wait_for(lambda: asyncio.wait_for(next_records(), 60), what)


async def test_the_read_proxys_tail_sees_a_record_acknowledged_while_a_later_entry_is_in_flight(
    ns: Namespace, held: HeldAdds
) -> None:
    """As above, through the read core a WebSocket tail (and a read-proxy group
    consumer) follows: its shared feed hands record A out while B is in flight."""
    name = f"s{next(_names)}"
    await ns.create_stream(name)
    w = await ns.open_writer(name)
    try:
        await w.write(LogRecord(b"first"))
        async with _read_core(ns) as pages:
            tail = follow(pages, name, StartPosition.earliest(), 100, wait_slice_s=0.2)
            async with contextlib.aclosing(tail):
                assert await _batch_with_records(tail, "the first record") == [b"first"]
                a_entry = _ledger(w).last_add_confirmed + 1
                held.hold = lambda entry_id, _bookie: entry_id >= a_entry
                a = w.write_nowait(LogRecord(b"A"))
                await wait_for(lambda: a_entry in held.entries(), "entry A submitted")
                b = w.write_nowait(LogRecord(b"B"))
                await wait_for(lambda: a_entry + 1 in held.entries(), "entry B submitted")
                held.release(a_entry)
                await asyncio.wait_for(a, 30)
                assert not b.done()
                assert await _batch_with_records(tail, "record A at the tail") == [b"A"]
                held.release_all()
                await asyncio.wait_for(b, 30)
                assert await _batch_with_records(tail, "record B at the tail") == [b"B"]
    finally:
        held.release_all()
        await w.close()
