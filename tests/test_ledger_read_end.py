"""Where "the end" of an open ledger is for a reader opened now (LedgerReader.read_end):
at or after every entry acknowledged before it asked -- even while every bookie's LAC
still lags the last acknowledgement -- but the LAC never moves past what the bookies
confirm. In-memory bookies whose LAC rides on entries only (no explicit LAC), on
virtual time."""

from __future__ import annotations

import asyncio
import random

import pytest

from foundation.errors import ConnectionLostError
from ledger.client import LedgerClient
from ledger.testing import MemoryBookies, MemoryMetadataStore, candidates
from ledger.writer import LedgerWriter
from tests.test_ledger_protocol import FAST
from tests.virtual_time import loop_clock, virtual_time


async def _lagging_ledger() -> tuple[LedgerClient, MemoryBookies, LedgerWriter]:
    """E=Qw=3, Qa=2, bookies without the explicit LAC: each holds the LAC the entries
    carried, one behind the last acknowledged entry."""
    cands = candidates(3)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    for bookie in bookies.bookies.values():
        bookie.no_write_lac = True
    client = LedgerClient(
        MemoryMetadataStore(cands), bookies, FAST, clock=loop_clock(), rng=random.Random(0)
    )
    w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    return client, bookies, w


@virtual_time
async def test_the_end_covers_an_acknowledged_entry_the_bookies_lac_does_not() -> None:
    client, bookies, w = await _lagging_ledger()
    fresh = await client.open_ledger(w.ledger_id, recover=False)
    assert await fresh.read_end() == -1  # no bookie holds anything of it yet
    await w.add_entry(b"0")
    assert await w.add_entry(b"1") == 1  # acknowledged
    ensemble = w.metadata.last_segment.bookies
    assert all(bookies[b].ledgers[w.ledger_id].lac == 0 for b in ensemble)
    r = await client.open_ledger(w.ledger_id, recover=False)
    assert await r.read_lac() == 0  # what every bookie says: one behind the ack
    assert await r.read_end() == 1
    assert r.last_add_confirmed == 0  # never read up to it before a bookie confirms it
    await w.close()


@virtual_time
async def test_the_end_needs_only_enough_bookies_to_meet_every_ack_quorum() -> None:
    """E - Qa + 1 = 2 of 3 answer: one is down, one never got the last entry (the ack
    came from the other two) -- the third, in that ack quorum, still names it."""
    client, bookies, w = await _lagging_ledger()
    slow, down, holder = w.metadata.last_segment.bookies
    await w.add_entry(b"0")
    release = asyncio.Event()

    async def hold(bookie: str, _lid: int, entry_id: int, _rec: bool) -> None:
        if bookie == slow and entry_id == 1:
            await release.wait()

    bookies.before_add = hold
    assert await w.add_entry(b"1") == 1  # acknowledged by ``down`` and ``holder``
    bookies[down].down = True
    r = await client.open_ledger(w.ledger_id, recover=False)
    assert await r.read_end() == 1
    bookies[holder].down = True  # now only one bookie can answer: not enough
    with pytest.raises(ConnectionLostError):
        await r.read_end()
    bookies[holder].down = bookies[down].down = False
    release.set()
    await w.close()
