"""The scrub's view of a bookie (:class:`ledger.interfaces.ReplicaInspector`) behaves the same
on the in-memory bookies the protocol tests use and on a real bookie server (storage
engine, wire protocol, ``ledger.adapters.PoolTransport``), so scrub tests against the
fakes say something about the real thing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import crc32c
import pytest

from bookie.client import BookieClientPool, BookieConnection
from bookie.config import BookieConfig
from bookie.storage import entrylog, faults
from foundation.errors import BadRequestError, ChecksumError
from ledger.adapters import PoolTransport
from ledger.digest import DigestManager, DigestType, master_key
from ledger.interfaces import BookieTransport, ReplicaInspector
from ledger.testing import MemoryBookies
from tests.test_bookie_server import Bookie, bookie_config, start_bookie, stop_bookie

LEDGER = 4
KEY = master_key(b"pw")
DIGEST = DigestManager(LEDGER, DigestType.CRC32C, b"pw")
HELD = [e for e in range(10) if e != 6]
TIMEOUT_S = 5.0


def blob(entry_id: int) -> bytes:
    return DIGEST.package(entry_id, entry_id - 1, 100 * (entry_id + 1), b"p" * 100)


class Backend(Protocol):
    bookie: str
    inspector: ReplicaInspector
    transport: BookieTransport

    async def add(self, entry_id: int, *, recovery: bool = False) -> None: ...

    async def damage(self, entry_id: int) -> None:
        """Flip a bit of a stored entry (the bookie finds it on its next read)."""

    async def checkpoint(self) -> None: ...

    def make_old(self) -> None:
        """Play a bookie older than the replica-check ops."""


class MemoryBackend:
    def __init__(self) -> None:
        self.bookie = "b"
        self._bookies = MemoryBookies(["b"])
        self._bookies["b"].marks_until_checkpoint = True
        self._bookies["b"].checksum_page_entries_max = 4
        self.inspector: ReplicaInspector = self._bookies
        self.transport: BookieTransport = self._bookies

    async def add(self, entry_id: int, *, recovery: bool = False) -> None:
        adder = self._bookies.adder("b", LEDGER, KEY, recovery=recovery, timeout_s=1)
        await adder.add(entry_id, -1, blob(entry_id))

    async def damage(self, entry_id: int) -> None:
        self._bookies["b"].corrupt(LEDGER, entry_id, detected=True)

    async def checkpoint(self) -> None:
        self._bookies["b"].checkpoint()

    def make_old(self) -> None:
        self._bookies["b"].no_replica_check = True


class RealBackend:
    """One bookie server in this process, reached through PoolTransport."""

    def __init__(self, config: BookieConfig, bookie: Bookie) -> None:
        self.bookie = "bookie-under-test"
        self._config = config
        self.server = bookie
        self.pool = BookieClientPool()
        transport = PoolTransport(self.pool, self._resolve)
        self.inspector: ReplicaInspector = transport
        self.transport: BookieTransport = transport

    async def _resolve(self, _bookie: str) -> str:
        return self.server.address

    async def add(self, entry_id: int, *, recovery: bool = False) -> None:
        adder = self.transport.adder(
            self.bookie, LEDGER, KEY, recovery=recovery, timeout_s=TIMEOUT_S
        )
        await adder.add(entry_id, -1, blob(entry_id))

    async def damage(self, entry_id: int) -> None:
        storage = self.server.storage
        await storage.checkpoint()
        loc = storage._index.get(LEDGER, entry_id)  # type: ignore[attr-defined]
        assert loc is not None
        await stop_bookie(self.server)
        path = Path(self._config.ledgers_dir) / entrylog.file_name(loc.log_id)
        faults.flip_bit(path, loc.offset + entrylog.RECORD_HEADER_BYTES + 60)
        self.server = await start_bookie(self._config)

    async def checkpoint(self) -> None:
        await self.server.storage.checkpoint()

    def make_old(self) -> None:
        async def no_features(
            _conn: BookieConnection, *, timeout_s: float | None = None
        ) -> frozenset[str]:
            return frozenset()

        self._patch.setattr(BookieConnection, "features", no_features)

    _patch: pytest.MonkeyPatch


@pytest.fixture(params=["memory", "real"])
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    config = dataclasses.replace(bookie_config(tmp_path), checkpoint_interval_ms=3_600_000)
    real = RealBackend(config, await start_bookie(config))
    real._patch = monkeypatch
    try:
        yield real
    finally:
        await real.pool.close()
        await stop_bookie(real.server)


async def checksums(
    b: Backend, first: int, last: int
) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """Every page from ``first`` to ``last``, checking each covers a prefix."""
    fingerprints: dict[int, tuple[int, int]] = {}
    damaged: set[int] = set()
    start = first
    while start <= last:
        page = await b.inspector.entry_checksums(b.bookie, LEDGER, start, last, timeout_s=TIMEOUT_S)
        assert start <= page.last_entry_id <= last
        assert all(start <= e <= page.last_entry_id for e in [*page.fingerprints, *page.damaged])
        fingerprints.update(page.fingerprints)
        damaged |= page.damaged
        start = page.last_entry_id + 1
    return fingerprints, damaged


async def test_fingerprints_of_held_entries(backend: Backend) -> None:
    for e in HELD:
        await backend.add(e)
    fingerprints, damaged = await checksums(backend, 0, 12)
    assert fingerprints == {e: (crc32c.crc32c(blob(e)), len(blob(e))) for e in HELD}
    assert damaged == set()
    empty = await backend.inspector.entry_checksums(
        backend.bookie, LEDGER + 1, 3, 9, timeout_s=TIMEOUT_S
    )
    assert (empty.last_entry_id, dict(empty.fingerprints), empty.damaged) == (9, {}, frozenset())
    assert await backend.inspector.damaged_entries(backend.bookie, limit=10, timeout_s=1) == []


async def test_damage_found_listed_and_repaired(backend: Backend) -> None:
    for e in HELD:
        await backend.add(e)
    await backend.damage(2)
    fingerprints, damaged = await checksums(backend, 0, 9)
    assert damaged == {2}
    assert 2 not in fingerprints
    assert len(fingerprints) == len(HELD) - 1
    with pytest.raises(ChecksumError):
        await backend.transport.read(
            backend.bookie, LEDGER, 2, fence=False, master_key=KEY, timeout_s=TIMEOUT_S
        )
    inspector = backend.inspector
    assert await inspector.damaged_entries(backend.bookie, limit=10, timeout_s=1) == [(LEDGER, 2)]
    assert await inspector.damaged_entries(backend.bookie, limit=0, timeout_s=1) == []
    await backend.add(2, recovery=True)
    fingerprints, damaged = await checksums(backend, 2, 2)
    assert fingerprints == {2: (crc32c.crc32c(blob(2)), len(blob(2)))}
    assert damaged == set()
    answer = await backend.transport.read(
        backend.bookie, LEDGER, 2, fence=False, master_key=KEY, timeout_s=TIMEOUT_S
    )
    assert answer.data == blob(2)
    await backend.checkpoint()
    assert await inspector.damaged_entries(backend.bookie, limit=10, timeout_s=1) == []


async def test_an_old_bookie_is_refused_clearly(backend: Backend) -> None:
    await backend.add(0)
    backend.make_old()
    with pytest.raises(BadRequestError, match="upgrade"):
        await backend.inspector.entry_checksums(backend.bookie, LEDGER, 0, 1, timeout_s=1)
    with pytest.raises(BadRequestError, match="upgrade"):
        await backend.inspector.damaged_entries(backend.bookie, limit=1, timeout_s=1)
