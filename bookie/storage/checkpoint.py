"""Checkpoints: the memtable into the entry logs and the index, then the journal mark.

Freeze the memtable (adds continue into a fresh one), write it sorted into the active
entry log, fsync, write locations + ledger states in one synced RocksDB batch, then
persist the journal mark and delete journals before it. The mark taken at the freeze is
the end of the last durable group handed to the loop, and every entry before it is in
the frozen memtable, so replaying from the mark never misses an acknowledged entry.

A checkpoint runs on a thread but encodes every entry in Python, so it competes with the
event loop for the GIL; the entry-log batch writer keeps that short (see entrylog.py) and
releases the GIL at every ``pwritev``, i.e. every few hundred records, so no explicit
yielding is needed (measured: ``time.sleep(0)`` every 4096 entries changed nothing).
Periodic checkpoints are jittered (see :func:`checkpoint_delays_s`): bookies started
together would otherwise checkpoint, and slow down, at the same moments, which is
exactly when an ack quorum needs them all.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Final

from foundation.errors import BooklineError, IOFailureError

from .entrylog import AppendedRun, EntryLogWriter
from .index import Index, LedgerRecord
from .journal import Journal, JournalMark
from .memtable import MemTable, MemTables
from .state import Ledgers, StorageStats
from .workers import Worker

log = logging.getLogger(__name__)

# The first periodic checkpoint comes after interval * uniform(lo, hi): a random phase
# spread over one whole interval, never sooner than half an interval after start.
FIRST_CHECKPOINT_SPREAD: Final = (0.5, 1.5)

FatalHandler = Callable[[BaseException], None]
WriteMark = Callable[[JournalMark], None]


class Checkpointer:
    """Runs checkpoints, one at a time (callers hold :attr:`lock`)."""

    def __init__(self, ledgers: Ledgers, mem: MemTables, *, index: Index,
                 writer: EntryLogWriter, worker: Worker, counters: StorageStats,
                 write_mark: WriteMark, die: FatalHandler) -> None:  # fmt: skip
        """``worker`` is the flush thread; ``write_mark`` persists the journal mark
        (blocking); ``die`` is told a failure, which is fatal (the flush may have left
        entry logs, index and mark out of step)."""
        self._ledgers = ledgers
        self._mem = mem
        self._index = index
        self._writer = writer
        self._worker = worker
        self._counters = counters
        self._write_mark = write_mark
        self._die = die
        # Held for a whole checkpoint; ledger deletes take it too (no frozen memtable
        # is being flushed while they drop ledgers).
        self.lock = asyncio.Lock()
        # The mark of the last checkpoint (or the one found at start).
        self.persisted_mark = JournalMark(0, 0)

    async def checkpoint(self, durable_mark: JournalMark, journal: Journal | None) -> None:
        """Checkpoint everything durable up to ``durable_mark`` (caller holds the lock);
        then delete ``journal``'s files before the mark."""
        mem = self._mem
        if (
            not len(mem.active)
            and not self._ledgers.dirty
            and durable_mark == (self.persisted_mark)
        ):
            return
        t0 = time.perf_counter()
        frozen = mem.freeze()
        states = self._ledgers.take_dirty()
        try:
            await self._worker.run(self._flush, frozen, states, durable_mark)
        except (OSError, BooklineError) as exc:
            self._die(exc)
            raise IOFailureError(f"checkpoint failed: {exc}") from exc
        mem.release(frozen)
        self.persisted_mark = durable_mark
        if journal is not None:
            await self._worker.run(journal.delete_before, durable_mark.file_id)
        self._counters.checkpoints += 1
        self._counters.checkpoint_entries += len(frozen)
        self._counters.checkpoint_seconds_total += time.perf_counter() - t0

    def _flush(self, frozen: MemTable, states: dict[int, LedgerRecord], mark: JournalMark) -> None:
        """Flush thread: entry log append + fsync, index batch, then the journal mark."""
        writer = self._writer
        runs: list[AppendedRun] = []
        for ledger_id, entry_ids, payloads in frozen.sorted_runs():
            runs += writer.append_run(ledger_id, entry_ids, payloads)
        written = writer.sync() if runs else {}
        repaired = self._index.write_checkpoint(
            runs, states, written, lambda lid, eid: frozen.get(lid, eid) is not None
        )
        for ledger_id, entry_id in repaired:
            log.info("damaged entry repaired: ledger %d entry %d", ledger_id, entry_id)
        self._write_mark(mark)


def checkpoint_delays_s(
    interval_s: float, jitter_fraction: float, rng: random.Random
) -> Iterator[float]:
    """Seconds to wait before each periodic checkpoint, endlessly.

    The first delay puts this bookie at a random phase of the interval; every later one
    is ``interval_s`` times a uniform factor in ``1 ± jitter_fraction``, so the mean
    period stays ``interval_s`` while bookies that started (or were phase-locked)
    together drift apart. ``jitter_fraction`` 0 gives the fixed, unjittered schedule.
    """
    if jitter_fraction <= 0.0:
        while True:
            yield interval_s
    yield interval_s * rng.uniform(*FIRST_CHECKPOINT_SPREAD)
    low, high = 1.0 - jitter_fraction, 1.0 + jitter_fraction
    while True:
        yield interval_s * rng.uniform(low, high)
