"""The replica check without processes: the work-item range format, the worker's repair
plan, and the scrub's judgement against in-memory bookies with injected damage (on
virtual time, :mod:`tests.virtual_time`)."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import ChecksumError
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.digest import DigestType
from ledger.fragments import repair_plan
from ledger.scrub import Problem, Scrubber
from ledger.testing import MemoryBookies, MemoryMetadataStore, candidates
from metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment
from metadata.underreplicated import merge_ranges, ranges_cover
from tests.virtual_time import loop_clock, virtual_time

FAST = LedgerConfig(
    add_timeout_ms=300,
    read_timeout_ms=300,
    fence_timeout_ms=300,
    speculative_read_first_timeout_ms=20,
    speculative_read_max_timeout_ms=100,
    long_poll_timeout_ms=300,
)
ENTRIES = 60


# -- ranges and plans (pure) --------------------------------------------------------------


def test_merge_ranges_coalesces_and_bounds() -> None:
    assert merge_ranges([(5, 6), (1, 2), (3, 4), (9, 12), (10, 11)]) == ((1, 6), (9, 12))
    assert merge_ranges([(1, 2), (4, 4)]) == ((1, 2), (4, 4))  # 3 is not in either
    # Over the limit the ranges across the smallest gaps are joined (over-covering only).
    assert merge_ranges([(0, 0), (10, 10), (12, 12), (30, 30)], limit=2) == ((0, 12), (30, 30))
    assert merge_ranges([]) == ()


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 50)), max_size=60),
    st.integers(1, 10),
)
def test_merged_ranges_cover_what_they_merged(raw: list[tuple[int, int]], limit: int) -> None:
    ranges = [(a, a + n) for a, n in raw]
    merged = merge_ranges(ranges, limit)
    assert len(merged) <= limit
    assert all(a <= b < c for (a, b), (c, _d) in itertools.pairwise(merged))
    assert ranges_cover(merged, merge_ranges(ranges, 10_000))


def test_repair_plan_follows_the_write_sets() -> None:
    # E=3, Qw=2: entry i on positions i%3, (i+1)%3; "c" moved to position 1 at entry 10.
    meta = LedgerMetadata(
        ledger_id=5,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        segments=(Segment(0, ("a", "b", "c")), Segment(10, ("a", "c", "d"))),
        state=LedgerState.CLOSED,
        last_entry_id=20,
    )
    plan = repair_plan(meta, {"c": ((0, 30),), "a": ((3, 4),), "z": ((0, 5),)}, skip={"z"})
    for entry_id, targets in plan.items():
        assert all(t in meta.replicas(entry_id) for t in targets)
    wanted_c = [e for e in range(21) if "c" in meta.replicas(e)]
    assert sorted(e for e, t in plan.items() if "c" in t) == wanted_c  # never past the end
    # 3 is on positions 0 and 1, 4 on 1 and 2: only 3 is on "a" (position 0).
    assert [e for e, t in plan.items() if "a" in t] == [3]


# -- the scrub against in-memory bookies ---------------------------------------------------


async def setup(
    write_quorum: int = 3, page_entries: int = 16
) -> tuple[LedgerClient, MemoryBookies, Scrubber, int]:
    cands = candidates(3)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    client = LedgerClient(
        MemoryMetadataStore(cands), bookies, FAST, clock=loop_clock(), rng=random.Random(1)
    )
    w = await client.create_ledger(
        ensemble_size=3, write_quorum=write_quorum, ack_quorum=2, password=b"pw"
    )
    await asyncio.gather(*[await w.submit(b"entry-%d" % i) for i in range(ENTRIES)])
    await w.close()
    for bk in bookies.bookies.values():
        bk.checksum_page_entries_max = 7  # answers in parts: the scrub pages through
    scrubber = Scrubber(client.env, bookies, page_entries=page_entries, ledgers_in_flight_max=2)
    return client, bookies, scrubber, w.ledger_id


@virtual_time
async def test_a_clean_ledger_is_clean() -> None:
    _client, _bookies, scrubber, ledger_id = await setup()
    report = await scrubber.check_ledger(ledger_id)
    assert report.state == "checked"
    assert report.entries_checked == ENTRIES
    assert report.clean
    assert not report.counts
    assert not report.unchecked


@pytest.mark.parametrize("write_quorum", [2, 3])
@virtual_time
async def test_missing_entries_become_one_range_per_run(write_quorum: int) -> None:
    client, bookies, scrubber, ledger_id = await setup(write_quorum)
    meta, _v = await client.store.read(ledger_id)
    victim = "bookie-1"
    entries = bookies[victim].ledgers[ledger_id].entries
    held = sorted(entries)
    for e in held[5:]:  # the bookie lost everything from its sixth entry on
        del entries[e]
    report = await scrubber.check_ledger(ledger_id)
    assert report.counts == {victim: {Problem.MISSING: len(held) - 5}}
    # One range although the bookie's entries are not consecutive ids when Qw < E.
    assert report.repairs == {victim: ((held[5], ENTRIES - 1),)}
    plan = repair_plan(meta, report.repairs, set())
    assert sorted(plan) == held[5:]


@virtual_time
async def test_damaged_and_silently_changed_copies() -> None:
    _client, bookies, scrubber, ledger_id = await setup()
    bookies["bookie-0"].corrupt(ledger_id, 3, detected=True)  # the bookie noticed
    bookies["bookie-2"].corrupt(ledger_id, 40)  # it did not: the bytes differ
    report = await scrubber.check_ledger(ledger_id)
    assert report.counts == {
        "bookie-0": {Problem.DAMAGED: 1},
        "bookie-2": {Problem.MISMATCHED: 1},
    }
    assert report.repairs == {"bookie-0": ((3, 3),), "bookie-2": ((40, 40),)}


@virtual_time
async def test_no_verified_copy_is_reported_not_repaired() -> None:
    _client, bookies, scrubber, ledger_id = await setup()
    bookies["bookie-0"].corrupt(ledger_id, 7)
    bookies["bookie-1"].corrupt(ledger_id, 7)
    bookies["bookie-1"].corrupt(ledger_id, 7)  # flipped back: same bytes as bookie-2
    bookies["bookie-2"].ledgers[ledger_id].entries[7] += b"x"
    report = await scrubber.check_ledger(ledger_id)
    # bookie-1 holds the only copy that verifies: the others are repaired from it.
    assert report.repairs == {"bookie-0": ((7, 7),), "bookie-2": ((7, 7),)}
    bookies["bookie-1"].corrupt(ledger_id, 7)  # now no copy verifies
    report = await scrubber.check_ledger(ledger_id)
    assert report.unrecoverable == 1
    assert report.samples == [7]
    assert report.repairs == {}
    assert not report.clean


@virtual_time
async def test_an_unreachable_bookie_is_not_judged() -> None:
    _client, bookies, scrubber, ledger_id = await setup()
    bookies["bookie-2"].down = True
    del bookies["bookie-0"].ledgers[ledger_id].entries[9]
    report = await scrubber.check_ledger(ledger_id)
    assert set(report.unchecked) == {"bookie-2"}
    assert report.repairs == {"bookie-0": ((9, 9),)}  # the others still compared
    bookies["bookie-2"].down = False
    bookies["bookie-1"].no_replica_check = True  # an old bookie
    report = await scrubber.check_ledger(ledger_id)
    assert set(report.unchecked) == {"bookie-1"}
    assert "upgrade" in report.unchecked["bookie-1"]


@virtual_time
async def test_open_and_deleted_ledgers_are_skipped() -> None:
    client, _bookies, scrubber, closed_id = await setup()
    w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"p")
    await w.add_entry(b"x")
    summary = await scrubber.check_all([closed_id, w.ledger_id, 999])
    assert (summary.ledgers_checked, summary.ledgers_skipped, summary.ledgers_gone) == (1, 1, 1)
    assert summary.entries_checked == ENTRIES
    assert summary.reports == []


@virtual_time
async def test_damaged_sweep_keeps_what_metadata_places_on_the_bookie() -> None:
    client, bookies, scrubber, ledger_id = await setup(write_quorum=2)
    meta, _v = await client.store.read(ledger_id)
    on_0 = [e for e in range(ENTRIES) if "bookie-0" in meta.replicas(e)]
    bookies["bookie-0"].corrupt(ledger_id, on_0[0], detected=True)
    bookies["bookie-0"].corrupt(ledger_id, on_0[1], detected=True)
    bookies["bookie-0"].damaged.add((ledger_id + 100, 1))  # a ledger gone from metadata
    repairs, unchecked = await scrubber.damaged_repairs(["bookie-0", "bookie-1"])
    assert unchecked == {}
    wanted = merge_ranges([(on_0[0], on_0[0]), (on_0[1], on_0[1])])
    assert repairs == {ledger_id: {"bookie-0": wanted}}
    # Repaired by a recovery add: served intact at once and no longer reported, though
    # the bookie keeps the mark until its next checkpoint (as the real engine does).
    bk0 = bookies["bookie-0"]
    bk0.marks_until_checkpoint = True
    key = bk0.ledgers[ledger_id].key
    with pytest.raises(ChecksumError):
        await bookies.read("bookie-0", ledger_id, on_0[0], fence=False, master_key=key, timeout_s=1)
    source = next(b for b in meta.replicas(on_0[0]) if b != "bookie-0")
    data = bookies[source].ledgers[ledger_id].entries[on_0[0]]
    await bookies.adder("bookie-0", ledger_id, key, recovery=True, timeout_s=1).add(
        on_0[0], -1, data
    )
    assert (ledger_id, on_0[0]) in bk0.damaged
    repairs, _unchecked = await scrubber.damaged_repairs(["bookie-0"])
    assert repairs == {ledger_id: {"bookie-0": ((on_0[1], on_0[1]),)}}
    bk0.checkpoint()
    assert (ledger_id, on_0[0]) not in bk0.damaged


@virtual_time
async def test_unregistered_bookies_are_not_asked() -> None:
    _client, bookies, scrubber, ledger_id = await setup()
    bookies["bookie-2"].hung = True  # asking it would wait for the timeout
    report = await scrubber.check_ledger(ledger_id, registered=frozenset({"bookie-0", "bookie-1"}))
    assert report.unchecked == {"bookie-2": "not registered"}
    assert report.repairs == {}
