"""A ledger writer whose bookie fails or hangs while the others still make the ack
quorum, and no spare bookie exists (issue 22: BookKeeper's delayEnsembleChange): it keeps
acknowledging entries on Qa copies, replaces the bookie once a spare appears, takes it
back when it answers again, and fails only once the ack quorum is lost. In memory, on
virtual time (:mod:`tests.virtual_time`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import random

import pytest

from foundation.errors import BooklineError, NotEnoughBookiesError
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.placement import BookieCandidate
from ledger.scrub import Problem, Scrubber
from ledger.testing import MemoryBookie, MemoryBookies, MemoryMetadataStore
from ledger.writer import LedgerWriter
from tests.test_ledger_protocol import FAST, check_placement, make, record_ack
from tests.virtual_time import virtual_time
from tests.waiting import wait_for

# Entries are added one at a time, a pause apart, so that writing spans many add
# timeouts (FAST: 300 ms) and ensemble-change attempts.
PAUSE_S = 0.05


async def write(w: LedgerWriter, first: int, count: int) -> list[int]:
    """Add entries ``first .. first + count - 1`` one at a time; their acknowledged ids."""
    acked = []
    for i in range(first, first + count):
        acked.append(await w.add_entry(b"%d" % i))
        await asyncio.sleep(PAUSE_S)
    return acked


def all_acknowledged(w: LedgerWriter) -> bool:
    """Every pushed entry is acknowledged, or the writer failed."""
    return w.last_add_confirmed == w.last_add_pushed or w.error is not None


def held(bookies: MemoryBookies, bookie: str, ledger_id: int) -> set[int]:
    return set(bookies[bookie].ledgers[ledger_id].entries)


async def setup(
    config: LedgerConfig = FAST,
) -> tuple[LedgerClient, MemoryMetadataStore, MemoryBookies, LedgerWriter]:
    """Three bookies, one ledger on all three (E = Qw = 3, Qa = 2), 20 entries written."""
    client, store, bookies = make(n=3, config=config)
    w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    assert await write(w, 0, 20) == list(range(20))
    return client, store, bookies, w


@pytest.mark.parametrize("fault", ["hung", "down"])
@virtual_time
async def test_writer_keeps_writing_on_qa_bookies_when_no_spare_exists(fault: str) -> None:
    client, _store, bookies, w = await setup()
    victim = w.metadata.last_segment.bookies[1]
    setattr(bookies[victim], fault, True)
    # 200 entries over 10 s: about 30 add timeouts and far more ensemble-change attempts
    # than ensemble_change_retries_max (10) -- none of which finds a spare.
    assert await write(w, 20, 200) == list(range(20, 220))
    assert w.error is None
    assert w.ensemble_changes == 0
    assert w.metadata.last_segment.bookies[1] == victim  # nothing to replace it with
    missed = set(range(220)) - held(bookies, victim, w.ledger_id)
    assert missed, "the stalled bookie got entries it never answered"
    # Every acknowledged entry is on Qa bookies metadata names, and readable from them.
    check_placement(w.metadata, bookies, list(range(220)))
    w.push_lac()
    reader = await client.open_ledger(w.ledger_id, recover=False)

    async def lac_known() -> bool:
        return await reader.read_lac() == 219

    await wait_for(lac_known, "the reader's LAC 219", interval_s=0.01)
    assert await reader.read(0, 219) == [b"%d" % i for i in range(220)]

    # The bookie answers again: the writer takes it back (a probe add) and it gets every
    # later entry; what it missed is read from the others.
    setattr(bookies[victim], fault, False)
    assert await write(w, 220, 100) == list(range(220, 320))
    assert set(range(300, 320)) <= held(bookies, victim, w.ledger_id)
    assert w.error is None and w.ensemble_changes == 0
    await w.close()
    assert w.metadata.is_closed and w.metadata.last_entry_id == 319
    # Recovery finds the same end; every entry reads back, the holes on the victim
    # notwithstanding ("no such entry" from one bookie is not the end).
    recovered = await client.open_ledger(w.ledger_id, recover=True)
    assert recovered.last_add_confirmed == 319
    assert await recovered.read(0, 319) == [b"%d" % i for i in range(320)]
    check_placement(recovered.metadata, bookies, list(range(320)))

    # What repairs the holes: the replica check of the closed ledger finds the entries
    # the live victim lacks and marks them for re-replication.
    missed = set(range(320)) - held(bookies, victim, w.ledger_id)
    assert missed
    scrubber = Scrubber(client.env, bookies, page_entries=64, ledgers_in_flight_max=1)
    report = await scrubber.check_ledger(w.ledger_id)
    assert report.counts == {victim: {Problem.MISSING: len(missed)}}
    covered = {e for first, last in report.repairs[victim] for e in range(first, last + 1)}
    assert missed <= covered


@virtual_time
async def test_writer_replaces_the_bookie_once_a_spare_appears() -> None:
    client, store, bookies, w = await setup()
    victim = w.metadata.last_segment.bookies[1]
    bookies[victim].down = True
    assert await write(w, 20, 60) == list(range(20, 80))
    assert w.ensemble_changes == 0
    spare = "bookie-9"
    bookies.bookies[spare] = MemoryBookie(spare)
    store.bookies.append(BookieCandidate(spare, ""))
    assert await write(w, 80, 200) == list(range(80, 280))
    assert w.ensemble_changes == 1
    segments = w.metadata.segments
    assert [s.bookies[1] for s in segments] == [victim, spare]
    boundary = segments[1].first_entry_id
    assert 80 <= boundary <= 280
    # The new bookie holds every entry of its segment; the old segment records where the
    # victim's entries end (its missing ones are the auditor's: it is gone).
    assert set(range(boundary, 280)) <= held(bookies, spare, w.ledger_id)
    await w.close()
    check_placement(w.metadata, bookies, list(range(280)))
    recovered = await client.open_ledger(w.ledger_id, recover=True)
    assert recovered.last_add_confirmed == 279
    assert await recovered.read(0, 279) == [b"%d" % i for i in range(280)]


@virtual_time
async def test_writer_fails_once_the_ack_quorum_is_lost() -> None:
    _client, _store, bookies, w = await setup()
    ensemble = w.metadata.last_segment.bookies
    bookies[ensemble[0]].down = True
    assert await write(w, 20, 40) == list(range(20, 60))  # Qa = 2 still holds
    bookies[ensemble[2]].down = True
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie outside"):
        await w.add_entry(b"no quorum")
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie outside"):
        await w.add_entry(b"fails fast after")
    assert w.last_add_confirmed == 59


@virtual_time
async def test_delay_off_fails_without_a_spare_as_before() -> None:
    config = dataclasses.replace(FAST, delay_ensemble_change=False, ensemble_change_retries_max=1)
    _client, _store, bookies, w = await setup(config)
    bookies[w.metadata.last_segment.bookies[0]].down = True
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie outside"):
        await write(w, 20, 100)


@virtual_time
async def test_randomized_stalls_without_a_spare_never_lose_acknowledged_entries() -> None:
    """Bookies of a three-bookie cluster hang and come back at random while a writer
    streams; a recovery at a random point must find every acknowledged entry, whether
    the writer kept going (one bookie out) or failed (two out)."""
    seed = int(os.environ.get("LEDGER_TEST_SEED", random.randrange(2**32)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    for _round in range(6):
        client, _store, bookies = make(n=3, seed=rng.randrange(2**32))
        w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        acked: list[int] = []
        stop_at = rng.randrange(100, 400)
        for i in range(stop_at):
            if rng.random() < 0.02:
                bk = bookies[rng.choice(w.metadata.last_segment.bookies)]
                bk.hung = not bk.hung
            try:
                fut = await w.submit(b"%d" % i)
            except BooklineError:
                break  # two bookies out: the writer failed
            fut.add_done_callback(record_ack(acked))
            await asyncio.sleep(rng.choice((0, 0, 0.01, 0.1)))
        for bk in bookies.bookies.values():
            bk.hung = False
        if w.error is None:  # every bookie answers again: every entry is acknowledged
            await wait_for(
                functools.partial(all_acknowledged, w),
                f"every entry acknowledged (seed={seed})",
                interval_s=0.01,
            )
        r = await client.open_ledger(w.ledger_id, recover=True)
        assert not acked or max(acked) <= r.last_add_confirmed, f"seed={seed}"
        got = await r.read(0, r.last_add_confirmed)
        assert got == [b"%d" % i for i in range(r.last_add_confirmed + 1)], f"seed={seed}"
        check_placement(r.metadata, bookies, acked)


@virtual_time
async def test_a_bookie_that_answers_again_restores_the_ack_quorum() -> None:
    _client, _store, bookies, w = await setup()
    x, y, _z = w.metadata.last_segment.bookies
    bookies[x].hung = True
    assert await write(w, 20, 20) == list(range(20, 40))  # delayed: x failed
    bookies[y].hung = True
    futs = [await w.submit(b"%d" % i) for i in range(40, 50)]
    await wait_for(lambda: {x, y} <= w.failed_bookies, "x and y failed", interval_s=0.01)
    assert not any(f.done() for f in futs)  # one bookie of three cannot acknowledge
    bookies[x].hung = False
    # The writer asks x again (a probe add) before its retries run out; x acknowledges,
    # gets the waiting entries, and x and z make the ack quorum again.
    assert await asyncio.gather(*futs) == list(range(40, 50))
    assert w.error is None
    assert w.failed_bookies == {y}
    assert await write(w, 50, 10) == list(range(50, 60))
    await w.close()
    assert w.metadata.last_entry_id == 59


@virtual_time
async def test_close_does_not_wait_for_a_probe_to_a_hung_bookie() -> None:
    # A long add timeout: a probe to the hung bookie is still unanswered at the close.
    config = dataclasses.replace(FAST, add_timeout_ms=5_000, close_replication_timeout_ms=4_000)
    _client, _store, bookies, w = await setup(config)
    victim = w.metadata.last_segment.bookies[1]
    bookies[victim].hung = True
    n = 20

    async def failed() -> bool:
        nonlocal n
        await write(w, n, 1)
        n += 1
        return victim in w.failed_bookies

    await wait_for(failed, "the hung bookie failed", interval_s=0)
    await write(w, n, 10)  # the first attempts find no spare: probes go to the victim
    loop = asyncio.get_running_loop()
    started = loop.time()
    await w.close()
    assert loop.time() - started < 1.0  # virtual time: the close deadline is 4 s
    assert w.metadata.is_closed and w.metadata.last_entry_id == n + 9
