"""The core library against real ZooKeeper and three real bookie processes.

Each test gets its own namespace on the session's shared cluster (``bookie_cluster``
in conftest). Randomized tests print their seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
from collections.abc import AsyncIterator

import pytest

from bookline import (
    DLSN,
    LogRecord,
    Namespace,
    NamespaceConfig,
    StartPosition,
    StreamInfo,
    StreamOptions,
)
from foundation.errors import (
    ConnectionLostError,
    EndOfStreamError,
    LockOwnedError,
    NoLedgerError,
    TruncatedError,
    WriterFailedError,
)
from tests.cluster_support import bytes_on_disk
from tests.conftest import BookieCluster
from tests.values import value, values
from tests.waiting import time_scale, wait_for

pytestmark = pytest.mark.integration

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)


def config() -> NamespaceConfig:
    """CONFIG with its session, add and read timeouts scaled for the machine now: a
    live bookie or client must not be taken for dead because a hog held the cores (a
    1,000,000-record read-back under load 15 had a read time out on all three replicas)."""
    scale = time_scale()
    return dataclasses.replace(
        CONFIG,
        session_timeout_ms=int(CONFIG.session_timeout_ms * scale),
        ledger=dataclasses.replace(
            CONFIG.ledger,
            add_timeout_ms=int(CONFIG.ledger.add_timeout_ms * scale),
            read_timeout_ms=int(CONFIG.ledger.read_timeout_ms * scale),
        ),
    )


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"t{os.getpid()}-{next(_names)}", config()
    )
    try:
        yield n
    finally:
        await n.close()


def payload(i: int, size: int = 100) -> bytes:
    head = i.to_bytes(8, "big")
    return head + bytes((i + k) & 0xFF for k in range(size - 8))


async def read_n(ns: Namespace, name: str, n: int, start: object = "earliest") -> list[bytes]:
    reader = await ns.open_reader(name, start)  # type: ignore[arg-type]
    out: list[bytes] = []
    try:
        while len(out) < n:
            batch = await reader.read_many(10_000, timeout_s=20)
            assert batch, f"no record within 20 s after {len(out)} of {n}"
            out.extend(values(batch))
    finally:
        await reader.close()
    return out


async def test_write_read_info_and_reopen(ns: Namespace) -> None:
    await ns.create_stream("s")
    assert await ns.exists("s")
    assert await ns.list_streams() == ["s"]
    w = await ns.open_writer("s", "writer-a")
    first = await w.write(LogRecord(b"one", key=b"k", headers={"h": b"v"}))
    dlsns = await w.write_many([LogRecord(b"two"), LogRecord(b"three")])
    assert first < dlsns[0] < dlsns[1]

    # The in-progress segment's counters are as of the LAC the bookies know, which the
    # next entry (here: the idle control record, ~2 ms later) brings along.
    async def counted() -> StreamInfo | None:
        info = await ns.stream_info("s")
        return info if info.record_count == 3 else None

    info = await wait_for(counted, "3 records counted", interval_s=0.01)
    assert info.first_dlsn == first
    assert info.next_sequence_id == 3
    await w.close()
    info = await ns.stream_info("s")
    assert info.segments[0].state == "sealed"
    assert info.segments[0].record_count == 3
    w2 = await ns.open_writer("s", "writer-b")
    assert w2.segment_seqno == 2  # a new owner starts a new segment
    d4 = await w2.write(LogRecord(b"four"))
    assert d4.segment_seqno == 2
    await w2.close()
    r = await ns.open_reader("s")
    recs = [await r.read_next(5) for _ in range(4)]
    await r.close()
    assert [x.payload for x in recs if x] == [b"one", b"two", b"three", b"four"]
    assert [x.sequence_id for x in recs if x] == [0, 1, 2, 3]
    assert recs[0] is not None
    assert recs[0].key == b"k"
    assert recs[0].headers == [("h", b"v")]
    records = await ns.read_entries("s", 1, 0, info.segments[0].last_entry_id)
    assert [x.payload for x in records] == [b"one", b"two", b"three"]
    await ns.delete_stream("s")
    assert not await ns.exists("s")


async def test_racing_writers_one_wins_other_names_owner(
    ns: Namespace, bookie_cluster: BookieCluster
) -> None:
    await ns.create_stream("race")
    other = await Namespace.open(bookie_cluster.zk, bookie_cluster.root, ns.name, config())
    try:
        results = await asyncio.gather(
            ns.open_writer("race", "alpha"), other.open_writer("race", "beta"),
            return_exceptions=True,
        )  # fmt: skip
        winners = [r for r in results if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1 and len(losers) == 1, results
        err = losers[0]
        assert isinstance(err, LockOwnedError)
        winner = winners[0]
        assert err.owner == winner.identity
        assert winner.identity in str(err)
        await winner.write(LogRecord(b"only the winner writes"))
        await winner.close()
    finally:
        await other.close()


async def test_fenced_writer_fails_fast(ns: Namespace) -> None:
    await ns.create_stream("fence")
    w = await ns.open_writer("fence")
    await w.write(LogRecord(b"before"))
    seg = (await ns.segments("fence"))[-1]
    # Another client recovers the ledger: the bookies fence the writer out.
    await ns.context.ledgers.open_ledger(seg.ledger_id, CONFIG.password_bytes, recover=True)
    with pytest.raises(WriterFailedError):
        await w.write(LogRecord(b"after"))
    with pytest.raises(WriterFailedError) as info:
        w.write_nowait(LogRecord(b"later"))
    assert info.value.__cause__ is not None
    await w.close()


async def test_positioning_by_dlsn_txid_sequence_timestamp(ns: Namespace) -> None:
    await ns.create_stream("pos", StreamOptions(segment_rollover_bytes=6_000))
    clock = [1_000_000]
    ns.context.clock_ms = lambda: clock[0]
    w = await ns.open_writer("pos")
    dlsns: list[DLSN] = []
    for batch in range(40):  # 40 batches x 25 records, txid 10*i, ts 1_000_000 + 7*batch
        clock[0] = 1_000_000 + 7 * batch
        recs = [LogRecord(payload(i), txid=10 * i) for i in range(batch * 25, batch * 25 + 25)]
        dlsns += await w.write_many(recs)
    assert len({d.segment_seqno for d in dlsns}) >= 3
    seed = random.randrange(2**32)
    print(f"positioning seed={seed}")
    rng = random.Random(seed)

    async def first_at(start: StartPosition) -> int:
        r = await ns.open_reader("pos", start)
        try:
            rec = await r.read_next(10)
            assert rec is not None
            return int.from_bytes(value(rec)[:8], "big")
        finally:
            await r.close()

    for i in rng.sample(range(1000), 8):
        assert await first_at(StartPosition.dlsn(dlsns[i])) == i
        assert await first_at(StartPosition.sequence(i)) == i
        assert await first_at(StartPosition.txid(10 * i)) == i
        assert await first_at(StartPosition.txid(10 * i - 5)) == i  # between txids
        batch = i // 25
        assert await first_at(StartPosition.timestamp(1_000_000 + 7 * batch)) == batch * 25
        assert await first_at(StartPosition.timestamp(1_000_000 + 7 * batch - 3)) == batch * 25
    assert await first_at(StartPosition.earliest()) == 0
    r = await ns.open_reader("pos", "latest")
    tail = await w.write(LogRecord(b"new", txid=10**6))
    rec = await r.read_next(10)
    assert rec is not None
    assert rec.dlsn == tail
    assert rec.payload == b"new"
    await r.close()
    await w.close()


async def test_a_time_several_entries_carry_finds_the_first_of_them(ns: Namespace) -> None:
    """Entries written one by one within the same millisecond: a seek to that time
    starts at the first of them (it started at the last: records skipped)."""
    await ns.create_stream("same-ms")
    clock = [2_000_000]
    ns.context.clock_ms = lambda: clock[0]
    w = await ns.open_writer("same-ms")
    stamps = [2_000_000, 2_000_005, 2_000_005, 2_000_005, 2_000_005, 2_000_009]
    try:
        for i, ms in enumerate(stamps):  # one entry per record
            clock[0] = ms
            await w.write(LogRecord(payload(i), txid=i))
    finally:
        await w.close()
    for ms, first in [(2_000_005, 1), (2_000_003, 1), (2_000_006, 5), (2_000_000, 0)]:
        r = await ns.open_reader("same-ms", StartPosition.timestamp(ms))
        try:
            rec = await r.read_next(10)
            assert rec is not None
            assert (ms, rec.sequence_id) == (ms, first)
        finally:
            await r.close()


async def test_segment_rolls_by_age_on_the_injected_clock(ns: Namespace) -> None:
    """A segment's age is read from the namespace's clock: no waiting for real time."""
    await ns.create_stream("age", StreamOptions(segment_rollover_ms=60_000))
    clock = [5_000_000]
    ns.context.clock_ms = lambda: clock[0]
    w = await ns.open_writer("age")
    first = await w.write(LogRecord(b"a"))
    clock[0] += 59_999
    assert (await w.write(LogRecord(b"b"))).segment_seqno == first.segment_seqno
    clock[0] += 1
    rolled = await w.write(LogRecord(b"c"))
    assert rolled.segment_seqno == first.segment_seqno + 1
    await w.close()
    segments = await ns.segments("age")
    assert [(s.state, s.record_count) for s in segments] == [("sealed", 2), ("sealed", 1)]
    assert segments[1].ctime_ms == 5_060_000


async def test_tailing_reader_across_segment_rolls(ns: Namespace) -> None:
    await ns.create_stream("tail", StreamOptions(segment_rollover_bytes=20_000))
    w = await ns.open_writer("tail")
    await w.write(LogRecord(b"old"))
    reader = await ns.open_reader("tail", "latest")
    n = 3000
    got: list[bytes] = []
    segments: set[int] = set()

    async def consume() -> None:
        while len(got) < n:
            rec = await reader.read_next(20)
            assert rec is not None, f"tail stalled after {len(got)}"
            if rec.payload == b"old":
                # acknowledged but not yet past the bookies' LAC when "latest" was
                # resolved: latest means "after what readers can see"
                assert not got
                continue
            got.append(value(rec))
            segments.add(rec.dlsn.segment_seqno)

    task = asyncio.create_task(consume())
    for start in range(0, n, 100):
        if start % 500 == 0:
            await asyncio.sleep(0.05)  # let the reader catch up and tail for real
        await w.write_many([LogRecord(payload(i)) for i in range(start, start + 100)])
    await asyncio.wait_for(task, 60)
    await reader.close()
    await w.close()
    assert got == [payload(i) for i in range(n)]
    assert len(segments) >= 4, segments  # >= 3 rolls seen while tailing


async def _bulk(ns: Namespace, n: int) -> None:
    await ns.create_stream("bulk")
    w = await ns.open_writer("bulk")
    batch = 10_000
    last = None
    for start in range(0, n, batch):
        dlsns = await w.write_many([LogRecord(payload(i)) for i in range(start, start + batch)])
        assert last is None or dlsns[0] > last
        last = dlsns[-1]
    await w.close()
    got = await read_n(ns, "bulk", n)
    assert len(got) == n
    for i in range(0, n, 1):
        if got[i] != payload(i):
            raise AssertionError(f"record {i} differs or is out of order")
    info = await ns.stream_info("bulk")
    assert info.record_count == n
    assert info.size_bytes == 100 * n


async def test_bulk_1m_write_many_read_back(ns: Namespace) -> None:
    """1,000,000 records of 100 B (about 20 s on the 2-core dev machine)."""
    await _bulk(ns, 1_000_000)


def _ledger_bytes(cluster: BookieCluster) -> int:
    """Bytes in the bookies' entry logs now."""
    files = (p for _proc, _port, d in cluster.bookies for p in (d / "ledgers").rglob("*"))
    return bytes_on_disk(p for p in files if p.is_file())


