"""One suite, every implementation: the ledger client's neighbours
(:class:`ledger.interfaces.MetadataStore`, :class:`ledger.interfaces.BookieTransport`)
behave the same on the in-memory fakes the protocol tests use (:mod:`ledger.testing`)
and on the real adapters -- ZooKeeper behind :class:`ledger.adapters.ZkLedgerStore`,
real bookie processes behind :class:`ledger.adapters.PoolTransport` (the session's
``bookie_cluster``) -- so what the protocol tests show with the fakes holds for the
real thing. The ledger client runs on both too.

Each test gets fresh ledger ids from the store, so the real backend's cluster is shared
safely with the other tests of the session.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from foundation.errors import (
    AlreadyExistsError,
    BadVersionError,
    FencedError,
    NoEntryError,
    NoLedgerError,
    UnauthorizedError,
)
from ledger.adapters import connect_cluster
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.digest import DigestManager, DigestType, master_key
from ledger.interfaces import BookieTransport, MetadataStore
from ledger.placement import BookieCandidate
from ledger.testing import MemoryBookies, MemoryMetadataStore, candidates
from metadata.ledger_metadata import NO_ENTRY, LedgerMetadata, LedgerState, Segment
from tests.conftest import BookieCluster
from tests.waiting import wait_for

KEY = master_key(b"pw")
TIMEOUT_S = 5.0
CONFIG = LedgerConfig(
    add_timeout_ms=2_000,
    read_timeout_ms=2_000,
    fence_timeout_ms=2_000,
    speculative_read_first_timeout_ms=30,
    speculative_read_max_timeout_ms=200,
    long_poll_timeout_ms=1_000,
)


@dataclasses.dataclass
class Backend:
    name: str
    store: MetadataStore
    transport: BookieTransport
    bookies: list[str]  # writable bookie ids, at least 3

    def client(self) -> LedgerClient:
        return LedgerClient(self.store, self.transport, CONFIG)


@pytest.fixture(params=["memory", pytest.param("real", marks=pytest.mark.integration)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        cands = candidates(3)
        ids = [c.bookie_id for c in cands]
        yield Backend("memory", MemoryMetadataStore(cands), MemoryBookies(ids), ids)
        return
    cluster: BookieCluster = request.getfixturevalue("bookie_cluster")
    store, transport, close = await connect_cluster(cluster.zk, cluster.root)
    try:

        async def three_writable() -> list[BookieCandidate] | None:
            writable = await store.writable_bookies()
            return writable if len(writable) >= 3 else None

        writable = await wait_for(three_writable, "3 writable bookies", timeout_s=30)
        yield Backend("real", store, transport, sorted(c.bookie_id for c in writable))
    finally:
        await close()


def meta_of(ledger_id: int, bookies: list[str]) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=(Segment(0, tuple(bookies[:3])),),
        password=b"pw",
        custom={"app": b"conformance"},
        ctime_ms=1,
    )


def blob(ledger_id: int, entry_id: int, payload: bytes = b"p") -> bytes:
    """A packaged entry (the bytes a writer sends), cumulative length = 10 per entry."""
    digest = DigestManager(ledger_id, DigestType.CRC32C, b"pw")
    return digest.package(entry_id, entry_id - 1, 10 * (entry_id + 1), payload.ljust(10, b"."))


# -- MetadataStore ----------------------------------------------------------------------


async def test_ledger_ids_are_distinct(backend: Backend) -> None:
    ids = [await backend.store.next_ledger_id() for _ in range(20)]
    assert len(set(ids)) == 20
    assert min(ids) >= 1


async def test_metadata_create_read_cas_delete(backend: Backend) -> None:
    store = backend.store
    lid = await store.next_ledger_id()
    meta = meta_of(lid, backend.bookies)
    with pytest.raises(NoLedgerError):
        await store.read(lid)
    version = await store.create(meta)
    with pytest.raises(AlreadyExistsError):
        await store.create(meta)
    assert await store.read(lid) == (meta, version)
    marked = meta.with_state(LedgerState.IN_RECOVERY)
    new_version = await store.write(marked, version)
    assert new_version != version
    with pytest.raises(BadVersionError):
        await store.write(meta.closed(5, 60), version)  # stale: the CAS refuses
    assert await store.read(lid) == (marked, new_version)
    await store.delete(lid)
    with pytest.raises(NoLedgerError):
        await store.read(lid)
    with pytest.raises(NoLedgerError):
        await store.write(marked, new_version)
    with pytest.raises(NoLedgerError):
        await store.delete(lid)


async def test_writable_bookies_are_candidates(backend: Backend) -> None:
    found = await backend.store.writable_bookies()
    assert all(isinstance(c, BookieCandidate) for c in found)
    assert {c.bookie_id for c in found} >= set(backend.bookies)


# -- BookieTransport ---------------------------------------------------------------------


async def test_add_then_read_back(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[0]
    t = backend.transport
    adder = t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S)
    for e in range(3):
        await adder.add(e, e - 1, blob(lid, e))
    answer = await t.read(bookie, lid, 1, fence=False, master_key=KEY, timeout_s=TIMEOUT_S)
    assert (answer.entry_id, answer.data) == (1, blob(lid, 1))
    assert answer.lac == 1  # the highest LAC an add carried
    with pytest.raises(NoEntryError):
        await t.read(bookie, lid, 7, fence=False, master_key=KEY, timeout_s=TIMEOUT_S)
    with pytest.raises(NoLedgerError):
        await t.read(bookie, lid + 1_000_000, 0, fence=False, master_key=KEY, timeout_s=TIMEOUT_S)


async def test_add_under_another_master_key_is_refused(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[0]
    await backend.transport.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S).add(0, -1, blob(lid, 0))
    other = backend.transport.adder(bookie, lid, master_key(b"other"), timeout_s=TIMEOUT_S)
    with pytest.raises(UnauthorizedError):
        await other.add(1, 0, blob(lid, 1))


async def test_fence_stops_normal_adds_but_not_recovery_adds(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[0]
    t = backend.transport
    await t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S).add(0, -1, blob(lid, 0))
    fenced = await t.read(bookie, lid, NO_ENTRY, fence=True, master_key=KEY, timeout_s=TIMEOUT_S)
    assert (fenced.entry_id, fenced.data) == (0, blob(lid, 0))  # the last entry it holds
    with pytest.raises(FencedError):
        await t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S).add(1, 0, blob(lid, 1))
    recovery = t.adder(bookie, lid, KEY, recovery=True, timeout_s=TIMEOUT_S)
    await recovery.add(1, 0, blob(lid, 1))
    answer = await t.read(bookie, lid, 1, fence=False, master_key=KEY, timeout_s=TIMEOUT_S)
    assert answer.data == blob(lid, 1)


async def test_fencing_a_ledger_the_bookie_never_saw(backend: Backend) -> None:
    """Recovery counts "fenced, holds nothing" (NO_ENTRY or NO_LEDGER) as fenced: the
    fence must then stick, so a late add of the old writer is refused."""
    lid = await new_ledger(backend)
    bookie = backend.bookies[1]
    t = backend.transport
    with pytest.raises((NoEntryError, NoLedgerError)):
        await t.read(bookie, lid, NO_ENTRY, fence=True, master_key=KEY, timeout_s=TIMEOUT_S)
    with pytest.raises(FencedError):
        await t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S).add(0, -1, blob(lid, 0))


async def test_add_callback_reports_each_outcome(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[2]
    t = backend.transport
    adder = t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S)
    outcomes: asyncio.Queue[BaseException | None] = asyncio.Queue()
    for e in range(5):
        adder.add_callback(e, e - 1, blob(lid, e), outcomes.put_nowait)
    assert [await outcomes.get() for _ in range(5)] == [None] * 5
    await t.read(bookie, lid, NO_ENTRY, fence=True, master_key=KEY, timeout_s=TIMEOUT_S)
    adder.add_callback(5, 4, blob(lid, 5), outcomes.put_nowait)
    assert isinstance(await outcomes.get(), FencedError)


async def test_long_poll_for_the_lac_carries_the_next_entry(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[0]
    t = backend.transport
    adder = t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S)
    await adder.add(0, -1, blob(lid, 0))
    await adder.add(1, 0, blob(lid, 1))
    now = await t.read_lac(bookie, lid, NO_ENTRY, 0, timeout_s=TIMEOUT_S, master_key=KEY)
    assert now.lac == 0
    assert (now.next_entry_id, now.next_entry) == (0, blob(lid, 0))
    poll = asyncio.ensure_future(
        t.read_lac(bookie, lid, 0, 2_000, timeout_s=TIMEOUT_S, master_key=KEY)
    )
    await asyncio.sleep(0.05)  # behaviour: the poll is not answered early
    assert not poll.done()  # held until the LAC moves past 0
    await adder.add(2, 1, blob(lid, 2))
    answer = await asyncio.wait_for(poll, TIMEOUT_S)
    assert answer.lac == 1
    assert (answer.next_entry_id, answer.next_entry) == (1, blob(lid, 1))


async def test_explicit_lac(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[1]
    t = backend.transport
    adder = t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S)
    for e in range(3):
        await adder.add(e, e - 1, blob(lid, e))
    assert await t.write_lac(bookie, lid, 2, KEY, timeout_s=TIMEOUT_S)
    assert (
        await t.read_lac(bookie, lid, NO_ENTRY, 0, timeout_s=TIMEOUT_S, master_key=KEY)
    ).lac == 2
    assert await t.write_lac(bookie, lid, 7, KEY, timeout_s=TIMEOUT_S)
    assert (
        await t.read_lac(bookie, lid, NO_ENTRY, 0, timeout_s=TIMEOUT_S, master_key=KEY)
    ).lac == 2  # held
    with pytest.raises(UnauthorizedError):
        await t.write_lac(bookie, lid, 2, master_key(b"other"), timeout_s=TIMEOUT_S)


async def new_ledger(backend: Backend) -> int:
    """A ledger id with metadata (password b"pw"): a bookie takes a ledger's first add
    or fence only for a ledger that exists, under its key."""
    lid = await backend.store.next_ledger_id()
    await backend.store.create(meta_of(lid, backend.bookies))
    return lid


async def test_reads_need_the_ledgers_key(backend: Backend) -> None:
    lid = await new_ledger(backend)
    bookie = backend.bookies[0]
    t = backend.transport
    await t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S).add(0, -1, blob(lid, 0))
    for key in (b"", master_key(b"other")):
        with pytest.raises(UnauthorizedError):
            await t.read(bookie, lid, 0, fence=False, master_key=key, timeout_s=TIMEOUT_S)
        with pytest.raises(UnauthorizedError):
            await t.read(bookie, lid, NO_ENTRY, fence=True, master_key=key, timeout_s=TIMEOUT_S)
        with pytest.raises(UnauthorizedError):
            await t.read_lac(bookie, lid, NO_ENTRY, 0, timeout_s=TIMEOUT_S, master_key=key)
    await t.adder(bookie, lid, KEY, timeout_s=TIMEOUT_S).add(1, 0, blob(lid, 1))  # still open


# -- the ledger client on both -----------------------------------------------------------


async def test_write_close_reopen_read(backend: Backend) -> None:
    client = backend.client()
    w = await client.create_ledger(password=b"pw", custom={"k": b"v"})
    ids = await asyncio.gather(*[await w.submit(b"e%d" % i) for i in range(50)])
    assert ids == list(range(50))
    await w.close()
    r = await client.open_ledger(w.ledger_id, b"pw")
    assert (r.is_closed, r.last_add_confirmed) == (True, 49)
    assert r.length == sum(len(b"e%d" % i) for i in range(50))
    assert await r.read(0, 49) == [b"e%d" % i for i in range(50)]
    assert r.metadata.custom == {"k": b"v"}
    await client.delete_ledger(w.ledger_id)
    with pytest.raises(NoLedgerError):
        await client.open_ledger(w.ledger_id, b"pw")


async def test_recovery_fences_the_writer_and_keeps_every_acked_entry(backend: Backend) -> None:
    client = backend.client()
    w = await client.create_ledger(password=b"pw")
    for i in range(20):
        await w.add_entry(b"%d" % i)
    r = await client.open_ledger(w.ledger_id, b"pw", recover=True)
    assert r.is_closed
    assert r.last_add_confirmed >= 19
    assert await r.read(0, 19) == [b"%d" % i for i in range(20)]
    with pytest.raises(FencedError):
        await w.add_entry(b"after the fence")
    await w.close()  # a fenced writer closes locally; the recoverer owns the end
    meta, _version = await client.store.read(w.ledger_id)
    assert (meta.state, meta.last_entry_id) == (LedgerState.CLOSED, r.last_add_confirmed)


async def test_tailing_reader_sees_pushed_lacs(backend: Backend) -> None:
    client = backend.client()
    w = await client.create_ledger(password=b"pw")
    r = await client.open_ledger(w.ledger_id, b"pw", recover=False)
    for i in range(5):
        await w.add_entry(b"%d" % i)
    w.push_lac()
    assert await r.wait_lac(NO_ENTRY, 2_000) >= 0

    async def at_4() -> bool:  # one turn: a long poll past the LAC the reader knows
        return r.last_add_confirmed >= 4 or await r.wait_lac(r.last_add_confirmed, 500) >= 4

    await wait_for(at_4, "the reader to see LAC 4", timeout_s=TIMEOUT_S, interval_s=0)
    assert await r.read(0, 4) == [b"%d" % i for i in range(5)]
    await w.close()
