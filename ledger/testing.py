"""Test support (never imported by production code): an in-memory metadata store and
in-memory bookies with fault injection, for the ledger protocol tests.

``tests/test_ledger_conformance.py`` runs one suite against these fakes and against the
real adapters (ZooKeeper and bookie processes), so what protocol tests show with the
fakes holds for the real thing. They implement :class:`ledger.interfaces.MetadataStore` and
:class:`ledger.interfaces.BookieTransport` with the bookie semantics the ledger client
relies on: master key stored on first contact (UNAUTHORIZED on mismatch), fencing before
reading, FENCED for normal adds to a fenced ledger, recovery adds pass, LAC = max
piggybacked LAC, long-poll READ_LAC.

Faults, per bookie id: ``down`` (connection refused), ``hung`` (no answer until the
request's timeout), ``lose_fences`` (the next N fencing requests are lost: they time
out without fencing), ``read_delay_s`` (slow reads), plus a ``before_add`` hook to
interleave adds with recovery.

For the replica check they also keep *damaged* marks (``MemoryBookie.damaged``): a read
of a marked entry fails with CHECKSUM, a recovery add of it replaces the blob and clears
the mark -- the contract of ``bookie.storage.api.Storage.damaged_entries``. ``corrupt``
changes a stored blob without the bookie noticing (silent damage, found by comparing
replicas). ``no_replica_check`` plays a bookie older than the replica-check ops.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from bookie.protocol import CHECKSUM_RANGE_ENTRIES_MAX
from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BadVersionError,
    ChecksumError,
    ConnectionLostError,
    FencedError,
    NoEntryError,
    NoLedgerError,
    TimeoutError_,
    UnauthorizedError,
)
from ledger.interfaces import AddCallback, ChecksumPage, LacAnswer, ReadAnswer
from ledger.placement import BookieCandidate
from metadata.ledger_metadata import NO_ENTRY, LedgerMetadata

__all__ = ["MemoryAdder", "MemoryBookie", "MemoryBookies", "MemoryMetadataStore", "candidates"]


class MemoryMetadataStore:
    def __init__(self, bookies: list[BookieCandidate]) -> None:
        self.bookies = list(bookies)
        self._ids = itertools.count(1)
        self._ledgers: dict[int, tuple[LedgerMetadata, int]] = {}
        self.writes = 0

    async def next_ledger_id(self) -> int:
        return next(self._ids)

    async def create(self, meta: LedgerMetadata) -> int:
        await asyncio.sleep(0)
        if meta.ledger_id in self._ledgers:
            raise AlreadyExistsError(f"ledger {meta.ledger_id} exists")
        self._ledgers[meta.ledger_id] = (meta, 0)
        return 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        await asyncio.sleep(0)
        try:
            return self._ledgers[ledger_id]
        except KeyError:
            raise NoLedgerError(f"ledger {ledger_id} does not exist") from None

    async def write(self, meta: LedgerMetadata, version: int) -> int:
        await asyncio.sleep(0)
        current = self._ledgers.get(meta.ledger_id)
        if current is None:
            raise NoLedgerError(f"ledger {meta.ledger_id} does not exist")
        if current[1] != version:
            raise BadVersionError(f"ledger {meta.ledger_id} at {current[1]}, not {version}")
        self._ledgers[meta.ledger_id] = (meta, version + 1)
        self.writes += 1
        return version + 1

    async def delete(self, ledger_id: int) -> None:
        await asyncio.sleep(0)
        if self._ledgers.pop(ledger_id, None) is None:
            raise NoLedgerError(f"ledger {ledger_id} does not exist")

    async def writable_bookies(self) -> list[BookieCandidate]:
        await asyncio.sleep(0)
        return list(self.bookies)


@dataclass
class _LedgerState:
    key: bytes
    fenced: bool = False
    lac: int = NO_ENTRY
    entries: dict[int, bytes] = field(default_factory=dict)


@dataclass
class MemoryBookie:
    bookie_id: str
    ledgers: dict[int, _LedgerState] = field(default_factory=dict)
    down: bool = False
    hung: bool = False
    # Fence requests still to lose on the way (each times out without fencing).
    lose_fences: int = 0
    # Extra delay before answering reads (a slow replica).
    read_delay_s: float = 0.0
    # An old bookie without the explicit-LAC op.
    no_write_lac: bool = False
    # An old bookie without the replica-check ops.
    no_replica_check: bool = False
    # (ledger_id, entry_id) this bookie found damaged: reads fail until a recovery add.
    damaged: set[tuple[int, int]] = field(default_factory=set)
    # Like the real storage engine: a recovery add serves the new copy at once but the
    # damaged mark stays until checkpoint() (False: the mark goes with the add).
    marks_until_checkpoint: bool = False
    _repaired: set[tuple[int, int]] = field(default_factory=set)
    # Entries one checksum answer covers at most (small in tests to exercise paging).
    checksum_page_entries_max: int = CHECKSUM_RANGE_ENTRIES_MAX
    lac_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def corrupt(self, ledger_id: int, entry_id: int, *, detected: bool = False) -> None:
        """Flip a bit of a stored blob; ``detected``: the bookie noticed (a mark)."""
        st = self.ledgers[ledger_id]
        blob = bytearray(st.entries[entry_id])
        blob[-1] ^= 0x01
        st.entries[entry_id] = bytes(blob)
        if detected:
            self.damaged.add((ledger_id, entry_id))

    def is_damaged(self, ledger_id: int, entry_id: int) -> bool:
        """A read of the entry fails its checksum."""
        key = (ledger_id, entry_id)
        return key in self.damaged and key not in self._repaired

    def repaired(self, ledger_id: int, entry_id: int) -> None:
        if self.marks_until_checkpoint:
            self._repaired.add((ledger_id, entry_id))
        else:
            self.damaged.discard((ledger_id, entry_id))

    def checkpoint(self) -> None:
        """Repaired entries lose their damaged marks."""
        self.damaged -= self._repaired
        self._repaired.clear()

    def state(self, ledger_id: int, key: bytes) -> _LedgerState:
        st = self.ledgers.get(ledger_id)
        if st is None:
            st = self.ledgers[ledger_id] = _LedgerState(key)
        elif st.key != key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        return st


class MemoryBookies:
    """A set of in-memory bookies addressed by id (a BookieTransport)."""

    def __init__(self, bookie_ids: list[str]) -> None:
        self.bookies = {b: MemoryBookie(b) for b in bookie_ids}
        # Called (awaited) before an add is applied: lets tests interleave.
        self.before_add: Callable[[str, int, int, bool], object] | None = None
        self.requests = 0

    def __getitem__(self, bookie_id: str) -> MemoryBookie:
        return self.bookies[bookie_id]

    async def _enter(self, bookie_id: str, timeout_s: float) -> MemoryBookie:
        self.requests += 1
        await asyncio.sleep(0)
        bk = self.bookies.get(bookie_id)
        if bk is None or bk.down:
            raise ConnectionLostError(f"cannot connect to bookie {bookie_id}")
        if bk.hung:
            await asyncio.sleep(timeout_s)
            raise TimeoutError_(f"bookie {bookie_id} did not answer within {timeout_s}s")
        return bk

    def adder(
        self,
        bookie: str,
        ledger_id: int,
        master_key: bytes,
        *,
        recovery: bool = False,
        timeout_s: float,
    ) -> MemoryAdder:
        return MemoryAdder(
            bookies=self,
            bookie=bookie,
            ledger_id=ledger_id,
            key=master_key,
            recovery=recovery,
            timeout_s=timeout_s,
        )

    async def read(
        self,
        bookie: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool,
        master_key: bytes,
        timeout_s: float,
    ) -> ReadAnswer:
        bk = await self._enter(bookie, timeout_s)
        if fence and bk.lose_fences > 0:
            bk.lose_fences -= 1
            await asyncio.sleep(timeout_s)
            raise TimeoutError_(f"fence request to {bookie} lost")
        if fence:
            bk.state(ledger_id, master_key).fenced = True
        if bk.read_delay_s:
            await asyncio.sleep(bk.read_delay_s)
        st = bk.ledgers.get(ledger_id)
        if st is None:
            raise NoLedgerError(f"ledger {ledger_id} not on {bookie}")
        if not hmac.compare_digest(st.key, master_key):
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if entry_id == NO_ENTRY:
            if not st.entries:
                raise NoEntryError(f"ledger {ledger_id} has no entries on {bookie}")
            entry_id = max(st.entries)
        data = st.entries.get(entry_id)
        if data is None:
            raise NoEntryError(f"entry {ledger_id}/{entry_id} not on {bookie}")
        if bk.is_damaged(ledger_id, entry_id):
            raise ChecksumError(f"entry {ledger_id}/{entry_id} is damaged on {bookie}")
        return ReadAnswer(entry_id, st.lac, data)

    async def write_lac(
        self, bookie: str, ledger_id: int, lac: int, master_key: bytes, *, timeout_s: float
    ) -> bool:
        bk = await self._enter(bookie, timeout_s)
        if bk.no_write_lac:
            return False
        st = bk.ledgers.get(ledger_id)
        if st is None:
            raise NoLedgerError(f"ledger {ledger_id} not on {bookie}")
        if not hmac.compare_digest(st.key, master_key):
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if st.fenced:
            raise FencedError(f"ledger {ledger_id} is fenced on {bookie}")
        lac = min(lac, max(st.entries, default=NO_ENTRY))  # never past what it holds
        if lac > st.lac:
            st.lac = lac
            bk.lac_changed.set()
        return True

    async def read_lac(
        self,
        bookie: str,
        ledger_id: int,
        previous_lac: int,
        timeout_ms: int,
        *,
        timeout_s: float,
        piggyback_bytes_max: int = 0,
        master_key: bytes = b"",
    ) -> LacAnswer:
        bk = await self._enter(bookie, timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000.0
        while True:
            st = bk.ledgers.get(ledger_id)
            if st is None:
                raise NoLedgerError(f"ledger {ledger_id} not on {bookie}")
            if not hmac.compare_digest(st.key, master_key):
                raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
            if st.lac > previous_lac or loop.time() >= deadline:
                nxt = st.entries.get(previous_lac + 1)
                more: list[bytes] = []
                size = len(nxt) if nxt else 0
                while nxt and size < piggyback_bytes_max:
                    following = st.entries.get(previous_lac + 2 + len(more))
                    if following is None or previous_lac + 2 + len(more) > st.lac:
                        break
                    more.append(following)
                    size += len(following)
                return LacAnswer(st.lac, previous_lac + 1 if nxt else None, nxt, tuple(more))
            bk.lac_changed.clear()
            try:
                await asyncio.wait_for(bk.lac_changed.wait(), deadline - loop.time())
            except TimeoutError:
                continue

    async def entry_checksums(
        self,
        bookie: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        timeout_s: float,
    ) -> ChecksumPage:
        bk = await self._replica_check(bookie, timeout_s)
        st = bk.ledgers.get(ledger_id)
        if st is None:
            return ChecksumPage(last_entry_id, {}, frozenset())
        covered = min(last_entry_id, first_entry_id + bk.checksum_page_entries_max - 1)
        fingerprints = {}
        damaged = set()
        for entry_id in range(first_entry_id, covered + 1):
            blob = st.entries.get(entry_id)
            if blob is None:
                continue
            if bk.is_damaged(ledger_id, entry_id):
                damaged.add(entry_id)
            else:
                fingerprints[entry_id] = (crc32c.crc32c(blob), len(blob))
        return ChecksumPage(covered, fingerprints, frozenset(damaged))

    async def damaged_entries(
        self, bookie: str, *, limit: int, timeout_s: float
    ) -> list[tuple[int, int]]:
        bk = await self._replica_check(bookie, timeout_s)
        return sorted(bk.damaged)[:limit]

    async def _replica_check(self, bookie: str, timeout_s: float) -> MemoryBookie:
        bk = await self._enter(bookie, timeout_s)
        if bk.no_replica_check:
            raise BadRequestError(f"bookie {bookie} does not serve replica checks (upgrade it)")
        return bk


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryAdder:
    """Adds to one ledger on one in-memory bookie (an :class:`EntryAdder`)."""

    bookies: MemoryBookies
    bookie: str
    ledger_id: int
    key: bytes
    recovery: bool
    timeout_s: float

    async def add(self, entry_id: int, lac: int, data: bytes) -> None:
        bk = await self.bookies._enter(self.bookie, self.timeout_s)
        ledger_id, recovery = self.ledger_id, self.recovery
        if self.bookies.before_add is not None:
            res = self.bookies.before_add(self.bookie, ledger_id, entry_id, recovery)
            if asyncio.iscoroutine(res):
                await res
        if bk.down:
            raise ConnectionLostError(f"bookie {self.bookie} went down")
        st = bk.state(ledger_id, self.key)
        if st.fenced and not recovery:
            raise FencedError(f"ledger {ledger_id} is fenced on {self.bookie}")
        if recovery or not bk.is_damaged(ledger_id, entry_id):
            st.entries[entry_id] = data
        if recovery:
            bk.repaired(ledger_id, entry_id)  # replaced by a verified copy
        if lac > st.lac:
            st.lac = lac
            bk.lac_changed.set()

    def add_callback(
        self, entry_id: int, lac: int, data: bytes, callback: AddCallback
    ) -> asyncio.Future[None]:
        task = asyncio.ensure_future(self.add(entry_id, lac, data))

        def done(t: asyncio.Future[None]) -> None:
            if not t.cancelled():
                callback(t.exception())

        task.add_done_callback(done)
        return task


def candidates(n: int, racks: int = 0) -> list[BookieCandidate]:
    return [BookieCandidate(f"bookie-{i}", f"rack-{i % racks}" if racks else "") for i in range(n)]
