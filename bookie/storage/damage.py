"""Damaged entries: what a checksum failure on a read, in compaction or in journal
replay leaves behind.

A damaged entry is marked in the index (a ``D`` row, its location a tombstone: see
index.py), so the mark survives restarts and every read of the entry fails with
ChecksumError until a repair -- a recovery add of the entry -- is checkpointed, which
clears it. Its neighbours are still served. Each mark is logged once, naming the file
and offset; every failure is counted (``checksum_failures``).
"""

from __future__ import annotations

import logging
import threading

from . import entrylog, journal_files
from .entrylog_format import Location
from .index import DAMAGE_JOURNAL, DAMAGE_SOURCES, Damage, Index
from .state import StorageStats

log = logging.getLogger(__name__)


class DamageLog:
    """Records damaged entries; any thread (reads, flush and gc threads all find some)."""

    def __init__(self, index: Index, counters: StorageStats) -> None:
        self._index = index
        self._counters = counters
        self._lock = threading.Lock()  # guards the failure counter

    def count_failure(self) -> None:
        """A checksum failure that marks nothing (a good copy exists)."""
        with self._lock:
            self._counters.checksum_failures += 1

    def record(self, ledger_id: int, entry_id: int, found_at: Location | None,
               damage: Damage, reason: str) -> bool:  # fmt: skip
        """Count a checksum failure; mark the entry damaged in the index (persisted,
        reads fail with ChecksumError until a repair) and log it once. Returns True
        when newly marked."""
        self.count_failure()
        if not self._index.mark_damaged(ledger_id, entry_id, found_at, damage):
            return False
        name = (
            entrylog.file_name(damage.file_id)
            if damage.source != DAMAGE_JOURNAL
            else journal_files.file_name(damage.file_id)
        )
        log.warning(
            "damaged entry: ledger %d entry %d in %s at offset %d (found by %s: %s); "
            "reads of it fail until a recovery add repairs it",
            ledger_id,
            entry_id,
            name,
            damage.offset,
            DAMAGE_SOURCES[damage.source],
            reason,
        )
        return True

    def entries(self) -> list[tuple[int, int]]:
        """``(ledger_id, entry_id)`` of every entry marked damaged, sorted."""
        return sorted(self._index.damaged_snapshot())

    def count(self) -> int:
        return self._index.damaged_count()
