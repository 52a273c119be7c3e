"""Ledger ids and the ledger metadata store against real ZooKeeper."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from foundation.errors import AlreadyExistsError, BadVersionError, LockOwnedError, NotFoundError
from metadata import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment
from tests.metadata_support import Clients, metadata_clients, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def clients(zk_connect: str, cluster_root: str) -> AsyncIterator[Clients]:
    async with metadata_clients(zk_connect, cluster_root) as c:
        yield c


@pytest.fixture
async def md(clients: Clients) -> MetadataClient:
    return await clients.new()


def new_ledger(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=(Segment(0, ("b1", "b2", "b3")),),
        password=b"pw",
        ctime_ms=1,
    )


async def test_concurrent_allocators_never_collide(clients: Clients) -> None:
    # Four processes' worth of allocators, each with its own ZooKeeper session; a small
    # block size makes them race on the counter znode many times.
    allocators = [(await clients.new(id_block_size=25)).ledger_ids for _ in range(4)]

    async def take(n: int, alloc_index: int) -> list[int]:
        return [await allocators[alloc_index].next_id() for _ in range(n)]

    batches = await asyncio.gather(*(take(1000, i) for i in range(4)))
    ids = [i for batch in batches for i in batch]
    assert len(ids) == 4000
    assert len(set(ids)) == 4000, "duplicate ledger ids"
    assert min(ids) >= 1
    assert all(b == sorted(b) for b in batches)


async def test_create_read_update_delete(md: MetadataClient) -> None:
    store = md.ledgers
    lid = await md.ledger_ids.next_id()
    assert await store.create(new_ledger(lid)) == 0
    with pytest.raises(AlreadyExistsError):
        await store.create(new_ledger(lid))
    meta, version = await store.read(lid)
    assert meta == new_ledger(lid)
    assert version == 0
    closed = meta.closed(last_entry_id=9, length=100)
    assert await store.update(closed, version) == 1
    with pytest.raises(BadVersionError):
        await store.update(meta.with_state(LedgerState.IN_RECOVERY), version)
    assert (await store.read(lid))[0].is_closed
    await store.delete(lid, 1)
    with pytest.raises(NotFoundError, match=f"ledger {lid}"):
        await store.read(lid)
    with pytest.raises(NotFoundError):
        await store.update(closed, 1)


async def test_twenty_concurrent_cas_exactly_one_wins(clients: Clients) -> None:
    writers = [await clients.new() for _ in range(4)]
    await writers[0].ledgers.create(new_ledger(42))
    meta, version = await writers[0].ledgers.read(42)

    async def attempt(i: int) -> int | BaseException:
        store = writers[i % len(writers)].ledgers
        changed = dataclasses.replace(meta, custom={"writer": str(i).encode()})
        try:
            return await store.update(changed, version)
        except BadVersionError as exc:
            return exc

    results = await asyncio.gather(*(attempt(i) for i in range(20)))
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, BadVersionError)]
    assert winners == [version + 1]
    assert len(losers) == 19
    stored, stored_version = await writers[0].ledgers.read(42)
    assert stored_version == version + 1
    assert "writer" in stored.custom


async def test_list_ids_across_the_hierarchy(md: MetadataClient) -> None:
    ids = [1, 2, 0xFFFF, 0x10000, 0x1_0000_0000, (1 << 63) - 1]
    for lid in reversed(ids):
        await md.ledgers.create(new_ledger(lid))
    assert await md.ledgers.list_ledger_ids() == ids
    assert await md.ledgers.exists(0x10000)
    assert not await md.ledgers.exists(3)


async def test_watch_sees_updates_and_delete(md: MetadataClient) -> None:
    seen: list[tuple[LedgerMetadata, int] | None] = []
    await md.ledgers.create(new_ledger(5))
    watch = await md.ledgers.watch(5, seen.append)
    try:
        assert seen == [(new_ledger(5), 0)]
        await md.ledgers.update(new_ledger(5).with_state(LedgerState.IN_RECOVERY), 0)
        await wait_for(lambda: seen[-1] is not None and seen[-1][1] == 1)
        last = seen[-1]
        assert last is not None
        assert last[0].state is LedgerState.IN_RECOVERY
        await md.ledgers.delete(5)
        await wait_for(lambda: seen[-1] is None)
    finally:
        watch.cancel()


async def test_underreplicated_mark_claim_clear(clients: Clients) -> None:
    a, b = await clients.new(), await clients.new()
    await a.underreplicated.mark(7, {"b1"})
    await b.underreplicated.mark(7, {"b2"})
    item = await a.underreplicated.get(7)
    assert item.missing_bookies == {"b1", "b2"}
    assert await b.underreplicated.list() == [7]
    await a.underreplicated.claim(7, "worker-a")
    with pytest.raises(LockOwnedError) as err:
        await b.underreplicated.claim(7, "worker-b")
    assert err.value.owner == "worker-a"
    # A mark merged after the worker read the item must not be cleared with it.
    await b.underreplicated.mark(7, {"b3"})
    with pytest.raises(BadVersionError):
        await a.underreplicated.clear(7, item.version)
    latest = await a.underreplicated.get(7)
    assert latest.missing_bookies == {"b1", "b2", "b3"}
    await a.underreplicated.clear(7, latest.version)
    assert await b.underreplicated.list() == []
    await b.underreplicated.claim(7, "worker-b")  # a's claim went with the item
    await b.underreplicated.release(7)