async def _fill(ns: Namespace, name: str, n: int, opts: StreamOptions) -> tuple[object, list[DLSN]]:
    await ns.create_stream(name, opts)
    w = await ns.open_writer(name)
    dlsns: list[DLSN] = []
    for start in range(0, n, 5_000):
        dlsns += await w.write_many([LogRecord(payload(i)) for i in range(start, start + 5_000)])
    return w, dlsns


async def test_truncation_and_retention_delete_ledgers(ns: Namespace) -> None:
    opts = StreamOptions(segment_rollover_bytes=400_000, retention_bytes=450_000)
    w, dlsns = await _fill(ns, "ret", 40_000, opts)
    segs = await ns.segments("ret")
    assert len(segs) >= 6
    # explicit truncation: everything before record 10,000
    assert await w.truncate(dlsns[10_000])  # type: ignore[attr-defined]
    with pytest.raises(TruncatedError):
        await ns.open_reader("ret", StartPosition.sequence(0))
    r = await ns.open_reader("ret", StartPosition.sequence(0), skip_truncated=True)
    rec = await r.read_next(10)
    await r.close()
    assert rec is not None
    assert rec.sequence_id == 10_000
    assert rec.payload == payload(10_000)
    # retention by size: keeps about one sealed segment
    assert await ns.apply_retention("ret")
    left = await ns.segments("ret")
    gone = [s for s in segs if s.seqno not in {x.seqno for x in left if not x.truncated}]
    assert len(gone) >= 4
    for seg in gone:
        with pytest.raises(NoLedgerError):
            await ns.context.ledgers.store.read(seg.ledger_id)
    info = await ns.stream_info("ret")
    assert info.first_sequence_id > 10_000
    assert info.next_sequence_id == 40_000
    got = await read_n(ns, "ret", info.record_count)
    assert got[-1] == payload(39_999)
    assert len(got) == 40_000 - info.first_sequence_id
    await w.close()  # type: ignore[attr-defined]


