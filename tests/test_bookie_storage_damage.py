"""Damaged records in a bookie's files (issue 12): one bad record costs one entry, never
its neighbours; damaged entries are tracked, persisted and repaired by recovery adds.

Files are damaged offline with the fault shim's helpers (bookie/storage/faults.py) on a
stopped storage, then a fresh storage is started on the same directories.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bookie.config import BookieConfig
from bookie.metrics import BookieMetrics
from bookie.storage import entrylog, faults
from bookie.storage.engine import BookieStorage
from foundation.errors import ChecksumError, NoEntryError
from tests.test_bookie_storage import KEY, add_all, check_all, make_config, payload

SIZE = 200


def log_path(config: BookieConfig, loc: entrylog.Location) -> Path:
    return Path(config.ledgers_dir) / entrylog.file_name(loc.log_id)


async def stored(
    config: BookieConfig, ledgers: dict[int, int]
) -> dict[tuple[int, int], entrylog.Location]:
    """Add ``ledgers`` (id -> entry count), checkpoint, close; return every location."""
    s = BookieStorage(config)
    await s.start()
    try:
        for ledger_id, count in ledgers.items():
            await add_all(s, ledger_id, range(count), size=SIZE)
        await s.checkpoint()
        locs = {}
        for ledger_id, count in ledgers.items():
            for e in range(count):
                loc = s._index.get(ledger_id, e)
                assert loc is not None
                locs[(ledger_id, e)] = loc
        return locs
    finally:
        await s.close()


def damage_payload(config: BookieConfig, loc: entrylog.Location) -> None:
    """Flip one bit in the middle of the record's payload."""
    faults.flip_bit(log_path(config, loc), loc.offset + entrylog.RECORD_HEADER_BYTES + SIZE // 2)


async def read_all(s: BookieStorage, ledger_id: int, count: int) -> dict[int, str]:
    """entry id -> "ok" or the error name, reading in order (read-ahead at work)."""
    out = {}
    for e in range(count):
        try:
            ok = await s.read_entry(ledger_id, e) == payload(ledger_id, e, SIZE)
            out[e] = "ok" if ok else "WRONG"
        except ChecksumError as exc:
            out[e] = exc.name
    return out


async def test_flipped_byte_fails_only_the_damaged_entry(tmp_path: Path) -> None:
    """Defect 2: a checksum error discarded the whole read-ahead run, so the entry read
    and up to 63 healthy neighbours answered CHECKSUM."""
    config = make_config(tmp_path, read_ahead_entries=64)
    locs = await stored(config, {1: 200})
    damage_payload(config, locs[(1, 100)])
    s = BookieStorage(config)
    await s.start()
    try:
        results = await read_all(s, 1, 200)
        bad = {e: r for e, r in results.items() if r != "ok"}
        assert bad == {100: "CHECKSUM"}
        # Random access to the damaged one and around it (no read-ahead help).
        s._cache = type(s._cache)(0)
        with pytest.raises(ChecksumError):
            await s.read_entry(1, 100)
        await check_all(s, 1, range(95, 100), size=SIZE)
        await check_all(s, 1, range(101, 110), size=SIZE)
        assert s.damaged_entries() == [(1, 100)]
    finally:
        await s.close()


async def test_damage_is_logged_once_counted_and_survives_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(tmp_path, read_ahead_entries=8)
    locs = await stored(config, {1: 50, 2: 50})
    damage_payload(config, locs[(1, 10)])
    damage_payload(config, locs[(2, 20)])
    s = BookieStorage(config)
    await s.start()
    try:
        caplog.set_level(logging.WARNING, "bookie.storage")
        await read_all(s, 1, 50)
        await read_all(s, 2, 50)
        for _ in range(3):
            with pytest.raises(ChecksumError):
                await s.read_entry(1, 10)
        assert s.damaged_entries() == [(1, 10), (2, 20)]
        warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
        assert len(warnings) == 2, warnings  # once per entry, however often it is read
        assert "ledger 1 entry 10" in warnings[0]
        assert entrylog.file_name(locs[(1, 10)].log_id) in warnings[0]
        assert f"offset {locs[(1, 10)].offset}" in warnings[0]
        stats = s.stats()
        assert stats["damaged_entries"] == 2
        assert stats["checksum_failures"] >= 2
        metrics = BookieMetrics()
        metrics.refresh(s.disk_usage(), stats)
        assert metrics.registry.get_sample_value("bookline_bookie_damaged_entries") == 2
        assert (
            metrics.registry.get_sample_value("bookline_bookie_checksum_failures_total")
            == stats["checksum_failures"]
        )
        s = await _restart(s)
        assert s.damaged_entries() == [(1, 10), (2, 20)]
        with pytest.raises(ChecksumError):  # still failing: no other copy here
            await s.read_entry(1, 10)
        assert await s.entries(1) == list(range(50))  # known, though damaged
        await s.delete_ledgers({2})
        assert s.damaged_entries() == [(1, 10)]
    finally:
        await s.close()


async def _restart(s: BookieStorage) -> BookieStorage:
    await s.close()
    new = BookieStorage(s.config)
    await new.start()
    return new


async def test_recovery_add_repairs_a_damaged_entry(tmp_path: Path) -> None:
    """The repair contract: a recovery add of a damaged entry is accepted (also on a
    fenced ledger and a read-only bookie), served from the memtable at once, written to
    an entry log by the next checkpoint, which repoints the index and clears the mark."""
    config = make_config(tmp_path, read_ahead_entries=16)
    locs = await stored(config, {1: 40})
    damage_payload(config, locs[(1, 7)])
    s = BookieStorage(config)
    await s.start()
    try:
        await read_all(s, 1, 40)
        assert s.damaged_entries() == [(1, 7)]
        await s.fence(1, KEY)
        s.set_read_only(True)
        await s.add_entry(1, 7, 6, KEY, payload(1, 7, SIZE), recovery=True)
        assert await s.read_entry(1, 7) == payload(1, 7, SIZE)  # from the memtable
        assert s.damaged_entries() == [(1, 7)]  # not yet in an entry log
        await s.checkpoint()
        assert s.damaged_entries() == []
        assert s.stats()["damaged_entries"] == 0
        s._cache = type(s._cache)(0)
        await check_all(s, 1, range(40), size=SIZE)  # from disk
        s = await _restart(s)
        assert s.damaged_entries() == []
        await check_all(s, 1, range(40), size=SIZE)
        assert s.last_add_confirmed(1) == 38
    finally:
        await s.close()


async def test_recovery_add_of_a_healthy_entry_is_idempotent(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    await stored(config, {1: 10})
    s = BookieStorage(config)
    await s.start()
    try:
        await s.add_entry(1, 4, 3, KEY, payload(1, 4, SIZE), recovery=True)
        await s.add_entry(1, 4, 3, KEY, payload(1, 4, SIZE), recovery=True)
        await check_all(s, 1, range(10), size=SIZE)
        await s.checkpoint()
        s._cache = type(s._cache)(0)
        await check_all(s, 1, range(10), size=SIZE)
        assert await s.entries(1) == list(range(10))
        assert s.last_add_confirmed(1) == 8
        assert s.damaged_entries() == []
        s = await _restart(s)
        await check_all(s, 1, range(10), size=SIZE)
    finally:
        await s.close()


# --- compaction (defect 3) ------------------------------------------------------------

COMPACT_SIZE = 1000
SURVIVORS = (3, 17)


async def _compaction_setup(tmp_path: Path) -> tuple[BookieStorage, dict[int, int]]:
    """20 ledgers over many small logs, all but SURVIVORS deleted: every log holding a
    deleted entry is under the compaction threshold. Returns the storage and the bytes of
    the logs before compaction."""
    config = make_config(tmp_path, entry_log_bytes_max=64 << 10, read_cache_bytes_max=0,
                         compaction_threshold=0.99)  # fmt: skip
    s = BookieStorage(config)
    await s.start()
    for ledger_id in range(1, 21):
        await add_all(s, ledger_id, range(40), size=COMPACT_SIZE)
        await s.checkpoint()
    await s.delete_ledgers(set(range(1, 21)) - set(SURVIVORS))
    return s, {
        i: (Path(config.ledgers_dir) / entrylog.file_name(i)).stat().st_size
        for i in entrylog.list_logs(Path(config.ledgers_dir))
    }


async def _check_survivors(s: BookieStorage, damaged: set[tuple[int, int]]) -> None:
    for ledger_id in SURVIVORS:
        for e in range(40):
            if (ledger_id, e) in damaged:
                with pytest.raises(ChecksumError):
                    await s.read_entry(ledger_id, e)
            else:
                assert await s.read_entry(ledger_id, e) == payload(ledger_id, e, COMPACT_SIZE)


async def test_compaction_keeps_every_healthy_entry_after_a_damaged_one(tmp_path: Path) -> None:
    """Defect 3: compaction's scan stopped at the first bad record, so the log was
    deleted with every live entry after it ("0 entries kept")."""
    s, before = await _compaction_setup(tmp_path)
    try:
        config = s.config
        flipped = s._index.get(3, 20)
        torn = s._index.get(17, 5)
        assert flipped is not None
        assert torn is not None
        damage_payload_at(config, flipped, COMPACT_SIZE)
        # A zeroed record header: no length to skip by, only the index knows what's next.
        faults.zero_block(log_path(config, torn), torn.offset, 8)
        assert flipped.log_id in s._compaction_candidates()
        assert torn.log_id in s._compaction_candidates()
        reclaimed = await s.compact()
        assert reclaimed > 0
        damaged = {(3, 20), (17, 5)}
        await _check_survivors(s, damaged)
        assert set(s.damaged_entries()) == damaged
        remaining = set(entrylog.list_logs(Path(config.ledgers_dir)))
        assert flipped.log_id not in remaining
        assert torn.log_id not in remaining
        assert sum(before.values()) > 3 * sum(
            (Path(config.ledgers_dir) / entrylog.file_name(i)).stat().st_size for i in remaining
        )
        s = await _restart(s)
        assert set(s.damaged_entries()) == damaged
        await _check_survivors(s, damaged)
        # Repair after compaction: a recovery add clears the mark.
        await s.add_entry(3, 20, 19, KEY, payload(3, 20, COMPACT_SIZE), recovery=True)
        await s.checkpoint()
        assert s.damaged_entries() == [(17, 5)]
        await _check_survivors(s, {(17, 5)})
    finally:
        await s.close()


async def test_compaction_refuses_to_delete_a_log_it_cannot_account_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, _before = await _compaction_setup(tmp_path)
    try:
        bad = s._index.get(3, 20)
        assert bad is not None
        damage_payload_at(s.config, bad, COMPACT_SIZE)
        assert bad.log_id in s._compaction_candidates()
        # The damaged entry cannot be marked (a failing index, say): its row still
        # points into the log afterwards, so the log must stay.
        monkeypatch.setattr(s._index, "mark_damaged", lambda *_a: True)
        await s.compact()
        assert log_path(s.config, bad).exists()
        assert bad.log_id in s._index.stats_snapshot()  # kept for a later compaction
        assert s._index.get(3, 20) == bad
        for e in range(40):
            if e != 20:
                assert await s.read_entry(3, e) == payload(3, e, COMPACT_SIZE)
    finally:
        await s.close()


def damage_payload_at(config: BookieConfig, loc: entrylog.Location, size: int) -> None:
    faults.flip_bit(log_path(config, loc), loc.offset + entrylog.RECORD_HEADER_BYTES + size // 2)


def test_logs_rolled_but_not_synced_are_not_compaction_candidates(tmp_path: Path) -> None:
    """A checkpoint that rolls past a log leaves it unsynced (and its new records
    unindexed) until the checkpoint ends; the log had stats from an earlier checkpoint,
    so compaction would have taken it for a candidate and deleted those records."""
    writer = entrylog.EntryLogWriter(tmp_path, entrylog.LogIds(1), 4096, lambda fd: None)
    try:
        writer.append_run(1, range(10), [bytes(1000)] * 10)
        assert writer.log_id == 3
        assert writer.open_log_ids() == {1, 2, 3}
        writer.sync()
        assert writer.open_log_ids() == {3}
    finally:
        writer.close()


# --- journal replay (defect 4) ----------------------------------------------------------


async def _journal_only(config: BookieConfig, count: int, batch: int = 10) -> None:
    """``count`` entries of ledger 1 in groups of ``batch``, never checkpointed, then a
    crash: everything acknowledged lives in the journal only."""
    s = BookieStorage(config)
    await s.start()
    for start in range(0, count, batch):
        await add_all(s, 1, range(start, min(count, start + batch)))
    await s.abort()


def _journal_record(config: BookieConfig, entry_id: int) -> tuple[Path, int, int]:
    """(file, start offset, end offset) of the ADD record of ledger 1's ``entry_id``
    (the tests' journals are one file)."""
    from bookie.storage import journal

    directory = Path(config.journal_dir)
    (file_id,) = journal.list_files(directory)
    start = journal.FILE_HEADER_BYTES
    for rec, end in journal.replay(directory, journal.JournalMark(file_id, 0)).records:
        if rec.type == journal.ADD and rec.entry_id == entry_id:
            return directory / journal.file_name(file_id), start, end
        start = end
    raise AssertionError(f"no journal record for entry {entry_id}")


async def test_journal_damage_in_the_middle_is_replayed_around(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 4: a flipped byte in a not-yet-checkpointed journal was taken for a torn
    tail, and every acknowledged entry after it was cut off."""
    config = make_config(tmp_path)
    await _journal_only(config, 500)
    path, _start, end = _journal_record(config, 50)
    faults.flip_bit(path, end - 50)  # in the payload (100 bytes): the header is intact
    caplog.set_level(logging.WARNING, "bookie.storage")
    s = BookieStorage(config)
    await s.start()
    try:
        await check_all(s, 1, range(50))
        await check_all(s, 1, range(51, 500))
        with pytest.raises(ChecksumError):
            await s.read_entry(1, 50)
        assert s.damaged_entries() == [(1, 50)]
        assert not [r for r in caplog.records if "torn tail" in r.getMessage()]
        assert any(
            path.name in r.getMessage() and "ledger 1 entry 50" in r.getMessage()
            for r in caplog.records
        )
        assert s.last_add_confirmed(1) == 498
        s = await _restart(s)  # after the replay's checkpoint
        await check_all(s, 1, range(51, 500))
        assert s.damaged_entries() == [(1, 50)]
        await s.add_entry(1, 50, 49, KEY, payload(1, 50), recovery=True)
        await s.checkpoint()
        assert s.damaged_entries() == []
        await check_all(s, 1, range(500))
    finally:
        await s.close()


@pytest.mark.parametrize("damage", ["header", "zeroed"])
async def test_journal_damage_with_untrusted_ids_fails_stop(tmp_path: Path, damage: str) -> None:
    """A damaged record whose ledger/entry ids cannot be trusted, followed by records
    acknowledged after it: the bookie refuses to start, naming file and offset, rather
    than dropping acknowledged entries (or marking the wrong one)."""
    config = make_config(tmp_path)
    await _journal_only(config, 200)
    path, start, _end = _journal_record(config, 50)
    if damage == "header":
        faults.flip_bit(path, start + 12)  # the ledger id
    else:
        faults.zero_block(path, start, 512)  # a lost sector
    size = path.stat().st_size
    s = BookieStorage(config)
    with pytest.raises(ChecksumError) as info:
        await s.start()
    await s.abort()
    assert path.name in str(info.value)
    assert f"offset {start}" in str(info.value)
    assert path.stat().st_size == size  # nothing was cut off


async def test_journal_damage_in_the_last_group_is_a_torn_tail(tmp_path: Path) -> None:
    """Damage in the last group cannot be told from a torn write (nothing proves it was
    fsynced), so it is cut off like one -- and only what follows it in that group."""
    config = make_config(tmp_path)
    await _journal_only(config, 100)
    path, _start, end = _journal_record(config, 99)
    faults.flip_bit(path, end - 50)
    s = BookieStorage(config)
    await s.start()
    try:
        await check_all(s, 1, range(99))
        with pytest.raises(NoEntryError):
            await s.read_entry(1, 99)
        assert s.damaged_entries() == []
    finally:
        await s.close()


async def test_a_cut_off_entry_log_damages_only_the_entries_it_lost(tmp_path: Path) -> None:
    config = make_config(tmp_path, read_ahead_entries=64)
    locs = await stored(config, {1: 100})
    cut = locs[(1, 80)]
    faults.truncate(log_path(config, cut), cut.offset + 30)
    s = BookieStorage(config)
    await s.start()
    try:
        results = await read_all(s, 1, 100)
        assert {e for e, r in results.items() if r != "ok"} == set(range(80, 100))
        assert s.damaged_entries() == [(1, e) for e in range(80, 100)]
    finally:
        await s.close()
