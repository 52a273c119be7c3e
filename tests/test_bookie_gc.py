"""Ledger GC (bookie/gc.py) against the real storage engine and a scripted metadata list."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie.config import BookieConfig
from bookie.gc import LedgerGc
from bookie.storage.engine import BookieStorage
from foundation.errors import MetadataError, NoLedgerError

KEY = b"gc-key"


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[BookieStorage]:
    config = BookieConfig(
        journal_dir=str(tmp_path / "journal"),
        ledgers_dir=str(tmp_path / "ledgers"),
        index_dir=str(tmp_path / "index"),
        journal_prealloc_bytes=64 << 10,
        checkpoint_interval_ms=600_000,
        gc_interval_ms=600_000,
    )
    s = BookieStorage(dataclasses.replace(config))
    await s.start()
    try:
        yield s
    finally:
        await s.close()


class Metadata:
    """What the metadata store lists; ``fail`` makes the next listing fail."""

    def __init__(self, ids: set[int]) -> None:
        self.ids = ids
        self.fail = False

    async def list_ledger_ids(self) -> list[int]:
        if self.fail:
            self.fail = False
            raise MetadataError("ZooKeeper unreachable (scripted)")
        return sorted(self.ids)


async def test_deletes_only_ledgers_missing_for_two_rounds(storage: BookieStorage) -> None:
    for ledger_id in (1, 2, 3):
        await storage.add_entry(ledger_id, 0, -1, KEY, b"x")
    md = Metadata({1, 2, 3})
    gc = LedgerGc(storage, md.list_ledger_ids, interval_s=60.0)
    assert (await gc.run_once()).deleted == ()
    md.ids = {1}
    first = await gc.run_once()  # 2 and 3 missing once: kept (could be a listing race)
    assert first.candidates == 2
    assert first.deleted == ()
    assert storage.ledgers() == [1, 2, 3]
    md.ids = {1, 3}  # 3 shows up again: never deleted
    second = await gc.run_once()
    assert second.deleted == (2,)
    assert storage.ledgers() == [1, 3]
    with pytest.raises(NoLedgerError):
        await storage.read_entry(2, 0)
    assert await storage.read_entry(1, 0) == b"x"


async def test_a_failed_listing_deletes_nothing_and_resets(storage: BookieStorage) -> None:
    await storage.add_entry(7, 0, -1, KEY, b"x")
    md = Metadata(set())
    gc = LedgerGc(storage, md.list_ledger_ids, interval_s=60.0)
    assert (await gc.run_once()).candidates == 1
    md.fail = True
    assert (await gc.run_once()).deleted == ()
    assert (await gc.run_once()).deleted == ()  # candidates were forgotten: one more round
    assert (await gc.run_once()).deleted == (7,)
    assert storage.ledgers() == []
