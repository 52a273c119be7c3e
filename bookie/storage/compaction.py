"""Compaction: entry logs whose live fraction fell under ``compaction_threshold`` (their
ledgers were deleted, or entries rewritten by recovery) are copied -- live records
only -- into the compaction log, the index is repointed, and the old log deleted.

Runs on the gc thread. A log with a bad record is compacted from the index (the file no
longer says what it holds); entries that are bad are marked damaged (damage.py), and
the log is deleted only once no index row points into it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from foundation.errors import BooklineError, ChecksumError, IOFailureError

from . import entrylog
from .damage import DamageLog
from .entrylog import EntryLogFiles, EntryLogWriter
from .entrylog_format import Location, decode_expected
from .index import DAMAGE_COMPACTION, Damage, Index
from .state import StorageStats
from .workers import Worker

log = logging.getLogger(__name__)

FatalHandler = Callable[[BaseException], None]
# (ledger, entry, old location, new location) of a copied record.
Move = tuple[int, int, Location, Location]
# (ledger, entry, location, reason) of a record found bad.
Bad = tuple[int, int, Location, str]


class Compactor:
    """Compacts entry logs, one pass at a time."""

    def __init__(self, directory: Path, *, index: Index, files: EntryLogFiles,
                 writer: EntryLogWriter, busy_writers: tuple[EntryLogWriter, ...],
                 damage: DamageLog, counters: StorageStats, worker: Worker,
                 threshold: float, die: FatalHandler) -> None:  # fmt: skip
        """``writer`` takes the copies; no log still open in one of ``busy_writers``
        is a candidate; ``worker`` is the gc thread; ``die`` is told a failure, which is
        fatal (index and logs may be out of step)."""
        self._dir = directory
        self._index = index
        self._files = files
        self._writer = writer
        self._busy_writers = busy_writers
        self._damage = damage
        self._counters = counters
        self._worker = worker
        self._threshold = threshold
        self._die = die
        self._lock = asyncio.Lock()

    async def compact(self) -> int:
        """Compact every candidate log; return the bytes reclaimed."""
        async with self._lock:
            reclaimed = 0
            for log_id in await self._worker.run(self.candidates):
                try:
                    reclaimed += await self._worker.run(self._compact_log, log_id)
                except (OSError, BooklineError) as exc:
                    self._die(exc)
                    raise IOFailureError(f"compaction of entry log {log_id} failed") from exc
            return reclaimed

    def candidates(self) -> list[int]:
        """Logs under the live-fraction threshold that no writer still has open."""
        busy: set[int] = set()
        for writer in self._busy_writers:
            busy |= writer.open_log_ids()
        out = []
        for log_id, (total, live) in sorted(self._index.stats_snapshot().items()):
            if log_id not in busy and total > 0 and live / total < self._threshold:
                out.append(log_id)
        return out

    def _compact_log(self, log_id: int) -> int:
        """GC thread: copy live records to the compaction log, repoint, delete the old.

        The log's records are read in file order. When one is bad, the file can no
        longer say what it holds (a torn tail, or damage: a flipped length hides every
        record after it), so the index does: each entry pointing into the log that the
        scan did not copy is read at its own location, copied when intact, marked
        damaged when not. The log is deleted only once no index row points into it."""
        writer = self._writer
        moves: list[Move] = []
        copied = 0
        scan = entrylog.LogScan(self._dir, log_id)
        for ledger_id, entry_id, loc, record in scan:
            if self._index.get(ledger_id, entry_id) != loc:
                continue  # deleted, or a newer copy exists
            moves.append((ledger_id, entry_id, loc, writer.append_record(record)))
            copied += len(record)
        damaged: list[Bad] = []
        if scan.bad_offset is not None:
            copied += self._compact_from_index(log_id, scan.bad_offset, moves, damaged)
        written = writer.sync() if moves else {}
        if scan.bad_offset is None:
            self._index.relocate(moves, written, log_id)
        elif not self._retire_damaged_log(log_id, moves, written, damaged):
            return 0
        size = self._files.delete(log_id)
        self._counters.compacted_logs += 1
        self._counters.compaction_bytes_reclaimed += max(0, size - copied)
        log.info(
            "compacted entry log %d: %d entries kept, %d bytes freed",
            log_id,
            len(moves),
            size - copied,
        )
        return max(0, size - copied)

    def _compact_from_index(
        self, log_id: int, bad_offset: int, moves: list[Move], damaged: list[Bad]
    ) -> int:
        """GC thread: copy the entries the index places in ``log_id`` that the file scan
        did not reach (it stopped at ``bad_offset``); collect the bad ones in
        ``damaged``. Returns the bytes copied."""
        log.warning(
            "entry log %d: bad record at offset %d; compacting it from the index",
            log_id,
            bad_offset,
        )
        done = {(m[0], m[1]) for m in moves}
        copied = 0
        for ledger_id, entry_id, loc in self._index.rows_in_log(log_id):
            if (ledger_id, entry_id) in done:
                continue
            record = entrylog.read_record(self._dir, loc)
            try:
                if len(record) != loc.length:
                    raise ChecksumError(f"record cut short at {len(record)} of {loc.length} B")
                decode_expected(record, ledger_id, entry_id)
            except ChecksumError as exc:
                damaged.append((ledger_id, entry_id, loc, str(exc)))
                continue
            moves.append((ledger_id, entry_id, loc, self._writer.append_record(record)))
            copied += len(record)
        return copied

    def _retire_damaged_log(
        self, log_id: int, moves: list[Move], written: dict[int, int], damaged: list[Bad]
    ) -> bool:
        """GC thread: repoint the copies, mark the damaged entries, and tell whether the
        log may go: only when no index row points into it any more. Its stats row is
        dropped only then, so a log kept here is compacted again later."""
        self._index.relocate(moves, written, None)
        for ledger_id, entry_id, loc, reason in damaged:
            self._damage.record(
                ledger_id, entry_id, loc, Damage(DAMAGE_COMPACTION, log_id, loc.offset), reason
            )
        left = self._index.rows_in_log(log_id)
        if left:
            log.error(
                "entry log %d: %d indexed entries still point into it after "
                "compaction (first: ledger %d entry %d); keeping the log",
                log_id,
                len(left),
                left[0][0],
                left[0][1],
            )
            return False
        self._index.drop_log_stats(log_id)
        return True
