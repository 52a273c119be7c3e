"""The bookie storage engine (journal, memtable, entry logs, index) in-process, on tmp dirs.

A crash is simulated with :meth:`BookieStorage.abort`: threads stop, nothing is
checkpointed and nothing queued is written, which is what ``kill -9`` leaves on disk for
acknowledged adds (their journal fsync already returned).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie.config import BookieConfig
from bookie.storage import journal
from bookie.storage.api import LAST_ENTRY, NO_ENTRY_ID
from bookie.storage.engine import BookieStorage
from foundation.errors import (
    BadRequestError,
    ClosedError,
    FencedError,
    IOFailureError,
    NoEntryError,
    NoLedgerError,
    ReadOnlyError,
    TooManyRequestsError,
    UnauthorizedError,
)
from tests.waiting import wait_for

KEY = b"master-key"


def make_config(tmp_path: Path, **overrides: object) -> BookieConfig:
    base = BookieConfig(
        journal_dir=str(tmp_path / "journal"),
        ledgers_dir=str(tmp_path / "ledgers"),
        index_dir=str(tmp_path / "index"),
        journal_prealloc_bytes=64 << 10,
        memtable_flush_bytes=8 << 20,
        memtable_bytes_max=16 << 20,
        # Tests checkpoint explicitly; background work would make them racy to reason about.
        checkpoint_interval_ms=600_000,
        gc_interval_ms=600_000,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def payload(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    head = f"{ledger_id}:{entry_id}:".encode()
    return (head * (size // len(head) + 1))[:size]


@pytest.fixture
def config(tmp_path: Path) -> BookieConfig:
    return make_config(tmp_path)


@pytest.fixture
async def storage(config: BookieConfig) -> AsyncIterator[BookieStorage]:
    s = BookieStorage(config)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


async def restart(old: BookieStorage, *, crash: bool, **kwargs: object) -> BookieStorage:
    if crash:
        await old.abort()
    else:
        await old.close()
    new = BookieStorage(old.config, **kwargs)  # type: ignore[arg-type]
    await new.start()
    return new


async def parked(storage: BookieStorage, ledger_id: int) -> None:
    """Wait until a long poll of ``ledger_id`` waits in ``storage``."""

    def waiting() -> bool:
        state = storage._ledgers.get(ledger_id)
        return state is not None and bool(state.waiters)

    await wait_for(waiting, f"a long poll of ledger {ledger_id} waiting")


async def add_all(s: BookieStorage, ledger_id: int, entry_ids: range, size: int = 100) -> None:
    await asyncio.gather(
        *(s.add_entry(ledger_id, e, e - 1, KEY, payload(ledger_id, e, size)) for e in entry_ids)
    )


async def check_all(s: BookieStorage, ledger_id: int, entry_ids: range, size: int = 100) -> None:
    for e in entry_ids:
        assert await s.read_entry(ledger_id, e) == payload(ledger_id, e, size), (ledger_id, e)


def journal_files(config: BookieConfig) -> list[Path]:
    d = Path(config.journal_dir)
    return [d / journal.file_name(i) for i in journal.list_files(d)]


def dir_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())


# --- add / read / LAC -------------------------------------------------------------------


async def test_add_read_lac(storage: BookieStorage) -> None:
    await add_all(storage, 1, range(10))
    await check_all(storage, 1, range(10))
    assert await storage.read_entry(1, LAST_ENTRY) == payload(1, 9)
    assert storage.last_add_confirmed(1) == 8
    assert storage.ledgers() == [1]
    assert await storage.entries(1) == list(range(10))
    with pytest.raises(NoLedgerError):
        await storage.read_entry(2, 0)
    with pytest.raises(NoLedgerError):
        storage.last_add_confirmed(2)
    with pytest.raises(NoEntryError):
        await storage.read_entry(1, 10)
    stats = storage.stats()
    assert stats["adds"] == 10
    assert stats["journal_fsyncs"] >= 1
    assert stats["memtable_bytes"] > 1000
    assert stats["memtable_hits"] == 11


async def test_out_of_order_entries_and_lac_is_max(storage: BookieStorage) -> None:
    for e, lac in ((3, 1), (0, NO_ENTRY_ID), (2, 0), (1, 0)):
        await storage.add_entry(5, e, lac, KEY, payload(5, e))
    assert storage.last_add_confirmed(5) == 1
    assert await storage.read_entry(5, LAST_ENTRY) == payload(5, 3)
    await storage.checkpoint()
    await check_all(storage, 5, range(4))
    assert await storage.entries(5) == [0, 1, 2, 3]


async def test_long_poll_wakes_on_lac_and_times_out(storage: BookieStorage) -> None:
    await storage.add_entry(1, 0, NO_ENTRY_ID, KEY, payload(1, 0))
    poll = asyncio.create_task(storage.wait_lac(1, NO_ENTRY_ID, 30.0))
    await parked(storage, 1)
    assert not poll.done()  # LAC is still -1
    await storage.add_entry(1, 1, 0, KEY, payload(1, 1))
    result = await asyncio.wait_for(poll, 5.0)
    assert result.lac == 0
    assert (result.next_entry_id, result.next_entry) == (0, payload(1, 0))

    timed_out = await storage.wait_lac(1, 0, 0.05)
    assert timed_out.lac == 0
    assert timed_out.next_entry is None
    with pytest.raises(NoLedgerError):
        await storage.wait_lac(9, NO_ENTRY_ID, 0.01)


async def test_readable_before_and_after_checkpoint_with_read_ahead(tmp_path: Path) -> None:
    s = BookieStorage(make_config(tmp_path, read_ahead_entries=16))
    await s.start()
    try:
        await add_all(s, 1, range(200))
        await add_all(s, 2, range(50))
        await check_all(s, 1, range(200))
        await s.checkpoint()
        assert s.stats()["memtable_entries"] == 0
        await check_all(s, 1, range(200))
        await check_all(s, 2, range(50))
        stats = s.stats()
        # Sequential scan: one disk read per 17 entries, the rest from read-ahead.
        assert stats["read_cache_misses"] <= 200 // 17 + 50 // 17 + 2
        assert stats["read_cache_hits"] >= 200
        assert await s.read_entry(1, LAST_ENTRY) == payload(1, 199)
    finally:
        await s.close()


async def test_adds_continue_during_checkpoint(storage: BookieStorage) -> None:
    await add_all(storage, 1, range(500), size=1000)
    checkpoint = asyncio.create_task(storage.checkpoint())
    await add_all(storage, 1, range(500, 1000), size=1000)
    await checkpoint
    await check_all(storage, 1, range(1000), size=1000)
    await storage.checkpoint()
    await check_all(storage, 1, range(1000), size=1000)


# --- restart and crash ------------------------------------------------------------------


async def test_crash_restart_keeps_every_acknowledged_entry(config: BookieConfig) -> None:
    s = BookieStorage(config)
    await s.start()
    await add_all(s, 1, range(300))
    await add_all(s, 2, range(100))
    await s.checkpoint()  # these go to entry logs + index...
    await add_all(s, 1, range(300, 600))  # ...these only to the journal
    await add_all(s, 3, range(50))
    s = await restart(s, crash=True)
    try:
        await check_all(s, 1, range(600))
        await check_all(s, 2, range(100))
        await check_all(s, 3, range(50))
        assert s.ledgers() == [1, 2, 3]
        assert s.last_add_confirmed(1) == 598
        assert await s.read_entry(3, LAST_ENTRY) == payload(3, 49)
        # And once more, after the replay was checkpointed.
        s = await restart(s, crash=True)
        await check_all(s, 1, range(600))
        await check_all(s, 3, range(50))
    finally:
        await s.close()


async def test_clean_close_restart(config: BookieConfig) -> None:
    s = BookieStorage(config)
    await s.start()
    await add_all(s, 7, range(100))
    s = await restart(s, crash=False)
    try:
        await check_all(s, 7, range(100))
        assert s.counters.checkpoints == 0  # nothing to replay after a clean close
    finally:
        await s.close()


async def test_journal_rolls_and_old_files_are_deleted(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_file_bytes_max=32 << 10, journal_prealloc_bytes=8 << 10)
    s = BookieStorage(config)
    await s.start()
    for start in range(0, 400, 20):  # small groups so the journal rolls many times
        await add_all(s, 1, range(start, start + 20), size=500)
    assert len(journal_files(config)) > 3
    s = await restart(s, crash=True)  # replay across many files
    try:
        await check_all(s, 1, range(400), size=500)
        await s.checkpoint()
        assert len(journal_files(config)) <= 2
    finally:
        await s.close()


def _last_journal_data_end(config: BookieConfig) -> tuple[Path, list[int]]:
    directory = Path(config.journal_dir)
    last_id = journal.list_files(directory)[-1]
    path = directory / journal.file_name(last_id)
    result = journal.replay(directory, journal.JournalMark(last_id, 0))
    return path, [end for _rec, end in result.records]


@pytest.mark.parametrize("damage", ["torn", "junk"])
async def test_damaged_journal_tail(config: BookieConfig, damage: str) -> None:
    s = BookieStorage(config)
    await s.start()
    await add_all(s, 1, range(50))
    await s.abort()
    path, ends = _last_journal_data_end(config)
    assert len(ends) >= 51  # a MASTER_KEY record and 50 adds
    if damage == "torn":
        # Cut in the middle of the last record: that add was never fully on disk.
        with path.open("r+b") as f:
            f.truncate(ends[-1] - 30)
        intact = range(49)
    else:
        # Junk after the last record, as a torn multi-page write can leave behind.
        rng = random.Random(1234)
        with path.open("r+b") as f:
            f.seek(ends[-1])
            f.write(bytes(rng.getrandbits(8) for _ in range(5000)))
        intact = range(50)
    s = BookieStorage(config)
    await s.start()
    try:
        await check_all(s, 1, intact)
        if damage == "torn":
            with pytest.raises(NoEntryError):
                await s.read_entry(1, 49)
        await add_all(s, 1, range(100, 150))
        s = await restart(s, crash=True)
        await check_all(s, 1, intact)
        await check_all(s, 1, range(100, 150))
    finally:
        await s.close()


# --- fencing and access control -----------------------------------------------------------


@pytest.mark.parametrize("crash", [True, False])
async def test_fencing_and_master_key_survive_restart(config: BookieConfig, crash: bool) -> None:
    s = BookieStorage(config)
    await s.start()
    await add_all(s, 1, range(5))
    with pytest.raises(UnauthorizedError):
        await s.add_entry(1, 5, 4, b"other-key", b"x")
    with pytest.raises(UnauthorizedError):
        await s.fence(1, b"other-key")
    assert await s.fence(1, KEY) == 3
    assert s.is_fenced(1)
    with pytest.raises(FencedError):
        await s.add_entry(1, 5, 4, KEY, b"x")
    await s.add_entry(1, 5, 4, KEY, payload(1, 5), recovery=True)
    # Fencing a ledger this bookie never saw stores its key too.
    assert await s.fence(2, KEY) == NO_ENTRY_ID
    s = await restart(s, crash=crash)
    try:
        assert s.is_fenced(1)
        assert s.is_fenced(2)
        with pytest.raises(FencedError):
            await s.add_entry(1, 6, 5, KEY, b"x")
        with pytest.raises(UnauthorizedError):
            await s.add_entry(1, 6, 5, b"other-key", b"x", recovery=True)
        await check_all(s, 1, range(6))
        assert s.last_add_confirmed(1) == 4
        await s.checkpoint()
        s = await restart(s, crash=True)
        assert s.is_fenced(1)  # fenced never unfences
    finally:
        await s.close()


async def test_fence_rejects_adds_issued_before_it_is_durable(storage: BookieStorage) -> None:
    await add_all(storage, 1, range(3))
    in_flight = asyncio.create_task(storage.add_entry(1, 3, 2, KEY, payload(1, 3)))
    await asyncio.sleep(0)  # queued in the journal, not yet acknowledged
    fence = asyncio.create_task(storage.fence(1, KEY))
    await asyncio.sleep(0)  # one turn: the fence is asked before the next add
    with pytest.raises(FencedError):  # asked after the fence: rejected at once
        await storage.add_entry(1, 4, 3, KEY, b"x")
    await in_flight  # asked before the fence: acknowledged, and covered by its LAC
    assert await fence == 2
    await check_all(storage, 1, range(4))


async def test_group_wait_batches_records(tmp_path: Path) -> None:
    config = make_config(tmp_path, journal_flush_when_idle=False, journal_group_wait_ms=20.0)
    s = BookieStorage(config)
    await s.start()
    try:
        await add_all(s, 1, range(200))
        stats = s.stats()
        assert stats["journal_groups"] <= 3
        assert stats["journal_records"] == 201
        await check_all(s, 1, range(200))
    finally:
        await s.close()


async def test_bad_requests_do_not_reach_the_journal(storage: BookieStorage) -> None:
    for ledger_id, entry_id, lac in (
        (-1, 0, -1),
        (1, -1, -1),
        (1, 0, -2),
        (1, 0, 1 << 63),
        (1 << 64, 0, -1),
    ):
        with pytest.raises(BadRequestError):
            await storage.add_entry(ledger_id, entry_id, lac, KEY, b"x")
    with pytest.raises(BadRequestError):
        await storage.fence(-5, KEY)
    await storage.add_entry(1, 0, -1, KEY, b"x")  # the journal is still healthy
    assert storage.failed is None


# --- GC and compaction --------------------------------------------------------------------


async def test_compaction_reclaims_space_while_reads_stay_correct(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, entry_log_bytes_max=64 << 10, read_cache_bytes_max=0, compaction_threshold=0.5
    )
    s = BookieStorage(config)
    await s.start()
    try:
        for ledger_id in range(1, 21):
            await add_all(s, ledger_id, range(40), size=1000)
            await s.checkpoint()  # interleave ledgers over many small logs
        survivors = (3, 17)
        await s.delete_ledgers(set(range(1, 21)) - set(survivors))
        assert s.ledgers() == list(survivors)
        with pytest.raises(NoLedgerError):
            await s.read_entry(1, 0)
        before = dir_bytes(config.ledgers_dir)

        stop = asyncio.Event()
        reads = 0

        async def reader() -> None:
            nonlocal reads
            rng = random.Random(7)
            while not stop.is_set():
                ledger_id = rng.choice(survivors)
                e = rng.randrange(40)
                assert await s.read_entry(ledger_id, e) == payload(ledger_id, e, 1000)
                reads += 1

        readers = [asyncio.create_task(reader()) for _ in range(4)]
        writes = asyncio.create_task(add_all(s, 99, range(100), size=1000))
        reclaimed = await s.compact()
        await writes
        stop.set()
        await asyncio.gather(*readers)
        after = dir_bytes(config.ledgers_dir)
        assert reads > 0
        assert reclaimed > 0
        assert after < before * 0.3, (before, after)
        for ledger_id in survivors:
            await check_all(s, ledger_id, range(40), size=1000)
        s = await restart(s, crash=True)
        for ledger_id in survivors:
            await check_all(s, ledger_id, range(40), size=1000)
        await check_all(s, 99, range(100), size=1000)
        assert s.ledgers() == [*survivors, 99]
    finally:
        await s.close()


async def test_deleted_ledger_is_not_resurrected_by_replay(config: BookieConfig) -> None:
    s = BookieStorage(config)
    await s.start()
    await add_all(s, 1, range(10))
    await add_all(s, 2, range(10))
    await s.delete_ledgers({1})
    s = await restart(s, crash=True)
    try:
        assert s.ledgers() == [2]
        await check_all(s, 2, range(10))
    finally:
        await s.close()


# --- disk health, backpressure, fatal errors ----------------------------------------------


async def test_read_only_rejects_adds_but_serves_reads(storage: BookieStorage) -> None:
    await add_all(storage, 1, range(3))
    storage.set_read_only(True)
    assert storage.disk_usage().read_only
    with pytest.raises(ReadOnlyError):
        await storage.add_entry(1, 3, 2, KEY, b"x")
    await check_all(storage, 1, range(3))
    storage.set_read_only(False)
    await storage.add_entry(1, 3, 2, KEY, payload(1, 3))


async def test_disk_thresholds_flip_read_only_both_ways(storage: BookieStorage) -> None:
    used = storage.disk_usage().used_fraction
    assert 0.0 < used < 1.0
    storage.config = dataclasses.replace(
        storage.config, disk_usage_lwm=used / 4, disk_usage_threshold=used / 2
    )
    assert storage.check_disk_usage().read_only
    with pytest.raises(ReadOnlyError):
        await storage.add_entry(1, 0, -1, KEY, b"x")
    storage.config = dataclasses.replace(
        storage.config, disk_usage_lwm=min(0.999, used + 0.01), disk_usage_threshold=1.0
    )
    assert not storage.check_disk_usage().read_only
    await storage.add_entry(1, 0, -1, KEY, b"x")


async def test_memtable_backpressure(tmp_path: Path) -> None:
    config = make_config(tmp_path, memtable_flush_bytes=16 << 10, memtable_bytes_max=32 << 10)
    s = BookieStorage(config)
    await s.start()
    try:
        results = await asyncio.gather(
            *(s.add_entry(1, e, e - 1, KEY, payload(1, e, 1000)) for e in range(100)),
            return_exceptions=True,
        )
        rejected = [r for r in results if isinstance(r, TooManyRequestsError)]
        accepted = [e for e, r in enumerate(results) if r is None]
        assert rejected
        assert accepted
        assert len(rejected) + len(accepted) == 100
        assert s.memtable_bytes <= 32 << 10
        await s.checkpoint()
        await s.add_entry(1, 100, 99, KEY, payload(1, 100, 1000))  # room again
        for e in accepted:
            assert await s.read_entry(1, e) == payload(1, e, 1000)
    finally:
        await s.close()


class FlakyFsync:
    def __init__(self) -> None:
        self.failing = False
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.failing:
            raise OSError(errno.EIO, "injected fsync failure")
        os.fdatasync(fd)


async def test_fsync_failure_is_fatal(config: BookieConfig) -> None:
    fsync = FlakyFsync()
    fatal: list[BaseException] = []
    s = BookieStorage(config, fsync=fsync, on_fatal=fatal.append)
    await s.start()
    try:
        await add_all(s, 1, range(5))
        fsync.failing = True
        results = await asyncio.gather(
            *(s.add_entry(1, e, e - 1, KEY, payload(1, e)) for e in range(5, 25)),
            return_exceptions=True,
        )
        assert all(isinstance(r, IOFailureError) for r in results), results
        assert len(fatal) == 1
        assert isinstance(fatal[0], OSError)
        assert s.failed is not None
        with pytest.raises(IOFailureError):
            await s.add_entry(1, 30, 4, KEY, b"x")
        with pytest.raises(IOFailureError):
            await s.fence(1, KEY)
        with pytest.raises(IOFailureError):
            await s.checkpoint()
        await check_all(s, 1, range(5))  # what was acknowledged is still served
    finally:
        await s.close()
    fsync.failing = False
    s = BookieStorage(config)
    await s.start()
    try:
        await check_all(s, 1, range(5))
    finally:
        await s.close()


async def test_checkpoint_fsync_failure_is_fatal(config: BookieConfig) -> None:
    fsync = FlakyFsync()
    fatal: list[BaseException] = []
    s = BookieStorage(config, fsync=fsync)
    s.set_fatal_handler(fatal.append)
    await s.start()
    try:
        await add_all(s, 1, range(5))
        fsync.failing = True
        with pytest.raises(IOFailureError):
            await s.checkpoint()
        assert len(fatal) == 1
        await check_all(s, 1, range(5))
    finally:
        await s.close()


async def test_closed_storage_rejects_adds(config: BookieConfig) -> None:
    s = BookieStorage(config)
    await s.start()
    await s.close()
    with pytest.raises(ClosedError):
        await s.add_entry(1, 0, -1, KEY, b"x")


async def test_many_ledgers_sorted(tmp_path: Path) -> None:
    s = BookieStorage(make_config(tmp_path))
    await s.start()
    try:
        ids = random.Random(3).sample(range(1 << 40), 30)
        for lid in ids:
            await s.add_entry(lid, 0, -1, KEY, payload(lid, 0))
        await s.checkpoint()
        assert s.ledgers() == sorted(ids)
        s = await restart(s, crash=False)
        assert s.ledgers() == sorted(ids)
        for lid in ids:
            assert await s.read_entry(lid, 0) == payload(lid, 0)
    finally:
        await s.close()


# --- last entry, recovery on read-only ------------------------------------------------------


async def test_last_entry_id_from_memtable_and_index_without_listing(
    storage: BookieStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_listing(*_args: object) -> list[int]:
        raise AssertionError("last_entry_id must not list a ledger's entries")

    monkeypatch.setattr(storage._index, "entry_ids", no_listing)
    monkeypatch.setattr(storage, "entries", no_listing)
    await add_all(storage, 1, range(0, 50))
    await add_all(storage, 2, range(0, 3))
    assert await storage.last_entry_id(1) == 49  # memtable only
    await storage.checkpoint()
    assert await storage.last_entry_id(1) == 49  # index only
    assert await storage.last_entry_id(2) == 2  # the next ledger's keys do not leak in
    await add_all(storage, 1, range(50, 60))
    assert await storage.last_entry_id(1) == 59  # memtable above the index
    # A late lower entry (striped ensemble, recovery) does not move the last one down.
    await storage.add_entry(1, 55, 54, KEY, payload(1, 55), recovery=True)
    assert await storage.last_entry_id(1) == 59
    storage._ledgers[3] = type(storage._ledgers[1])(KEY)  # known ledger, no entries
    assert await storage.last_entry_id(3) == -1
    with pytest.raises(NoLedgerError):
        await storage.last_entry_id(4)


async def test_recovery_adds_are_accepted_while_read_only(storage: BookieStorage) -> None:
    await storage.add_entry(1, 0, -1, KEY, b"a")
    storage.set_read_only(True)
    with pytest.raises(ReadOnlyError):
        await storage.add_entry(1, 1, 0, KEY, b"b")
    # Ledger recovery must be able to complete on a read-only bookie.
    await storage.add_entry(1, 1, 0, KEY, b"b", recovery=True)
    assert await storage.read_entry(1, 1) == b"b"
    with pytest.raises(UnauthorizedError):  # still checked
        await storage.add_entry(1, 2, 1, b"other", b"c", recovery=True)


async def test_explicit_lac_waits_for_durable_entries(storage: BookieStorage) -> None:
    """WRITE_LAC raises the LAC at once, but never past the entries durable here (a
    woken long poll must find its entry); the rest applies as entries arrive."""
    await add_all(storage, 1, range(3))  # piggybacked LAC 1
    poll = asyncio.create_task(storage.wait_lac(1, 1, 30.0))
    await parked(storage, 1)
    assert storage.write_lac(1, 2, KEY) == 2
    result = await asyncio.wait_for(poll, 5.0)
    assert (result.lac, result.next_entry_id, result.next_entry) == (2, 2, payload(1, 2))
    assert storage.write_lac(1, 5, KEY) == 2  # entries 3..5 are not here yet
    await storage.add_entry(1, 3, 1, KEY, payload(1, 3))
    assert storage.last_add_confirmed(1) == 3
    await storage.add_entry(1, 4, 1, KEY, payload(1, 4))
    assert storage.last_add_confirmed(1) == 4  # the explicit 5 applies as far as held
    await storage.add_entry(1, 6, 1, KEY, payload(1, 6))
    assert storage.last_add_confirmed(1) == 5
    assert storage.write_lac(1, 4, KEY) == 5  # never backwards
    with pytest.raises(UnauthorizedError):
        storage.write_lac(1, 6, b"other key")
    with pytest.raises(NoLedgerError):
        storage.write_lac(2, 0, KEY)
    await storage.fence(1, KEY)
    with pytest.raises(FencedError):
        storage.write_lac(1, 6, KEY)


async def test_an_adds_lac_counts_on_receipt(tmp_path: Path) -> None:
    """The LAC an add carries wakes a long poll as soon as the add arrives, before the
    add itself is durable (so the writer needs no WRITE_LAC for it); the bookie's own
    LAC (persisted, reported by reads) never passes the entries durable here."""
    import threading

    release = threading.Event()
    release.set()

    def fsync(fd: int) -> None:
        release.wait(10)
        os.fdatasync(fd)

    s = BookieStorage(make_config(tmp_path), fsync=fsync)
    await s.start()
    try:
        await add_all(s, 1, range(2))  # entry 1 carried LAC 0
        poll = asyncio.create_task(s.wait_lac(1, 0, 30.0))
        await parked(s, 1)
        release.clear()  # the journal's next fsync blocks: nothing more becomes durable
        carrier = asyncio.create_task(s.add_entry(1, 2, 1, KEY, payload(1, 2)))
        result = await asyncio.wait_for(poll, 5.0)
        assert (result.lac, result.next_entry) == (1, payload(1, 1))
        assert not carrier.done()  # the carrying add is not durable yet
        late = asyncio.create_task(s.add_entry(1, 3, 2, KEY, payload(1, 3)))
        await asyncio.sleep(0.01)  # behaviour: entry 3 arrives, the LAC must not move past 1
        assert s.last_add_confirmed(1) == 1  # LAC 2 waits for entry 2 to be durable
        release.set()
        await asyncio.wait_for(asyncio.gather(carrier, late), 5.0)
        assert s.last_add_confirmed(1) == 2
    finally:
        release.set()
        await s.close()


async def test_a_long_poll_gets_the_writers_lac_before_this_replica_fsyncs(
    tmp_path: Path,
) -> None:
    """Issue 26: the writer's LAC says its entries are durable on the ack quorum, so a
    replica whose fsync lags answers a long poll with it -- and the entries, from the
    journal's queue -- as soon as it arrives: the slowest fsync of the write set never
    holds a tail back. Never past the writer's LAC, and the replica's own LAC (persisted,
    reported by reads) still waits for its fsync."""
    import threading

    release = threading.Event()
    release.set()

    def fsync(fd: int) -> None:
        release.wait(10)
        os.fdatasync(fd)

    s = BookieStorage(make_config(tmp_path), fsync=fsync)
    await s.start()
    try:
        await add_all(s, 1, range(2))  # entries 0 and 1 durable, LAC 0 carried
        release.clear()  # the journal's next fsync blocks: nothing more becomes durable
        adds = [asyncio.ensure_future(s.add_entry(1, e, 0, KEY, payload(1, e))) for e in (2, 3, 4)]
        # received: each add reserves its memtable room until it is durable
        await wait_for(lambda: s._mem.reserved_bytes >= 300, "entries 2..4 received")
        poll = asyncio.ensure_future(s.wait_lac(1, 1, 30.0, bytes_max=1 << 20))
        await parked(s, 1)
        s.write_lac(1, 3, KEY)  # the writer has entries 2 and 3 on its ack quorum
        result = await asyncio.wait_for(poll, 5.0)
        assert (result.lac, result.next_entry_id) == (3, 2)
        assert (result.next_entry, result.more_entries) == (payload(1, 2), (payload(1, 3),))
        assert not any(a.done() for a in adds)  # none of them durable here yet
        assert s.last_add_confirmed(1) == 1  # the replica's own LAC waits for its fsync
        # Entry 4 is here too, but no LAC covers it: never answered past the writer's.
        assert (await s.wait_lac(1, 3, 0.0)).lac == 3
        release.set()
        await asyncio.wait_for(asyncio.gather(*adds), 5.0)
        assert s.last_add_confirmed(1) == 3
        assert (await s.wait_lac(1, 1, 0.0, bytes_max=1 << 20)).more_entries == (payload(1, 3),)
    finally:
        release.set()
        await s.close()
