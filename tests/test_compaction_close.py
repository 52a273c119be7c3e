"""The ledger a compaction swaps in is closed (issue 25 follow-up: a reader part way
through a compacted segment failed with ``NO_ENTRY: ledger 403: entry 66 is beyond the
readable end -1`` on a loaded machine).

Cause: with three bookies and E = Qw = 3, an add that timed out on one bookie after its
entry was acknowledged by the other two started an ensemble change that could find no
spare bookie; the writer failed, and its ``close()`` then closed locally only -- the
ledger stays OPEN in ZooKeeper. (Since issue 22's delayed ensemble change one such
bookie no longer fails the writer; a writer can still fail after its adds, e.g. when
two of the three are lost.) The compactor swapped that ledger in anyway: a reader
(non-recovering) found no closed end and a LAC of -1 (every entry had been sent before
any acknowledgement), so it could read nothing of the segment."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator

import pytest

import streams.compaction
from bookline import LogRecord, Namespace, NamespaceConfig, StreamOptions
from foundation.errors import NotEnoughBookiesError
from ledger.writer import LedgerWriter
from metadata.ledger_metadata import LedgerState
from metadata.segments import TAG_WRITER_LOCK
from streams.compaction import COMPACTOR_LOCK_TAG
from streams.compaction_plan import CompactionPolicy
from streams.records import ReadRecord
from tests.conftest import BookieCluster

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)
POLICY = CompactionPolicy(compact=True, delete_retention_ms=3_600_000)


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"cc{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


def _value(key: int, round_: int) -> bytes:
    return b"%d:%d:" % (key, round_) + b"x" * 40


KEYS, ROUNDS = 20, 5


async def _compact_with_a_writer_failing_after_its_adds(
    ns: Namespace, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write ROUNDS values of KEYS keys (one entry per record, one sealed segment) and
    compact it while the compactor's writer fails after every add was acknowledged."""
    await ns.create_stream(name, StreamOptions())
    w = await ns.open_writer(name)
    for r in range(ROUNDS):
        for k in range(KEYS):
            await w.write(LogRecord(_value(k, r), key=b"%d" % k))
    await w.close()
    real_close = LedgerWriter.close

    async def close_after_the_writer_failed(self: LedgerWriter) -> None:
        if self.metadata.custom.get(TAG_WRITER_LOCK) == COMPACTOR_LOCK_TAG:
            # The writer fails after every add was acknowledged, as when two of its
            # three bookies are lost (no ack quorum, no spare).
            self._fail(NotEnoughBookiesError("no writable bookie outside the ensemble"))
        await real_close(self)

    monkeypatch.setattr(LedgerWriter, "close", close_after_the_writer_failed)
    try:
        await ns.compact(name, POLICY)
    finally:
        monkeypatch.undo()


async def _read_latest(ns: Namespace, name: str) -> dict[bytes | None, bytes | None]:
    seen: list[ReadRecord] = []
    async with await ns.open_reader(name, "earliest") as reader:
        while not seen or seen[-1].sequence_id < KEYS * ROUNDS - 1:
            batch = await reader.read_many(10_000, timeout_s=20)
            assert batch, f"no record within 20 s after {len(seen)}"
            seen.extend(batch)
    return {r.key: r.payload for r in seen}


LATEST = {b"%d" % k: _value(k, ROUNDS - 1) for k in range(KEYS)}


@pytest.mark.integration
async def test_a_compacted_ledger_is_closed_although_its_writer_failed_after_the_adds(
    ns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compactor's writer fails after every add was acknowledged (no ack quorum and
    no spare bookie): the segment still only ever names a closed ledger, which a
    reader reads to the end: each key's latest value."""
    await _compact_with_a_writer_failing_after_its_adds(ns, "failed", monkeypatch)
    [(seg, _v)] = await ns.context.segments("failed")
    meta, _version = await ns.context.md.ledgers.read(seg.ledger_id)
    assert meta.state is LedgerState.CLOSED
    assert meta.last_entry_id == seg.last_entry_id
    assert await _read_latest(ns, "failed") == LATEST


@pytest.mark.integration
async def test_a_segment_swapped_to_a_ledger_left_open_reads_to_its_last_entry(
    ns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compactor without the recovery above swapped in the OPEN ledger (a segment in
    a cluster compacted before the fix): a reader still reads the segment to the end
    its metadata names -- every entry was acknowledged before the swap -- instead of
    NO_ENTRY at the first one (the bookies' LAC is -1)."""
    monkeypatch.setattr(streams.compaction, "_close_by_recovery", _left_open)
    await _compact_with_a_writer_failing_after_its_adds(ns, "left-open", monkeypatch)
    [(seg, _v)] = await ns.context.segments("left-open")
    meta, _version = await ns.context.md.ledgers.read(seg.ledger_id)
    assert meta.state is LedgerState.OPEN  # the state the reader must cope with
    assert await _read_latest(ns, "left-open") == LATEST


async def _left_open(*_args: object) -> None:
    """The compactor before the fix: nothing after a close that stayed local."""