async def test_bookie_disk_usage_drops_after_retention(
    ns: Namespace, bookie_cluster: BookieCluster
) -> None:
    opts = StreamOptions(segment_rollover_bytes=1_000_000, retention_bytes=1_000_000)
    w, _dlsns = await _fill(ns, "gc", 80_000, opts)
    # Checkpoints (every 1 s, jittered) move the entries into (rolled) entry logs. A settle
    # time, not a wait on a condition: no signal outside the bookie says a checkpoint
    # covered them, and the ledger directories also shrink as GC reclaims older tests'
    # ledgers (waiting for them to grow by what was written can hang).
    await asyncio.sleep(2.5)
    before = _ledger_bytes(bookie_cluster)
    segs = await ns.segments("gc")
    assert await ns.apply_retention("gc")
    left = {s.seqno for s in await ns.segments("gc") if not s.truncated}
    deleted = sum(s.size_bytes for s in segs if s.seqno not in left) * 3  # 3 replicas
    await wait_for(
        lambda: before - _ledger_bytes(bookie_cluster) >= deleted // 2,
        lambda: f"GC to reclaim {deleted // 2} of {before} bytes",
        timeout_s=30,
        interval_s=0.5,
    )
    after = _ledger_bytes(bookie_cluster)
    print(f"bookie ledger bytes: before {before}, after GC {after}, deleted {deleted}")
    await w.close()  # type: ignore[attr-defined]
    assert before - after >= deleted // 2, f"GC reclaimed {before - after} of {deleted} bytes"


