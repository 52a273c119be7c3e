"""The storage engine's write path (event loop thread).

An add or a fence is checked here, on the loop -- key, fence, read-only state, field
ranges, memtable room -- and only then queued to the journal, so nothing the journal
thread cannot write ever reaches it. The journal hands each fsynced group back
(:meth:`EntryWrites.on_durable`), which puts its entries in the memtable, advances
LACs, wakes long polls and only then acknowledges: the memtable only ever holds
acknowledged (durable) entries.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Final

from bookie.config import BookieConfig
from foundation.errors import (
    BadRequestError,
    FencedError,
    ReadOnlyError,
    TooManyRequestsError,
    UnauthorizedError,
)
from foundation.invariants import invariant

from .api import NO_ENTRY_ID, EntryAdd
from .disk import DiskHealth
from .journal import (
    ADD,
    FENCE,
    MASTER_KEY,
    RECORD_BYTES_MAX,
    Completion,
    Item,
    Journal,
    JournalFullError,
    JournalMark,
)
from .lac import LacTracker
from .memtable import ENTRY_OVERHEAD_BYTES, MemTables
from .state import I64_MAX, U64_MAX, Ledgers, LedgerState, StorageStats

# Entries above this can't be a journal/entry-log record (both cap records at 64 MiB).
PAYLOAD_BYTES_MAX: Final = RECORD_BYTES_MAX - 1024
# Master keys are digests of the ledger password; anything longer is a bad request.
MASTER_KEY_BYTES_MAX: Final = 1024


class EntryWrites:
    """Adds and fences in, durable groups out."""

    def __init__(self, config: BookieConfig, ledgers: Ledgers, mem: MemTables, *,
                 lacs: LacTracker, disk: DiskHealth, counters: StorageStats,
                 writable: Callable[[], Journal], flush_wanted: asyncio.Event) -> None:  # fmt: skip
        """``writable`` returns the journal, or raises why nothing may be written
        (closed, failed); ``flush_wanted`` is set when the memtable wants a checkpoint."""
        self._config = config
        self._ledgers = ledgers
        self._mem = mem
        self._lacs = lacs
        self._disk = disk
        self._counters = counters
        self._writable = writable
        self._flush_wanted = flush_wanted
        self._bytes_max = config.memtable_bytes_max
        # The end of the last durable group handed back (what a checkpoint covers).
        self.durable_mark = JournalMark(0, 0)

    def add_nowait(self, add: EntryAdd, done: Completion) -> None:
        """Check ``add`` and queue its journal record: errors found now are raised now;
        ``done`` is told the outcome once the journal group is fsynced."""
        ledger_id, entry_id, lac, payload = add.ledger_id, add.entry_id, add.lac, add.payload
        master_key, recovery = add.master_key, add.recovery
        jnl = self._writable()
        # Recovery adds go through on a read-only bookie: a ledger being recovered must
        # be able to finish, or its readers stay blocked (as in BookKeeper).
        if self._disk.read_only and not recovery:
            self._counters.adds_rejected_read_only += 1
            raise ReadOnlyError("bookie is read-only")
        # Validated here, on the loop: a value the journal thread cannot encode would
        # otherwise fail the journal, which is fatal for the whole bookie.
        if not (
            0 <= ledger_id <= U64_MAX and 0 <= entry_id <= I64_MAX and NO_ENTRY_ID <= lac <= I64_MAX
        ):
            raise BadRequestError(f"bad ledger/entry/lac {ledger_id}/{entry_id}/{lac}")
        if len(payload) > PAYLOAD_BYTES_MAX or len(master_key) > MASTER_KEY_BYTES_MAX:
            raise BadRequestError(f"payload ({len(payload)} B) or master key too large")
        size = len(payload) + ENTRY_OVERHEAD_BYTES
        mem = self._mem  # MemTables.used_bytes, inline: this runs per add
        if mem.active.bytes + mem.frozen_bytes + mem.reserved_bytes + size > self._bytes_max:
            self._counters.adds_rejected_too_many += 1
            self._flush_wanted.set()
            raise TooManyRequestsError("bookie memtable is full; retry later")
        st = self._ledger_for_write(jnl, ledger_id, master_key)
        if st.fenced and not recovery:
            raise FencedError(f"ledger {ledger_id} is fenced")
        jnl.submit((ADD, ledger_id, entry_id, lac, payload, done))
        mem.reserved_bytes += size
        visible = st.visible_lac()
        # Held for long polls until durable (on_durable moves it to the memtable).
        if st.pending is None:
            st.pending = {}
        st.pending[entry_id] = payload
        st.received = max(st.received, entry_id)
        if lac > st.explicit_lac:
            # The LAC an add carries counts as an explicit LAC at once (the writer then
            # needs no WRITE_LAC for it): applied up to the entries durable here, the
            # rest as they become durable. Its own journal record keeps it for replay.
            self._lacs.apply_explicit(ledger_id, st, lac)
        if st.waiters and st.visible_lac() > visible:
            st.wake()

    async def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence the ledger (journaled, fsynced); the bookie's LAC for it after."""
        jnl = self._writable()
        if not 0 <= ledger_id <= U64_MAX or len(master_key) > MASTER_KEY_BYTES_MAX:
            raise BadRequestError(f"bad ledger id {ledger_id} or master key")
        st = self._ledger_for_write(jnl, ledger_id, master_key)
        # Fenced at once, before the record is durable: no normal add may be accepted
        # after a fence was asked for. Fenced never unfences.
        st.fenced = True
        self._ledgers.dirty.add(ledger_id)
        fut = jnl.create_future()
        jnl.submit((FENCE, ledger_id, -1, -1, b"", fut))
        await fut
        # Adds queued before the fence are durable now (FIFO), so this LAC covers them.
        return st.lac

    def _ledger_for_write(self, jnl: Journal, ledger_id: int, master_key: bytes) -> LedgerState:
        """The ledger's state; a new ledger stores ``master_key`` (journaled)."""
        st = self._ledgers.get(ledger_id)
        if st is None:
            st = self._ledgers[ledger_id] = LedgerState(bytes(master_key))
            self._ledgers.dirty.add(ledger_id)
            jnl.submit((MASTER_KEY, ledger_id, -1, -1, st.master_key, None))
        elif not hmac.compare_digest(st.master_key, master_key):
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        return st

    def on_durable(self, group: list[Item], mark: JournalMark) -> None:
        """On the loop: a group is fsynced. Publish its entries, then acknowledge."""
        mem, ledgers, stats = self._mem, self._ledgers, self._counters
        active, dirty = mem.active, ledgers.dirty
        for rtype, ledger_id, entry_id, lac, data, fut in group:
            if rtype == ADD:
                mem.reserved_bytes -= len(data) + ENTRY_OVERHEAD_BYTES
                st = ledgers.get(ledger_id)
                if st is not None:  # None: deleted while the add was in flight
                    active.put(ledger_id, entry_id, data)
                    if st.pending is not None:
                        st.pending.pop(entry_id, None)
                    st.last_entry = max(st.last_entry, entry_id)
                    # An explicit LAC waits for its entries to be durable here.
                    new_lac = min(st.explicit_lac, st.last_entry) if st.explicit_lac > lac else lac
                    if new_lac > st.lac:
                        visible = st.visible_lac()
                        st.lac = new_lac
                        if st.waiters and st.lac > visible:
                            st.wake()
                    dirty.add(ledger_id)
                stats.adds += 1
                stats.add_bytes += len(data)
            if fut is not None and not fut.done():
                fut.set_result(None)
        invariant(mark >= self.durable_mark, "journal mark went backwards: %s", mark)
        self.durable_mark = mark
        if active.bytes >= self._config.memtable_flush_bytes:
            self._flush_wanted.set()

    def on_rejected(self, group: list[Item], error: JournalFullError) -> None:
        """On the loop: the journal refused a group for want of space (not fatal)."""
        for rtype, ledger_id, entry_id, _lac, data, fut in group:
            if rtype == ADD:
                st = self._ledgers.get(ledger_id)
                if st is not None and st.pending is not None:
                    st.pending.pop(entry_id, None)  # not stored: long polls read elsewhere
                self._mem.reserved_bytes -= len(data) + ENTRY_OVERHEAD_BYTES
                self._counters.adds_rejected_read_only += 1
            if fut is not None and not fut.done():
                fut.set_exception(error)
        self._disk.turn_read_only_for_space(0)
