"""Autorecovery and a live writer that already replaced a lost bookie (issue 22, defect 4).

The write proxy had swapped a killed bookie out of ledger 4's ensemble; seconds later
autorecovery recovered (fenced) the ledger anyway, since it was OPEN past its grace,
and the writer failed. As in BookKeeper, the earlier segments of an open ledger are
complete (a new segment starts after the last acknowledged entry), so they are
re-replicated without fencing; only a lost bookie the writer still writes to (one in
the last segment) is a reason to recover the ledger. The writer's next ensemble change
accepts what the worker changed in the earlier segments.

Worker and work items on real ZooKeeper; the ledger's bookies and metadata in memory.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest

from ledger.client import LedgerClient
from ledger.replication import Outcome, ReplicationWorker
from ledger.testing import MemoryBookies, MemoryMetadataStore, candidates
from ledger.writer import LedgerWriter
from metadata.bookies import BookieInfo
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerState
from tests.metadata_support import metadata_clients
from tests.test_ledger_autorecovery import FAST, LEDGER_FAST
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def md(zk_connect: str, cluster_root: str) -> AsyncIterator[MetadataClient]:
    async with metadata_clients(zk_connect, cluster_root) as c:
        yield await c.new()


async def _write(writer: object, first: int, count: int) -> None:
    futures = [await writer.submit(b"e%d" % i) for i in range(first, first + count)]  # type: ignore[attr-defined]
    await asyncio.gather(*futures)


class _Lost(NamedTuple):
    bookies: MemoryBookies
    store: MemoryMetadataStore
    client: LedgerClient
    writer: LedgerWriter
    victim: str


async def _lose_a_bookie(md: MetadataClient, bookie_count: int, seed: int) -> _Lost:
    """A ledger (E=Qw=3, Qa=2) open for writing with entries 0-9, whose ensemble's first
    bookie then died: down, and gone from the candidates and the registry."""
    cands = candidates(bookie_count)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    store = MemoryMetadataStore(cands)
    client = LedgerClient(store, bookies, LEDGER_FAST, rng=random.Random(seed))
    for c in cands:
        await md.bookies.register(BookieInfo(c.bookie_id, c.bookie_id))
    w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
    await _write(w, 0, 10)
    victim = w.metadata.last_segment.bookies[0]
    bookies[victim].down = True
    store.bookies = [c for c in store.bookies if c.bookie_id != victim]
    await md.bookies.unregister(victim)
    return _Lost(bookies, store, client, w, victim)


async def test_a_writer_that_replaced_a_lost_bookie_is_not_fenced(md: MetadataClient) -> None:
    # A bookie of the ensemble dies: the writer swaps it out and goes on.
    bookies, store, client, w, victim = await _lose_a_bookie(md, bookie_count=5, seed=4)
    lid = w.ledger_id
    await _write(w, 10, 10)
    # The other two make the ack quorum: the adds need not wait for the replacement.
    await wait_for(lambda: w.ensemble_changes >= 1, "the writer's ensemble change")
    meta, _v = await store.read(lid)
    assert len(meta.segments) == 2 and victim not in meta.last_segment.bookies, meta
    # The auditor marks the ledger (its grace for open ledgers: 0 here, long past).
    await md.underreplicated.mark(lid, {victim})
    worker = ReplicationWorker(md, client, FAST, "w")
    assert await worker.run_once() == {lid: Outcome.REPLICATED}
    meta, _v = await store.read(lid)
    assert meta.state is LedgerState.OPEN, "the live writer's ledger was recovered"
    assert victim not in meta.all_bookies(), meta
    replacement = next(
        b for b in meta.segments[0].bookies if b not in w.metadata.segments[0].bookies
    )
    assert set(range(10)) <= set(bookies[replacement].ledgers[lid].entries)
    # (A bookie the change brought in after the last add holds nothing of it yet.)
    held = [bookies[b].ledgers.get(lid) for b in meta.all_bookies()]
    assert not any(state.fenced for state in held if state is not None)
    assert await md.underreplicated.list() == []
    # The writer goes on, through another ensemble change too (it takes the repaired
    # earlier segment instead of failing on "ensembles changed under the writer").
    await _write(w, 20, 5)
    second = w.metadata.last_segment.bookies[1]
    bookies[second].down = True
    store.bookies = [c for c in store.bookies if c.bookie_id != second]
    await _write(w, 25, 5)
    await wait_for(lambda: w.ensemble_changes >= 2, "the writer's second ensemble change")
    await w.close()
    final, _v = await store.read(lid)
    assert final.is_closed and final.last_entry_id == 29, final
    assert final.segments[0] == meta.segments[0], "the repair was undone"


async def test_a_lost_bookie_still_in_the_writers_ensemble_past_its_grace_is_recovered(
    md: MetadataClient,
) -> None:
    """The other case stays as it was: the writer never replaced the bookie (it may be
    dead itself), so past the grace the ledger is recovered and repaired."""
    _bookies, store, client, w, victim = await _lose_a_bookie(md, bookie_count=4, seed=5)
    lid = w.ledger_id
    await md.underreplicated.mark(lid, {victim})
    worker = ReplicationWorker(md, client, FAST, "w")
    assert await worker.run_once() == {lid: Outcome.REPLICATED}
    meta, _v = await store.read(lid)
    assert meta.is_closed and meta.last_entry_id == 9 and victim not in meta.all_bookies()