async def test_subscriptions_are_monotonic(ns: Namespace) -> None:
    await ns.create_stream("sub")
    assert await ns.committed("sub", "g1") is None
    assert await ns.commit("sub", "g1", DLSN(1, 5, 0))
    assert not await ns.commit("sub", "g1", DLSN(1, 4, 9))
    assert await ns.commit("sub", "g1", DLSN(2, 0, 0))
    assert await ns.committed("sub", "g1") == DLSN(2, 0, 0)
    assert await ns.list_subscribers("sub") == ["g1"]


async def test_end_of_stream(ns: Namespace) -> None:
    await ns.create_stream("eos")
    w = await ns.open_writer("eos")
    await w.write_many([LogRecord(b"a"), LogRecord(b"b")])
    await w.mark_end_of_stream()
    with pytest.raises(EndOfStreamError):
        await w.write(LogRecord(b"c"))
    await w.close()
    r = await ns.open_reader("eos")
    assert [(await r.read_next(5)).payload for _ in range(2)] == [b"a", b"b"]  # type: ignore[union-attr]
    with pytest.raises(EndOfStreamError):
        await r.read_next(5)
    await r.close()
    with pytest.raises(EndOfStreamError):
        await ns.open_writer("eos")


async def test_end_of_stream_survives_a_writer_that_did_not_seal(
    ns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker reached the bookies but the writer died before sealing the segment:
    the next writer recovers the segment, finds the marker, seals and refuses."""
    await ns.create_stream("eos2")
    w = await ns.open_writer("eos2")
    await w.write(LogRecord(b"a"))

    async def crash(_next: object) -> None:
        raise ConnectionLostError("writer died before sealing")

    monkeypatch.setattr(w._segments, "seal", crash)
    with pytest.raises(ConnectionLostError):
        await w.mark_end_of_stream()
    with pytest.raises(EndOfStreamError):
        await w.write(LogRecord(b"b"))
    await w.close()  # releases the lock only: the marker's segment stays unsealed
    assert (await ns.segments("eos2"))[-1].state == "in_progress"
    with pytest.raises(EndOfStreamError):
        await ns.open_writer("eos2")
    segments = await ns.segments("eos2")
    assert [(s.state, s.record_count) for s in segments] == [("sealed", 1)]
    r = await ns.open_reader("eos2")
    assert (await r.read_next(5)).payload == b"a"  # type: ignore[union-attr]
    with pytest.raises(EndOfStreamError):
        await r.read_next(5)
    await r.close()


def test_sync_facade_from_threads(bookie_cluster: BookieCluster) -> None:
    import concurrent.futures

    from streams.sync import SyncNamespace

    with SyncNamespace.open(bookie_cluster.zk, bookie_cluster.root, "sync", CONFIG) as sns:
        sns.create_stream("s")
        with sns.open_writer("s") as w:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                futs = [pool.submit(w.write, LogRecord(b"t%d" % i)) for i in range(40)]
                dlsns = [f.result(30) for f in futs]
            assert len(set(dlsns)) == 40
            last = w.write_nowait(LogRecord(b"last")).result(30)
            assert last > max(dlsns)
        with sns.open_reader("s") as r:
            got = r.read_many(100, timeout_s=10)
            while len(got) < 41:
                got += r.read_many(100, timeout_s=10)
        assert sorted(values(got[:40])) == sorted(b"t%d" % i for i in range(40))
        assert got[-1].payload == b"last"
        assert sns.stream_info("s").record_count == 41
