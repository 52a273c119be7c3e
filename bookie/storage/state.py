"""What the storage engine's parts share: the per-ledger state table and the counters.

Event loop thread only, except where a field says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from foundation.errors import NoLedgerError

from .api import NO_ENTRY_ID
from .index import LedgerRecord
from .journal import Completion

# Ids are u64 on the wire; an entry id or LAC must also fit the journal's i64 fields.
U64_MAX: Final = (1 << 64) - 1
I64_MAX: Final = (1 << 63) - 1


@dataclass(slots=True)
class LedgerState:
    """One ledger on this bookie. ``master_key``, ``fenced``, ``lac`` and ``last_entry``
    are persisted at checkpoints (:meth:`record`); the rest lives in memory only."""

    master_key: bytes
    fenced: bool = False
    lac: int = NO_ENTRY_ID
    last_entry: int = NO_ENTRY_ID
    # Long polls waiting for ``lac`` to move (see lac.py).
    waiters: list[Completion] | None = None
    # Highest explicit LAC (WRITE_LAC) received; applied to ``lac`` only up to
    # ``last_entry``. In memory only: what was applied is persisted as ``lac``.
    explicit_lac: int = NO_ENTRY_ID
    # Highest entry received here (durable or on its way through the journal), and the
    # payloads of those not durable yet, for long polls (see :meth:`visible_lac`).
    received: int = NO_ENTRY_ID
    pending: dict[int, bytes] | None = None

    def visible_lac(self) -> int:
        """The LAC long polls are answered with: the writer's (explicit, or carried by
        an add) as far as the entries received here go -- durable on the writer's ack
        quorum, which is what its LAC says, though maybe not yet here, as BookKeeper's
        bookies answer from ledger storage before their journal's fsync -- and never
        below the LAC durable here. Readers then wait for the writer's LAC, not for this
        replica's fsync (issue 26), and never see past it."""
        return max(self.lac, min(self.explicit_lac, self.received))

    def record(self) -> LedgerRecord:
        return LedgerRecord(self.master_key, self.fenced, self.lac, self.last_entry)

    def wake(self) -> None:
        """Tell every long poll waiting on this ledger that its LAC moved (or that the
        ledger is gone)."""
        waiters, self.waiters = self.waiters, None
        for w in waiters or ():
            if not w.done():
                w.set_result(None)


class Ledgers(dict[int, LedgerState]):
    """This bookie's ledgers by id, and ``dirty``: the ids whose persisted state changed
    since the last checkpoint took them."""

    __slots__ = ("dirty",)

    def __init__(self) -> None:
        super().__init__()
        self.dirty: set[int] = set()

    def known(self, ledger_id: int) -> LedgerState:
        """The ledger's state; NoLedgerError when this bookie holds nothing of it."""
        st = self.get(ledger_id)
        if st is None:
            raise NoLedgerError(f"ledger {ledger_id} is not on this bookie")
        return st

    def take_dirty(self) -> dict[int, LedgerRecord]:
        """The persisted state of the ledgers changed since the last call."""
        records = {lid: self[lid].record() for lid in self.dirty if lid in self}
        self.dirty.clear()
        return records


@dataclass(slots=True)
class StorageStats:
    """Counters for the metrics module (plain ints, loop thread unless noted)."""

    adds: int = 0
    add_bytes: int = 0
    adds_rejected_too_many: int = 0
    adds_rejected_read_only: int = 0
    reads: int = 0
    read_bytes: int = 0
    memtable_hits: int = 0
    read_cache_hits: int = 0
    read_cache_misses: int = 0
    read_ahead_entries: int = 0
    checkpoints: int = 0
    checkpoint_entries: int = 0
    checkpoint_seconds_total: float = 0.0
    compacted_logs: int = 0  # written by the gc thread
    compaction_bytes_reclaimed: int = 0
    deleted_ledgers: int = 0
    # Every checksum failure met (reads, compaction, journal replay); any thread,
    # under DamageLog's lock.
    checksum_failures: int = 0
