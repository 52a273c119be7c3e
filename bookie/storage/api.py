"""The contract between the bookie server and its storage engine.

The server (``bookie/server.py``) only talks to storage through this protocol; the
engine (``bookie/storage/engine.py``) implements it. All methods run on the event loop
thread and never block it: fsync happens on the journal thread, RocksDB and entry-log
I/O on executors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .journal import Completion

# Entry id meaning "the last entry this bookie holds for the ledger".
LAST_ENTRY = -1
# LAC value meaning "nothing confirmed yet".
NO_ENTRY_ID = -1


class EntryAdd(Protocol):
    """One add as storage takes it. A decoded :class:`bookie.protocol.AddRequest` is
    one, so the server hands the request over as it is; :class:`NewEntry` is one for
    callers without a request."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def entry_id(self) -> int: ...

    @property
    def lac(self) -> int:
        """The writer's LastAddConfirmed, piggybacked on this entry."""

    @property
    def master_key(self) -> bytes: ...

    @property
    def payload(self) -> bytes:
        """The packaged entry, stored as it is."""

    @property
    def recovery(self) -> bool:
        """A recovery add: accepted on a fenced ledger and a read-only bookie."""


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An :class:`EntryAdd` made by hand (``add_entry``, tests)."""

    ledger_id: int
    entry_id: int
    lac: int
    master_key: bytes
    payload: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class LacResult:
    """Answer to a (long-poll) LAC read: the LAC and, when this bookie holds it, the
    entry ``previous_lac + 1`` piggybacked so a tailing reader needs no extra trip."""

    lac: int
    next_entry_id: int | None
    next_entry: bytes | None
    # Entries next_entry_id + 1, ... when a run was asked for (wait_lac's bytes_max).
    more_entries: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class DiskUsage:
    used_fraction: float
    free_bytes: int
    total_bytes: int
    read_only: bool


class Storage(Protocol):
    async def start(self) -> None:
        """Open directories, check invariants, replay the journal from the mark."""

    async def close(self) -> None:
        """Checkpoint, stop background threads, close files (clean shutdown)."""

    def add_entry_nowait(self, add: EntryAdd, done: Completion) -> None:
        """:meth:`add_entry` without a coroutine: refusals are raised at once, the
        outcome after the journal fsync goes to ``done`` (on the loop thread)."""

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        lac: int,
        master_key: bytes,
        payload: bytes,
        *,
        recovery: bool = False,
    ) -> None:
        """Store one packaged entry; resolve only after it is fsynced in the journal.

        ``lac`` is the writer's LastAddConfirmed piggybacked on this entry; the bookie
        keeps the max it has seen per ledger (for READ_LAC). The first add to a ledger
        stores ``master_key``. Raises UnauthorizedError (key differs), FencedError
        (ledger fenced and not ``recovery``), ReadOnlyError, TooManyRequestsError
        (memtable full), IOFailureError.
        """

    async def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence the ledger (journaled, fsynced) and return the bookie's LAC for it.

        Stores ``master_key`` if the ledger is new here; UnauthorizedError if it differs.
        """

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored payload; ``LAST_ENTRY`` reads the highest entry held.

        NoLedgerError if the ledger is unknown here, NoEntryError if the entry is not.
        """

    def last_add_confirmed(self, ledger_id: int) -> int:
        """Highest LAC seen for the ledger (NoLedgerError if unknown)."""

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> int:
        """Explicit LAC from the writer: raise the ledger's LAC to ``lac`` -- but never
        past the highest entry durable here (the rest is applied as later entries become
        durable); long polls are answered with it at once, as far as the entries
        received here go (``LedgerState.visible_lac``). Not journaled: a LAC is a hint.
        Returns the (durable) LAC now. NoLedgerError (nothing added here yet),
        UnauthorizedError, FencedError."""

    async def wait_lac(
        self, ledger_id: int, previous_lac: int, timeout_s: float, bytes_max: int = 0
    ) -> LacResult:
        """Long poll: return as soon as the LAC told to readers (the writer's, up to the
        entries received here, durable or not yet) > previous_lac, or at the timeout
        with it. Piggyback entry previous_lac+1 when this bookie holds it, and with
        ``bytes_max`` > 0 the contiguous entries after it held in memory, up to the LAC
        and about that many bytes."""

    def watch_lac(self, ledger_id: int, waiter: Completion) -> None:
        """Call ``waiter.set_result(None)`` once, when the ledger's LAC next moves (the
        server's long polls without a task). NoLedgerError if unknown."""

    def unwatch_lac(self, ledger_id: int, waiter: Completion) -> None:
        """Forget a waiter (timed out, or its connection closed); no error if gone."""

    def lac_answer_nowait(
        self, ledger_id: int, previous_lac: int, bytes_max: int = 0
    ) -> LacResult | None:
        """:meth:`wait_lac`'s answer now, without waiting: None when entry
        ``previous_lac + 1`` is not in memory (then ``wait_lac(..., 0, ...)`` reads it
        from disk)."""

    def is_fenced(self, ledger_id: int) -> bool: ...

    def master_key_of(self, ledger_id: int) -> bytes | None:
        """The master key the ledger's first add or fence stored; None when this bookie
        holds nothing of the ledger (cheap: a dict look-up, for every request's check)."""

    def ledgers(self) -> list[int]:
        """Ids of the ledgers this bookie holds (sorted)."""

    async def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id held for a ledger, -1 if none (NoLedgerError if unknown).
        Cheap: no listing of the ledger's entries."""

    async def entries(self, ledger_id: int) -> list[int]:
        """Entry ids held for a ledger (sorted)."""

    def damaged_entries(self) -> list[tuple[int, int]]:
        """``(ledger_id, entry_id)`` of entries this bookie found damaged (a checksum
        failure on a read, in compaction or in journal replay), sorted. Reads of them
        fail with ChecksumError until a repair re-adds a verified copy (a recovery add
        of the same entry), which clears the mark once durable. Kept across restarts."""

    async def delete_ledgers(self, ledger_ids: set[int]) -> None:
        """Drop ledgers (deleted from metadata) from the index and state; GC reclaims."""

    async def compact(self) -> int:
        """Compact entry logs under the live-fraction threshold; return bytes reclaimed."""

    async def checkpoint(self) -> None:
        """Flush the memtable to entry logs + index, persist the journal mark."""

    def disk_usage(self) -> DiskUsage: ...

    def set_read_only(self, read_only: bool) -> None: ...
