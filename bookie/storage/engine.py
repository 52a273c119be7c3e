"""BookieStorage: journal -> memtable -> entry logs + RocksDB index (see api.py).

Write path: ``add_entry`` checks the ledger's key and fence on the loop, queues a journal
record and awaits its group fsync; the journal thread hands the durable group back to
the loop, which puts the entries in the memtable, advances LACs and wakes long polls.
So the memtable only ever holds acknowledged (durable) entries.

Checkpoint: freeze the memtable (adds continue into a fresh one), write it sorted into
the active entry log, fsync, write locations + ledger states in one synced RocksDB batch,
then persist the journal mark and delete journals before it. The mark taken at the
freeze is the end of the last durable group handed to the loop, and every entry before
it is in the frozen memtable, so replaying from the mark never misses an acknowledged
entry.

A checkpoint runs on a thread but encodes every entry in Python, so it competes with the
event loop for the GIL; the entry-log batch writer keeps that short (see entrylog.py) and
releases the GIL at every ``pwritev``, i.e. every few hundred records, so no explicit
yielding is needed (measured: ``time.sleep(0)`` every 4096 entries changed nothing).
Periodic checkpoints are jittered (see :func:`checkpoint_delays_s`): bookies started
together would otherwise checkpoint, and slow down, at the same moments, which is
exactly when an ack quorum needs them all.

Read path: memtable (active, then frozen) -> read cache -> index + entry log on an
executor thread, reading ahead the next entries of the same ledger into the cache.

Threads: the journal thread; ``bookie-read`` (index gets, entry log preads);
``bookie-flush`` (checkpoints, ledger deletes); ``bookie-gc`` (compaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from bookie.config import BookieConfig
from foundation.errors import (
    BadRequestError,
    BooklineError,
    ChecksumError,
    ClosedError,
    FencedError,
    IOFailureError,
    NoEntryError,
    NoLedgerError,
    ReadOnlyError,
    TooManyRequestsError,
    UnauthorizedError,
)
from foundation.invariants import invariant

from . import entrylog, faults, journal
from .api import LAST_ENTRY, NO_ENTRY_ID, DiskUsage, EntryAdd, LacResult, NewEntry
from .cache import ReadCache
from .entrylog import EntryLogFiles, EntryLogWriter, Location, LogIds
from .index import (
    DAMAGE_COMPACTION,
    DAMAGE_JOURNAL,
    DAMAGE_READ,
    DAMAGE_SOURCES,
    TOMBSTONE,
    Damage,
    Index,
    LedgerRecord,
)
from .journal import (
    ADD,
    FENCE,
    MASTER_KEY,
    Completion,
    Item,
    Journal,
    JournalMark,
    JournalRecord,
)
from .memtable import ENTRY_OVERHEAD_BYTES, MemTable

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1
# Entries above this can't be a journal/entry-log record (both cap records at 64 MiB).
PAYLOAD_BYTES_MAX = journal.RECORD_BYTES_MAX - 1024
# Master keys are digests of the ledger password; anything longer is a bad request.
MASTER_KEY_BYTES_MAX = 1024
# Catch-up reads: index gets and entry-log preads run concurrently on this many threads.
READ_THREADS = 4
# A read-ahead never pulls more than this many bytes into the cache at once.
READ_AHEAD_BYTES_MAX = 4 << 20
# A read retries its index lookup this often when compaction moved the entry under it.
READ_ATTEMPTS = 3
# The first periodic checkpoint comes after interval * uniform(lo, hi): a random phase
# spread over one whole interval, never sooner than half an interval after start.
FIRST_CHECKPOINT_SPREAD = (0.5, 1.5)

Fsync = Callable[[int], None]
Clock = Callable[[], float]
FatalHandler = Callable[[BaseException], None]


@dataclass(slots=True)
class _Ledger:
    master_key: bytes
    fenced: bool = False
    lac: int = NO_ENTRY_ID
    last_entry: int = NO_ENTRY_ID
    waiters: list[Completion] | None = None
    # Highest explicit LAC (WRITE_LAC) received; applied to ``lac`` only up to
    # ``last_entry``. In memory only: what was applied is persisted as ``lac``.
    explicit_lac: int = NO_ENTRY_ID

    def record(self) -> LedgerRecord:
        return LedgerRecord(self.master_key, self.fenced, self.lac, self.last_entry)


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
    # under BookieStorage._damage_lock.
    checksum_failures: int = 0


class BookieStorage:
    """The storage engine of one bookie; implements :class:`bookie.storage.api.Storage`."""

    def __init__(
        self,
        config: BookieConfig,
        *,
        fsync: Fsync = os.fdatasync,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        on_fatal: FatalHandler | None = None,
    ) -> None:
        """``fsync``, ``clock`` and ``rng`` are injectable for tests: ``rng`` only picks
        when periodic checkpoints happen; seed it to replay a schedule. File I/O goes
        through :attr:`io`: the ``os`` functions, or the test-only fault shim when
        ``config.fault_shim`` asks for it (see faults.py)."""
        self.config = config
        self._journal_dir = Path(config.journal_dir)
        self._ledgers_dir = Path(config.ledgers_dir)
        self._index_dir = Path(config.index_dir)
        self.io = faults.make_io(
            config.fault_shim,
            (self._journal_dir, self._ledgers_dir, self._index_dir),
            disk_bytes_max=config.fault_disk_bytes_max,
            control_dir=self._journal_dir,
        )
        self._fsync = self.io.wrap_fsync(fsync)
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._on_fatal = on_fatal
        self.counters = StorageStats()
        self._index = Index(self._index_dir)
        self._files = EntryLogFiles(self._ledgers_dir, self.io)
        self._log_ids = LogIds(1)
        self._flush_writer: EntryLogWriter | None = None
        self._compact_writer: EntryLogWriter | None = None
        self._journal: Journal | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ledgers: dict[int, _Ledger] = {}
        self._dirty: set[int] = set()
        self._active = MemTable()
        self._frozen: list[MemTable] = []
        self._frozen_bytes = 0
        self._reserved_bytes = 0  # adds queued in the journal, not yet in the memtable
        self._cache = ReadCache(config.read_cache_bytes_max)
        self._read_only = False
        # Damaged entries live in the index (D rows, see index.py); this lock guards the
        # failure counter, which read, gc and flush threads all bump.
        self._damage_lock = threading.Lock()
        self._fatal: BaseException | None = None
        self._closed = False
        self._started = False
        self._durable_mark = JournalMark(0, 0)
        self._persisted_mark = JournalMark(0, 0)
        self._checkpoint_lock = asyncio.Lock()
        self._compact_lock = asyncio.Lock()
        self._flush_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._read_pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="bookie-read")
        self._flush_pool = ThreadPoolExecutor(1, thread_name_prefix="bookie-flush")
        self._gc_pool = ThreadPoolExecutor(1, thread_name_prefix="bookie-gc")

    # ------------------------------------------------------------------ lifecycle

    def set_fatal_handler(self, handler: FatalHandler) -> None:
        """Called once, on the loop, when an fsync/write error makes the bookie unsafe."""
        self._on_fatal = handler

    async def start(self) -> None:
        invariant(not self._started, "BookieStorage.start called twice")
        self._started = True
        self._loop = asyncio.get_running_loop()
        for d in (self._journal_dir, self._ledgers_dir, self._index_dir):
            d.mkdir(parents=True, exist_ok=True)
        states = await self._run(self._flush_pool, self._index.open)
        for ledger_id, rec in states.items():
            self._ledgers[ledger_id] = _Ledger(rec.master_key, rec.fenced, rec.lac, rec.last_entry)
        await self._run(self._flush_pool, self._open_entry_logs)
        mark = await self._run(self._flush_pool, journal.read_mark, self._ledgers_dir)
        mark = mark or JournalMark(0, 0)
        self._persisted_mark = mark
        replayed = await self._run(self._flush_pool, self._replay, mark)
        cfg = self.config
        self._journal = Journal(
            self._journal_dir,
            file_bytes_max=cfg.journal_file_bytes_max,
            prealloc_bytes=cfg.journal_prealloc_bytes,
            group_bytes_max=cfg.journal_group_bytes_max,
            group_wait_ms=cfg.journal_group_wait_ms,
            flush_when_idle=cfg.journal_flush_when_idle,
            sync=cfg.journal_sync,
            fsync=self._fsync,
            clock=self._clock,
            on_fatal=self._die,
            io=self.io,
            on_space_low=self._journal_space_low,
            on_rejected=self._on_rejected,
        )
        files = journal.list_files(self._journal_dir)
        next_file = max([*files, mark.file_id]) + 1
        try:
            self._durable_mark = self._journal.start(self._loop, next_file, self._on_durable)
        except OSError as exc:
            raise IOFailureError(f"cannot open journal file {next_file}: {exc}") from exc
        log.info(
            "bookie storage started: %d ledgers, %d journal records replayed from %s",
            len(self._ledgers),
            replayed,
            mark,
        )
        if replayed:
            await self.checkpoint()
        self._tasks = [
            asyncio.create_task(self._checkpoint_loop(), name="bookie-checkpoint"),
            asyncio.create_task(self._gc_loop(), name="bookie-gc"),
        ]

    def _open_entry_logs(self) -> None:
        """Blocking: delete logs nothing indexes (crash mid-flush), set up the writers."""
        logs = entrylog.list_logs(self._ledgers_dir)
        for log_id in logs:
            if log_id not in self._index.log_stats:
                log.warning("deleting entry log %d: nothing in the index refers to it", log_id)
                self._files.delete(log_id)
        self._log_ids = LogIds(max([0, *logs, *self._index.log_stats]) + 1)
        cfg = self.config
        self._flush_writer = EntryLogWriter(self._ledgers_dir, self._log_ids,
                                            cfg.entry_log_bytes_max, self._fsync,
                                            cfg.entry_log_sync_bytes, io=self.io)  # fmt: skip
        self._compact_writer = EntryLogWriter(self._ledgers_dir, self._log_ids,
                                              cfg.entry_log_bytes_max, self._fsync,
                                              io=self.io)  # fmt: skip

    def _replay(self, mark: JournalMark) -> int:
        """Blocking, before the journal thread starts: journal records -> memtable."""
        result = journal.replay(self._journal_dir, mark)
        if result.last_file_id >= 0:
            path = self._journal_dir / journal.file_name(result.last_file_id)
            if not result.tail_clean:
                log.warning(
                    "journal %s has a torn tail at offset %d; cutting it off", path, result.tail_end
                )
            if not result.tail_clean or path.stat().st_size > result.tail_end:
                journal.truncate_tail(
                    self._journal_dir, result.last_file_id, result.tail_end, self._fsync, self.io
                )
        for rec, _end in result.records:
            self._apply(rec)
        for file_id, bad in result.damaged:
            self._replay_damaged(file_id, bad)
        return len(result.records)

    def _replay_damaged(self, file_id: int, bad: journal.DamagedRecord) -> None:
        """An acknowledged ADD whose payload is damaged in the journal: the entry is
        known (its header checks out) but held damaged, until a repair re-adds it --
        unless a good copy was replayed too (a recovery add), or is indexed."""
        rec = bad.record
        st = self._ledgers.get(rec.ledger_id)
        if st is None:
            return  # a deleted ledger, as in _apply
        st.last_entry = max(st.last_entry, rec.entry_id)
        st.lac = max(st.lac, rec.lac)
        self._dirty.add(rec.ledger_id)
        if self._active.get(rec.ledger_id, rec.entry_id) is not None:
            with self._damage_lock:
                self.counters.checksum_failures += 1
            return
        self._record_damage(
            rec.ledger_id,
            rec.entry_id,
            None,
            Damage(DAMAGE_JOURNAL, file_id, bad.offset),
            bad.reason,
        )

    def _apply(self, rec: JournalRecord) -> None:
        st = self._ledgers.get(rec.ledger_id)
        if rec.type == MASTER_KEY:
            if st is None:
                self._ledgers[rec.ledger_id] = _Ledger(rec.data)
                self._dirty.add(rec.ledger_id)
            elif st.master_key != rec.data:
                log.warning(
                    "ledger %d: journal holds a second master key; keeping the first", rec.ledger_id
                )
        elif st is None:
            # Its MASTER_KEY record is before the mark, so its state was checkpointed
            # and is gone now: the ledger was deleted. Don't resurrect it.
            log.debug("journal record for deleted ledger %d skipped", rec.ledger_id)
        elif rec.type == FENCE:
            st.fenced = True
            self._dirty.add(rec.ledger_id)
        else:
            self._active.put(rec.ledger_id, rec.entry_id, rec.data)
            st.last_entry = max(st.last_entry, rec.entry_id)
            st.lac = max(st.lac, rec.lac)
            self._dirty.add(rec.ledger_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_tasks()
        if self._journal is not None:
            await asyncio.to_thread(self._journal.stop)
            await asyncio.sleep(0)  # run the last durable-group callbacks
        try:
            if self._fatal is None and self._journal is not None:
                await self.checkpoint()
        finally:
            await asyncio.to_thread(self._shutdown_blocking)

    async def abort(self) -> None:
        """Stop at once, without a checkpoint or writing queued records: what kill -9
        leaves on disk. Tests use it to simulate a crash; the server may use it after a
        fatal error instead of :meth:`close`."""
        if self._closed:
            return
        self._closed = True
        await self._stop_tasks()
        if self._journal is not None:
            await asyncio.to_thread(self._journal.stop, drain=False)
            self._journal.fail_queued(ClosedError("bookie storage aborted"))
        await asyncio.to_thread(self._shutdown_blocking)

    async def _stop_tasks(self) -> None:
        """Stop the background loops. The checkpoint loop is woken, not cancelled: a
        cancelled checkpoint would leave its flush running without the lock."""
        self._flush_wanted.set()
        for task in self._tasks:
            if task.get_name() != "bookie-checkpoint":
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _shutdown_blocking(self) -> None:
        for pool in (self._read_pool, self._flush_pool, self._gc_pool):
            pool.shutdown(wait=True)
        for writer in (self._flush_writer, self._compact_writer):
            if writer is not None:
                writer.close()
        self._files.close()
        self._index.close()

    def _die(self, exc: BaseException) -> None:
        """Fatal I/O error: stop acknowledging, tell the server (once)."""
        if self._fatal is not None:
            return
        self._fatal = exc
        log.critical("bookie storage failed fatally: %s", exc)
        if self._on_fatal is not None:
            self._on_fatal(exc)

    def _check_writable(self) -> Journal:
        if self._fatal is not None:
            raise IOFailureError("bookie storage failed; not accepting writes") from self._fatal
        if self._closed or self._journal is None:
            raise ClosedError("bookie storage is closed or not started")
        return self._journal

    async def _run(self, pool: ThreadPoolExecutor, fn: Callable[..., _T], *args: Any) -> _T:
        """Blocking storage work on an executor; OSError becomes IOFailureError here."""
        loop = self._loop or asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool, fn, *args)
        except OSError as exc:
            raise IOFailureError(f"{getattr(fn, '__name__', fn)}: {exc}") from exc

    # ------------------------------------------------------------------ write path

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
        jnl = self._check_writable()
        fut = jnl.create_future()
        self.add_entry_nowait(
            NewEntry(ledger_id, entry_id, lac, master_key, payload, recovery), fut
        )
        await fut

    def add_entry_nowait(self, add: EntryAdd, done: Completion) -> None:
        """:meth:`add_entry` without a coroutine: errors found now are raised now;
        ``done`` is told the outcome once the journal group is fsynced (server fast
        path: no task, no future per add)."""
        ledger_id, entry_id, lac, payload = add.ledger_id, add.entry_id, add.lac, add.payload
        master_key, recovery = add.master_key, add.recovery
        jnl = self._check_writable()
        # Recovery adds go through on a read-only bookie: a ledger being recovered must
        # be able to finish, or its readers stay blocked (as in BookKeeper).
        if self._read_only and not recovery:
            self.counters.adds_rejected_read_only += 1
            raise ReadOnlyError("bookie is read-only")
        # Validated here, on the loop: a value the journal thread cannot encode would
        # otherwise fail the journal, which is fatal for the whole bookie.
        if not (
            0 <= ledger_id <= _U64_MAX
            and 0 <= entry_id <= _I64_MAX
            and NO_ENTRY_ID <= lac <= _I64_MAX
        ):
            raise BadRequestError(f"bad ledger/entry/lac {ledger_id}/{entry_id}/{lac}")
        if len(payload) > PAYLOAD_BYTES_MAX or len(master_key) > MASTER_KEY_BYTES_MAX:
            raise BadRequestError(f"payload ({len(payload)} B) or master key too large")
        size = len(payload) + ENTRY_OVERHEAD_BYTES
        if self._active.bytes + self._frozen_bytes + self._reserved_bytes + size > (
            self.config.memtable_bytes_max
        ):
            self.counters.adds_rejected_too_many += 1
            self._flush_wanted.set()
            raise TooManyRequestsError("bookie memtable is full; retry later")
        st = self._ledger_for_write(jnl, ledger_id, master_key)
        if st.fenced and not recovery:
            raise FencedError(f"ledger {ledger_id} is fenced")
        jnl.submit((ADD, ledger_id, entry_id, lac, payload, done))
        self._reserved_bytes += size
        if lac > st.explicit_lac:
            # The LAC an add carries counts as an explicit LAC at once (the writer then
            # needs no WRITE_LAC for it): applied up to the entries durable here, the
            # rest as they become durable. Its own journal record keeps it for replay.
            self._apply_explicit_lac(ledger_id, st, lac)

    def _journal_space_low(self, free_bytes: int) -> None:
        """Journal thread: the next preallocation would not fit with margin."""
        loop = self._loop
        if loop is not None and not self._read_only:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody adds any more
                loop.call_soon_threadsafe(self._turn_read_only_for_space, free_bytes)

    def _turn_read_only_for_space(self, free_bytes: int) -> None:
        """On the loop: stop taking normal adds before the journal disk fills. The
        server's disk check keeps it so (the journal's reserve counts as used in
        :meth:`disk_usage`) until usage is under ``disk_usage_lwm`` again."""
        if not self._read_only:
            log.warning(
                "journal disk has %d bytes free, too few for the next %d B "
                "preallocation plus %d B margin: turning read-only",
                free_bytes,
                self.config.journal_prealloc_bytes,
                journal.SPACE_MARGIN_BYTES,
            )
            self.set_read_only(True)

    def _on_rejected(self, group: list[Item], error: journal.JournalFullError) -> None:
        """On the loop: the journal refused a group for want of space (not fatal)."""
        for rtype, _ledger_id, _entry_id, _lac, data, fut in group:
            if rtype == ADD:
                self._reserved_bytes -= len(data) + ENTRY_OVERHEAD_BYTES
                self.counters.adds_rejected_read_only += 1
            if fut is not None and not fut.done():
                fut.set_exception(error)
        self._turn_read_only_for_space(0)

    def _ledger_for_write(self, jnl: Journal, ledger_id: int, master_key: bytes) -> _Ledger:
        st = self._ledgers.get(ledger_id)
        if st is None:
            st = self._ledgers[ledger_id] = _Ledger(bytes(master_key))
            self._dirty.add(ledger_id)
            jnl.submit((MASTER_KEY, ledger_id, -1, -1, st.master_key, None))
        elif st.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        return st

    def _on_durable(self, group: list[Item], mark: JournalMark) -> None:
        """On the loop: a group is fsynced. Publish its entries, then acknowledge."""
        active, ledgers, dirty, stats = self._active, self._ledgers, self._dirty, self.counters
        for rtype, ledger_id, entry_id, lac, data, fut in group:
            if rtype == ADD:
                self._reserved_bytes -= len(data) + ENTRY_OVERHEAD_BYTES
                st = ledgers.get(ledger_id)
                if st is not None:  # None: deleted while the add was in flight
                    active.put(ledger_id, entry_id, data)
                    st.last_entry = max(st.last_entry, entry_id)
                    # An explicit LAC waits for its entries to be durable here.
                    new_lac = min(st.explicit_lac, st.last_entry) if st.explicit_lac > lac else lac
                    if new_lac > st.lac:
                        st.lac = new_lac
                        if st.waiters:
                            _wake(st)
                    dirty.add(ledger_id)
                stats.adds += 1
                stats.add_bytes += len(data)
            if fut is not None and not fut.done():
                fut.set_result(None)
        invariant(mark >= self._durable_mark, "journal mark went backwards: %s", mark)
        self._durable_mark = mark
        if active.bytes >= self.config.memtable_flush_bytes:
            self._flush_wanted.set()

    async def fence(self, ledger_id: int, master_key: bytes) -> int:
        jnl = self._check_writable()
        if not 0 <= ledger_id <= _U64_MAX or len(master_key) > MASTER_KEY_BYTES_MAX:
            raise BadRequestError(f"bad ledger id {ledger_id} or master key")
        st = self._ledger_for_write(jnl, ledger_id, master_key)
        # Fenced at once, before the record is durable: no normal add may be accepted
        # after a fence was asked for. Fenced never unfences.
        st.fenced = True
        self._dirty.add(ledger_id)
        fut = jnl.create_future()
        jnl.submit((FENCE, ledger_id, -1, -1, b"", fut))
        await fut
        # Adds queued before the fence are durable now (FIFO), so this LAC covers them.
        return st.lac

    # ------------------------------------------------------------------ read path

    def _ledger(self, ledger_id: int) -> _Ledger:
        st = self._ledgers.get(ledger_id)
        if st is None:
            raise NoLedgerError(f"ledger {ledger_id} is not on this bookie")
        return st

    def _read_in_memory(self, ledger_id: int, entry_id: int) -> bytes | None:
        """A read served from the memtables or the read cache (counted), else None."""
        stats = self.counters
        payload = self._memory_get(ledger_id, entry_id)
        if payload is not None:
            stats.memtable_hits += 1
        else:
            payload = self._cache.get(ledger_id, entry_id)
            if payload is None:
                return None
            stats.read_cache_hits += 1
        stats.reads += 1
        stats.read_bytes += len(payload)
        return payload

    def _memory_get(self, ledger_id: int, entry_id: int) -> bytes | None:
        payload = self._active.get(ledger_id, entry_id)
        if payload is None:
            for table in self._frozen:
                payload = table.get(ledger_id, entry_id)
                if payload is not None:
                    break
        return payload

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        st = self._ledger(ledger_id)
        if entry_id == LAST_ENTRY:
            entry_id = st.last_entry
        if entry_id < 0:
            raise NoEntryError(f"ledger {ledger_id} has no entry {entry_id} here")
        payload = self._read_in_memory(ledger_id, entry_id)
        if payload is not None:
            return payload
        stats = self.counters
        stats.reads += 1
        stats.read_cache_misses += 1
        found, ahead = await self._run(self._read_pool, self._read_disk, ledger_id, entry_id)
        for ahead_id, ahead_payload in ahead:
            self._cache.put(ledger_id, ahead_id, ahead_payload)
        stats.read_ahead_entries += len(ahead)
        stats.read_bytes += len(found)
        return found

    def _read_disk(self, ledger_id: int, entry_id: int) -> tuple[bytes, list[tuple[int, bytes]]]:
        """Read thread: the entry plus read-ahead of the same ledger's next entries.

        A damaged record costs only its own entry: it is marked damaged (see
        :meth:`_record_damage`) and skipped, its neighbours are still served."""
        for attempt in range(READ_ATTEMPTS):
            loc = self._index.get(ledger_id, entry_id)
            if loc is None:
                raise NoEntryError(f"ledger {ledger_id} has no entry {entry_id} here")
            if loc == TOMBSTONE:
                raise ChecksumError(
                    f"entry {ledger_id}/{entry_id} is damaged on this bookie (awaiting repair)"
                )
            wanted = [(entry_id, loc)]
            ahead_bytes = 0
            for ahead_id, ahead_loc in self._index.scan(
                ledger_id, entry_id + 1, self.config.read_ahead_entries
            ):
                ahead_bytes += ahead_loc.length
                if ahead_bytes > READ_AHEAD_BYTES_MAX or ahead_loc == TOMBSTONE:
                    break
                wanted.append((ahead_id, ahead_loc))
            found, bad = self._read_runs(ledger_id, entrylog.group_runs(wanted), dict(wanted))
            for bad_id, bad_loc, reason in bad:
                self._record_damage(
                    ledger_id,
                    bad_id,
                    bad_loc,
                    Damage(DAMAGE_READ, bad_loc.log_id, bad_loc.offset),
                    reason,
                )
            if found and found[0][0] == entry_id:
                return found[0][1], found[1:]
            if any(bad_id == entry_id for bad_id, _loc, _r in bad):
                raise ChecksumError(
                    f"entry {ledger_id}/{entry_id} is damaged on this bookie: {bad[0][2]}"
                )
            log.debug(
                "entry %d/%d moved under a read (attempt %d); looking up again",
                ledger_id,
                entry_id,
                attempt,
            )
        raise ChecksumError(f"entry {ledger_id}/{entry_id} failed validation on every read")

    def _read_runs(
        self, ledger_id: int, runs: list[tuple[Location, list[int]]], locs: dict[int, Location]
    ) -> tuple[list[tuple[int, bytes]], list[tuple[int, Location, str]]]:
        """(entries of the runs, in order; bad records as (entry, location, reason)).

        Stops at a stale run (its log was compacted away: the caller looks up again). A
        run that fails to decode as a whole is decoded record by record, so one bad
        record does not take the rest of its run with it."""
        out: list[tuple[int, bytes]] = []
        bad: list[tuple[int, Location, str]] = []
        for run, ids in runs:
            data = self._files.read(run)
            if data is None:
                break
            try:
                # A short read is a cut-off log (indexed logs never shrink): damage.
                records = list(entrylog.split_records(data)) if len(data) == run.length else []
                intact = len(records) == len(ids) and all(
                    rec[0] == ledger_id and rec[1] == want
                    for rec, want in zip(records, ids, strict=True)
                )
            except ChecksumError:
                intact = False
            if intact:
                out += [(rec_entry, payload) for _l, rec_entry, payload in records]
                continue
            for want in ids:
                loc = locs[want]
                start = loc.offset - run.offset
                try:
                    out.append(
                        (want, _decode_at(data[start : start + loc.length], ledger_id, want))
                    )
                except ChecksumError as exc:
                    bad.append((want, loc, str(exc)))
        return out, bad

    def _record_damage(self, ledger_id: int, entry_id: int, found_at: Location | None,
                       damage: Damage, reason: str) -> bool:  # fmt: skip
        """Any thread: count a checksum failure; mark the entry damaged in the index
        (persisted, reads fail with ChecksumError until a repair) and log it once.
        Returns True when newly marked."""
        with self._damage_lock:
            self.counters.checksum_failures += 1
        if not self._index.mark_damaged(ledger_id, entry_id, found_at, damage):
            return False
        name = (
            entrylog.file_name(damage.file_id)
            if damage.source != DAMAGE_JOURNAL
            else journal.file_name(damage.file_id)
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

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._ledger(ledger_id).lac

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> int:
        if not 0 <= ledger_id <= _U64_MAX or not NO_ENTRY_ID <= lac <= _I64_MAX:
            raise BadRequestError(f"bad ledger/lac {ledger_id}/{lac}")
        st = self._ledger(ledger_id)
        if st.master_key != master_key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if st.fenced:
            raise FencedError(f"ledger {ledger_id} is fenced")
        self._apply_explicit_lac(ledger_id, st, lac)
        return st.lac

    def _apply_explicit_lac(self, ledger_id: int, st: _Ledger, lac: int) -> None:
        st.explicit_lac = max(st.explicit_lac, lac)
        # Never past what is durable here: a woken long poll must find its entry.
        applied = min(st.explicit_lac, st.last_entry)
        if applied > st.lac:
            st.lac = applied
            self._dirty.add(ledger_id)
            if st.waiters:
                _wake(st)

    async def wait_lac(
        self, ledger_id: int, previous_lac: int, timeout_s: float, bytes_max: int = 0
    ) -> LacResult:
        """The LAC once it passes ``previous_lac`` (or after ``timeout_s``), with entry
        ``previous_lac + 1`` when held here; with ``bytes_max`` > 0 also the entries
        after it, up to the LAC and about ``bytes_max`` bytes, as long as they are
        contiguous and in memory (a tail reader's batch; never a disk read)."""
        st = self._ledger(ledger_id)
        if st.lac <= previous_lac and timeout_s > 0:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.watch_lac(ledger_id, fut)
            try:
                await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                pass
            finally:
                self.unwatch_lac(ledger_id, fut)
        answer = self.lac_answer_nowait(ledger_id, previous_lac, bytes_max)
        if answer is not None:
            return answer
        lac = self._ledger(ledger_id).lac
        try:
            payload = await self.read_entry(ledger_id, previous_lac + 1)
        except NoEntryError:
            return LacResult(lac, None, None)  # striped ensemble: another bookie holds it
        return self._lac_answer(ledger_id, lac, previous_lac, payload, bytes_max)

    def watch_lac(self, ledger_id: int, waiter: Completion) -> None:
        """Tell ``waiter`` (``set_result(None)``, once) when the ledger's LAC next moves."""
        st = self._ledger(ledger_id)
        if st.waiters is None:
            st.waiters = []
        st.waiters.append(waiter)

    def unwatch_lac(self, ledger_id: int, waiter: Completion) -> None:
        st = self._ledgers.get(ledger_id)
        if st is not None and st.waiters is not None and waiter in st.waiters:
            st.waiters.remove(waiter)

    def lac_answer_nowait(
        self, ledger_id: int, previous_lac: int, bytes_max: int = 0
    ) -> LacResult | None:
        """:meth:`wait_lac`'s answer now, without waiting for the LAC to move; None when
        entry ``previous_lac + 1`` is not in memory (then :meth:`wait_lac` with no
        timeout reads it from disk, or finds it is not here)."""
        lac = self._ledger(ledger_id).lac
        if lac <= previous_lac:
            return LacResult(lac, None, None)
        payload = self._read_in_memory(ledger_id, previous_lac + 1)
        if payload is None:
            return None  # on disk, or not here at all: read_entry will tell
        return self._lac_answer(ledger_id, lac, previous_lac, payload, bytes_max)

    def _lac_answer(
        self, ledger_id: int, lac: int, previous_lac: int, payload: bytes, bytes_max: int
    ) -> LacResult:
        more: list[bytes] = []
        if bytes_max > 0:
            size = len(payload)
            entry_id = previous_lac + 2
            while entry_id <= lac and size < bytes_max:
                nxt = self._memory_get(ledger_id, entry_id)
                if nxt is None:
                    break  # not here, or flushed already: the reader reads it
                more.append(nxt)
                size += len(nxt)
                entry_id += 1
            self.counters.read_bytes += size - len(payload)
        return LacResult(lac, previous_lac + 1, payload, tuple(more))

    def is_fenced(self, ledger_id: int) -> bool:
        return self._ledger(ledger_id).fenced

    def ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    async def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id held for a ledger (-1 if none): the memtables, then one
        backwards seek in the index -- never a listing of the ledger's entries."""
        self._ledger(ledger_id)
        last = self._active.last_entry_id(ledger_id)
        for table in self._frozen:
            last = max(last, table.last_entry_id(ledger_id))
        indexed = await self._run(self._read_pool, self._index.last_entry_id, ledger_id)
        return max(last, indexed)

    async def entries(self, ledger_id: int) -> list[int]:
        self._ledger(ledger_id)
        ids = set(self._active.entry_ids(ledger_id))
        for table in self._frozen:
            ids.update(table.entry_ids(ledger_id))
        ids.update(await self._run(self._read_pool, self._index.entry_ids, ledger_id))
        return sorted(ids)

    # ------------------------------------------------------------------ checkpoint

    async def checkpoint(self) -> None:
        async with self._checkpoint_lock:
            await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> None:
        if self._fatal is not None:
            raise IOFailureError("bookie storage failed; no checkpoint") from self._fatal
        mark = self._durable_mark
        if not len(self._active) and not self._dirty and mark == self._persisted_mark:
            return
        t0 = time.perf_counter()
        frozen, self._active = self._active, MemTable()
        self._frozen.append(frozen)
        self._frozen_bytes += frozen.bytes
        states = {lid: self._ledgers[lid].record() for lid in self._dirty if lid in self._ledgers}
        self._dirty.clear()
        try:
            await self._run(self._flush_pool, self._flush, frozen, states, mark)
        except (OSError, BooklineError) as exc:
            self._die(exc)
            raise IOFailureError(f"checkpoint failed: {exc}") from exc
        self._frozen.remove(frozen)
        self._frozen_bytes -= frozen.bytes
        self._persisted_mark = mark
        if self._journal is not None:
            await self._run(self._flush_pool, self._journal.delete_before, mark.file_id)
        self.counters.checkpoints += 1
        self.counters.checkpoint_entries += len(frozen)
        self.counters.checkpoint_seconds_total += time.perf_counter() - t0

    def _flush(self, frozen: MemTable, states: dict[int, LedgerRecord], mark: JournalMark) -> None:
        """Flush thread: entry log append + fsync, index batch, then the journal mark."""
        writer = self._flush_writer
        invariant(writer is not None, "checkpoint before start")
        assert writer is not None  # for mypy; checked above
        runs: list[entrylog.AppendedRun] = []
        for ledger_id, entry_ids, payloads in frozen.sorted_runs():
            runs += writer.append_run(ledger_id, entry_ids, payloads)
        written = writer.sync() if runs else {}
        repaired = self._index.write_checkpoint(
            runs, states, written, lambda lid, eid: frozen.get(lid, eid) is not None
        )
        for ledger_id, entry_id in repaired:
            log.info("damaged entry repaired: ledger %d entry %d", ledger_id, entry_id)
        journal.write_mark(self._ledgers_dir, mark, self._fsync, self.io)

    async def _checkpoint_loop(self) -> None:
        delays_s = checkpoint_delays_s(
            self.config.checkpoint_interval_ms / 1000.0,
            self.config.checkpoint_jitter_fraction,
            self._rng,
        )
        while self._fatal is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_wanted.wait(), next(delays_s))
            self._flush_wanted.clear()
            if self._closed:
                return
            try:
                await self.checkpoint()
            except IOFailureError:
                log.exception("periodic checkpoint failed; storage is now failed")
                return

    # ------------------------------------------------------------------ gc

    def damaged_entries(self) -> list[tuple[int, int]]:
        return sorted(self._index.damaged_snapshot())

    async def delete_ledgers(self, ledger_ids: set[int]) -> None:
        async with self._checkpoint_lock:  # no frozen memtable is being flushed now
            present = {lid for lid in ledger_ids if lid in self._ledgers}
            for lid in present:
                st = self._ledgers.pop(lid)
                if st.waiters:
                    _wake(st)
                self._dirty.discard(lid)
            self._active.drop_ledgers(present)
            self._cache.drop_ledgers(present)
            await self._run(self._flush_pool, self._index.delete_ledgers, sorted(ledger_ids))
            self.counters.deleted_ledgers += len(present)
        # Move the journal mark past their records so a restart does not replay them.
        await self.checkpoint()

    async def compact(self) -> int:
        async with self._compact_lock:
            reclaimed = 0
            for log_id in await self._run(self._gc_pool, self._compaction_candidates):
                try:
                    reclaimed += await self._run(self._gc_pool, self._compact_log, log_id)
                except (OSError, BooklineError) as exc:
                    self._die(exc)
                    raise IOFailureError(f"compaction of entry log {log_id} failed") from exc
            return reclaimed

    def _compaction_candidates(self) -> list[int]:
        busy: set[int] = set()
        for writer in (self._flush_writer, self._compact_writer):
            if writer is not None:
                busy |= writer.open_log_ids()
        threshold = self.config.compaction_threshold
        out = []
        for log_id, (total, live) in sorted(self._index.stats_snapshot().items()):
            if log_id not in busy and total > 0 and live / total < threshold:
                out.append(log_id)
        return out

    def _compact_log(self, log_id: int) -> int:
        """GC thread: copy live records to the compaction log, repoint, delete the old.

        The log's records are read in file order. When one is bad, the file can no
        longer say what it holds (a torn tail, or damage: a flipped length hides every
        record after it), so the index does: each entry pointing into the log that the
        scan did not copy is read at its own location, copied when intact, marked
        damaged when not. The log is deleted only once no index row points into it."""
        writer = self._compact_writer
        invariant(writer is not None, "compaction before start")
        assert writer is not None  # for mypy; checked above
        moves: list[tuple[int, int, Location, Location]] = []
        copied = 0
        scan = entrylog.LogScan(self._ledgers_dir, log_id)
        for ledger_id, entry_id, loc, record in scan:
            if self._index.get(ledger_id, entry_id) != loc:
                continue  # deleted, or a newer copy exists
            moves.append((ledger_id, entry_id, loc, writer.append_record(record)))
            copied += len(record)
        damaged: list[tuple[int, int, Location, str]] = []
        if scan.bad_offset is not None:
            copied += self._compact_from_index(log_id, scan.bad_offset, writer, moves, damaged)
        written = writer.sync() if moves else {}
        if scan.bad_offset is None:
            self._index.relocate(moves, written, log_id)
        elif not self._retire_damaged_log(log_id, moves, written, damaged):
            return 0
        size = self._files.delete(log_id)
        self.counters.compacted_logs += 1
        self.counters.compaction_bytes_reclaimed += max(0, size - copied)
        log.info(
            "compacted entry log %d: %d entries kept, %d bytes freed",
            log_id,
            len(moves),
            size - copied,
        )
        return max(0, size - copied)

    def _compact_from_index(
        self, log_id: int, bad_offset: int, writer: EntryLogWriter,
        moves: list[tuple[int, int, Location, Location]],
        damaged: list[tuple[int, int, Location, str]],
    ) -> int:  # fmt: skip
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
            record = entrylog.read_record(self._ledgers_dir, loc)
            try:
                if len(record) != loc.length:
                    raise ChecksumError(f"record cut short at {len(record)} of {loc.length} B")
                _decode_at(record, ledger_id, entry_id)
            except ChecksumError as exc:
                damaged.append((ledger_id, entry_id, loc, str(exc)))
                continue
            moves.append((ledger_id, entry_id, loc, writer.append_record(record)))
            copied += len(record)
        return copied

    def _retire_damaged_log(
        self, log_id: int, moves: list[tuple[int, int, Location, Location]],
        written: dict[int, int], damaged: list[tuple[int, int, Location, str]],
    ) -> bool:  # fmt: skip
        """GC thread: repoint the copies, mark the damaged entries, and tell whether the
        log may go: only when no index row points into it any more. Its stats row is
        dropped only then, so a log kept here is compacted again later."""
        self._index.relocate(moves, written, None)
        for ledger_id, entry_id, loc, reason in damaged:
            self._record_damage(
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

    async def _gc_loop(self) -> None:
        interval_s = self.config.gc_interval_ms / 1000.0
        while self._fatal is None:
            await asyncio.sleep(interval_s)
            try:
                await self.compact()
            except IOFailureError:
                log.exception("compaction failed; storage is now failed")
                return

    # ------------------------------------------------------------------ disk health

    def disk_usage(self) -> DiskUsage:
        """The fullest of the three disks. On the journal's, the room it keeps for its
        next preallocation and margin counts as used: the journal turns read-only when
        that room is gone, and the thresholds must agree or the server's disk check
        would turn it writable again (and the registry flap)."""
        worst: tuple[float, int, int] = (0.0, 0, 0)
        reserve = self.config.journal_prealloc_bytes + journal.SPACE_MARGIN_BYTES
        for d in (self._journal_dir, self._ledgers_dir, self._index_dir):
            total, free = self.io.disk_space(d)
            if d == self._journal_dir:
                free = max(0, free - reserve)
            used = 1.0 - (free / total) if total else 1.0
            if used >= worst[0]:
                worst = (used, free, total)
        return DiskUsage(worst[0], worst[1], worst[2], self._read_only)

    def check_disk_usage(self) -> DiskUsage:
        """Apply the thresholds: read-only above ``disk_usage_threshold``, writable again
        below ``disk_usage_lwm``. The server calls this every disk_check_interval_ms and
        re-registers when ``read_only`` changed."""
        usage = self.disk_usage()
        if not self._read_only and usage.used_fraction >= self.config.disk_usage_threshold:
            log.warning("disk usage %.3f over threshold: turning read-only", usage.used_fraction)
            self.set_read_only(True)
        elif self._read_only and usage.used_fraction < self.config.disk_usage_lwm:
            log.info("disk usage %.3f under low-water mark: writable again", usage.used_fraction)
            self.set_read_only(False)
        return DiskUsage(usage.used_fraction, usage.free_bytes, usage.total_bytes, self._read_only)

    def set_read_only(self, read_only: bool) -> None:
        self._read_only = read_only

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def failed(self) -> BaseException | None:
        """The fatal error, once storage stopped acknowledging."""
        return self._fatal

    # ------------------------------------------------------------------ metrics

    @property
    def memtable_bytes(self) -> int:
        return self._active.bytes + self._frozen_bytes + self._reserved_bytes

    def stats(self) -> dict[str, float]:
        """Counters and gauges in one flat dict; names are stable (bookie/metrics.py
        reads them: journal_fsync_seconds, journal_group_entries, memtable_bytes,
        read_cache_hits, read_cache_misses get dedicated series)."""
        out: dict[str, float] = {k: float(v) for k, v in asdict(self.counters).items()}
        if self._journal is not None:
            js = self._journal.stats
            out.update(
                journal_groups=js.groups,
                journal_records=js.records,
                journal_bytes=js.bytes,
                journal_group_entries=js.last_group_records,
                journal_fsync_seconds=js.last_fsync_seconds,
                journal_fsyncs=js.fsyncs,
                journal_fsync_seconds_total=js.fsync_seconds_total,
                journal_fsync_seconds_max=js.fsync_seconds_max,
                journal_files_rolled=js.files_rolled,
            )
        out.update(
            memtable_bytes=self.memtable_bytes,
            memtable_entries=len(self._active) + sum(len(t) for t in self._frozen),
            read_cache_bytes=self._cache.bytes,
            read_cache_entries=len(self._cache),
            ledgers=len(self._ledgers),
            read_only=float(self._read_only),
            damaged_entries=self._index.damaged_count(),
        )
        return out

    @property
    def journal_stats(self) -> journal.JournalStats | None:
        """Live journal counters; set ``.observer`` for an fsync-latency histogram."""
        return None if self._journal is None else self._journal.stats


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


def _decode_at(record: bytes, ledger_id: int, entry_id: int) -> bytes:
    """The payload of one entry-log record that must hold ``ledger_id/entry_id``."""
    rec_ledger, rec_entry, payload = entrylog.decode_record(record)
    if (rec_ledger, rec_entry) != (ledger_id, entry_id):
        raise ChecksumError(
            f"entry log record holds {rec_ledger}/{rec_entry}, not {ledger_id}/{entry_id}"
        )
    return payload


def _wake(st: _Ledger) -> None:
    waiters, st.waiters = st.waiters, None
    for w in waiters or ():
        if not w.done():
            w.set_result(None)
