"""BookieStorage: journal -> memtable -> entry logs + RocksDB index (see api.py).

This module starts, wires and stops the engine's parts and is the
:class:`~bookie.storage.api.Storage` facade over them; each part does one job:

* writes.py     -- adds and fences checked and journaled; durable groups published to
  the memtable and the LACs, then acknowledged;
* reads.py      -- memtable -> read cache -> index + entry log, with read-ahead;
* lac.py        -- LACs, explicit LACs, long polls and their answers;
* checkpoint.py -- memtable -> entry logs + index, then the journal mark (jittered);
* compaction.py -- rewriting entry logs that are mostly dead;
* damage.py     -- entries found damaged, marked in the index until repaired;
* disk.py       -- disk usage and the read-only state;
* replay.py     -- the journal since the mark, applied at start.

They share the ledger table and counters (state.py) and the memtables (memtable.py).

Threads: the journal thread; ``bookie-read`` (index gets, entry log preads);
``bookie-flush`` (checkpoints, ledger deletes); ``bookie-gc`` (compaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Final

from bookie.config import BookieConfig
from foundation.errors import (
    ClosedError,
    IOFailureError,
)
from foundation.invariants import invariant

from . import entrylog, faults, journal, journal_files
from .api import DiskUsage, EntryAdd, LacResult, NewEntry
from .cache import ReadCache
from .checkpoint import Checkpointer, checkpoint_delays_s
from .compaction import Compactor
from .damage import DamageLog
from .disk import DiskHealth
from .entrylog import EntryLogFiles, EntryLogWriter, LogIds
from .index import Index
from .journal import Completion, Journal, JournalMark
from .lac import LacTracker
from .memtable import MemTables
from .reads import EntryReads
from .replay import replay
from .state import Ledgers, LedgerState, StorageStats
from .workers import Worker
from .writes import EntryWrites

log = logging.getLogger(__name__)

# Catch-up reads: index gets and entry-log preads run concurrently on this many threads.
READ_THREADS: Final = 4

Fsync = Callable[[int], None]
Clock = Callable[[], float]
FatalHandler = Callable[[BaseException], None]


class BookieStorage:
    """The storage engine of one bookie; implements :class:`bookie.storage.api.Storage`."""

    # add_entry without a coroutine: errors found now are raised now; ``done`` is told
    # the outcome once the journal group is fsynced (the server's per-add path: no
    # task, no future). The write path's own method, bound at construction, so the
    # hot path pays no delegation.
    add_entry_nowait: Callable[[EntryAdd, Completion], None]

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
        self._journal: Journal | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._disk = DiskHealth(
            (self._journal_dir, self._ledgers_dir, self._index_dir),
            self.io,
            journal_prealloc_bytes=config.journal_prealloc_bytes,
        )
        self._fatal: BaseException | None = None
        self._closed = False
        self._started = False
        self._flush_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._build_parts()

    def _build_parts(self) -> None:
        """The state the parts share, and the parts (see the module docstring)."""
        cfg = self.config
        self.counters = StorageStats()
        self._ledgers = Ledgers()
        self._mem = MemTables()
        self._index = Index(self._index_dir)
        self._files = EntryLogFiles(self._ledgers_dir, self.io)
        self._log_ids = LogIds(1)  # continued from the logs on disk at start
        self._read_pool = Worker(READ_THREADS, "bookie-read")
        self._flush_pool = Worker(1, "bookie-flush")
        self._gc_pool = Worker(1, "bookie-gc")
        self._damage = DamageLog(self._index, self.counters)
        self._flush_writer = EntryLogWriter(self._ledgers_dir, self._log_ids,
                                            cfg.entry_log_bytes_max, self._fsync,
                                            cfg.entry_log_sync_bytes, io=self.io)  # fmt: skip
        self._compact_writer = EntryLogWriter(self._ledgers_dir, self._log_ids,
                                              cfg.entry_log_bytes_max, self._fsync,
                                              io=self.io)  # fmt: skip
        self._reads = EntryReads(self._ledgers, self._mem, ReadCache(cfg.read_cache_bytes_max),
                                 index=self._index, files=self._files, damage=self._damage,
                                 counters=self.counters, worker=self._read_pool,
                                 read_ahead_entries=cfg.read_ahead_entries)  # fmt: skip
        self._lacs = LacTracker(self._ledgers, self._mem, self._reads, self.counters)
        self._writes = EntryWrites(cfg, self._ledgers, self._mem, lacs=self._lacs,
                                   disk=self._disk, counters=self.counters,
                                   writable=self._check_writable,
                                   flush_wanted=self._flush_wanted)  # fmt: skip
        self.add_entry_nowait = self._writes.add_nowait
        self._checkpoints = Checkpointer(self._ledgers, self._mem, index=self._index,
                                         writer=self._flush_writer, worker=self._flush_pool,
                                         counters=self.counters, write_mark=self._write_mark,
                                         die=self._die)  # fmt: skip
        self._compactor = Compactor(self._ledgers_dir, index=self._index, files=self._files,
                                    writer=self._compact_writer,
                                    busy_writers=(self._flush_writer, self._compact_writer),
                                    damage=self._damage, counters=self.counters,
                                    worker=self._gc_pool, threshold=cfg.compaction_threshold,
                                    die=self._die)  # fmt: skip

    # ------------------------------------------------------------------ lifecycle

    def set_fatal_handler(self, handler: FatalHandler) -> None:
        """Called once, on the loop, when an fsync/write error makes the bookie unsafe."""
        self._on_fatal = handler

    async def start(self) -> None:
        invariant(not self._started, "BookieStorage.start called twice")
        self._started = True
        self._loop = loop = asyncio.get_running_loop()
        for d in (self._journal_dir, self._ledgers_dir, self._index_dir):
            d.mkdir(parents=True, exist_ok=True)
        states = await self._flush_pool.run(self._index.open)
        for ledger_id, rec in states.items():
            self._ledgers[ledger_id] = LedgerState(rec.master_key, rec.fenced, rec.lac,
                                                   rec.last_entry)  # fmt: skip
        await self._flush_pool.run(self._open_entry_logs)
        mark = await self._flush_pool.run(journal_files.read_mark, self._ledgers_dir)
        mark = mark or JournalMark(0, 0)
        self._checkpoints.persisted_mark = mark
        replayed = await self._flush_pool.run(self._replay, mark)
        self._journal = self._make_journal()
        files = journal_files.list_files(self._journal_dir)
        next_file = max([*files, mark.file_id]) + 1
        try:
            self._writes.durable_mark = self._journal.start(
                loop, next_file, self._writes.on_durable
            )
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
        """Blocking: delete logs nothing indexes (crash mid-flush), continue the log ids."""
        logs = entrylog.list_logs(self._ledgers_dir)
        for log_id in logs:
            if log_id not in self._index.log_stats:
                log.warning("deleting entry log %d: nothing in the index refers to it", log_id)
                self._files.delete(log_id)
        self._log_ids.continue_from(max([0, *logs, *self._index.log_stats]) + 1)

    def _replay(self, mark: JournalMark) -> int:
        """Blocking, before the journal thread starts: journal records -> memtable."""
        return replay(self._journal_dir, mark, self._ledgers, self._mem, self._damage,
                      fsync=self._fsync, io=self.io)  # fmt: skip

    def _make_journal(self) -> Journal:
        cfg = self.config
        return Journal(
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
            on_rejected=self._writes.on_rejected,
        )

    def _write_mark(self, mark: JournalMark) -> None:
        """Flush thread: persist the journal mark (a checkpoint's last step)."""
        journal_files.write_mark(self._ledgers_dir, mark, self._fsync, self.io)

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
            pool.shutdown()
        for writer in (self._flush_writer, self._compact_writer):
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

    async def fence(self, ledger_id: int, master_key: bytes) -> int:
        return await self._writes.fence(ledger_id, master_key)

    def _journal_space_low(self, free_bytes: int) -> None:
        """Journal thread: the next preallocation would not fit with margin."""
        loop = self._loop
        if loop is not None and not self._disk.read_only:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody adds any more
                loop.call_soon_threadsafe(self._disk.turn_read_only_for_space, free_bytes)

    async def delete_ledgers(self, ledger_ids: set[int]) -> None:
        async with self._checkpoints.lock:  # no frozen memtable is being flushed now
            present = {lid for lid in ledger_ids if lid in self._ledgers}
            for lid in present:
                st = self._ledgers.pop(lid)
                if st.waiters:
                    st.wake()
                self._ledgers.dirty.discard(lid)
            self._mem.active.drop_ledgers(present)
            self._reads.cache.drop_ledgers(present)
            await self._flush_pool.run(self._index.delete_ledgers, sorted(ledger_ids))
            self.counters.deleted_ledgers += len(present)
        # Move the journal mark past their records so a restart does not replay them.
        await self.checkpoint()

    # ------------------------------------------------------------------ reads, LACs

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        return await self._reads.read_entry(ledger_id, entry_id)

    async def last_entry_id(self, ledger_id: int) -> int:
        return await self._reads.last_entry_id(ledger_id)

    async def entries(self, ledger_id: int) -> list[int]:
        return await self._reads.entries(ledger_id)

    def is_fenced(self, ledger_id: int) -> bool:
        return self._ledgers.known(ledger_id).fenced

    def master_key_of(self, ledger_id: int) -> bytes | None:
        st = self._ledgers.get(ledger_id)
        return None if st is None else st.master_key

    def ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    def damaged_entries(self) -> list[tuple[int, int]]:
        return self._damage.entries()

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._lacs.last_add_confirmed(ledger_id)

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> int:
        return self._lacs.write_lac(ledger_id, lac, master_key)

    async def wait_lac(
        self, ledger_id: int, previous_lac: int, timeout_s: float, bytes_max: int = 0
    ) -> LacResult:
        return await self._lacs.wait_lac(ledger_id, previous_lac, timeout_s, bytes_max)

    def watch_lac(self, ledger_id: int, waiter: Completion) -> None:
        self._lacs.watch(ledger_id, waiter)

    def unwatch_lac(self, ledger_id: int, waiter: Completion) -> None:
        self._lacs.unwatch(ledger_id, waiter)

    def lac_answer_nowait(
        self, ledger_id: int, previous_lac: int, bytes_max: int = 0
    ) -> LacResult | None:
        return self._lacs.answer_nowait(ledger_id, previous_lac, bytes_max)

    # ------------------------------------------------------------------ background work

    async def checkpoint(self) -> None:
        async with self._checkpoints.lock:
            if self._fatal is not None:
                raise IOFailureError("bookie storage failed; no checkpoint") from self._fatal
            await self._checkpoints.checkpoint(self._writes.durable_mark, self._journal)

    async def compact(self) -> int:
        return await self._compactor.compact()

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

    async def _gc_loop(self) -> None:
        interval_s = self.config.gc_interval_ms / 1000.0
        while self._fatal is None:
            await asyncio.sleep(interval_s)
            try:
                await self.compact()
            except IOFailureError:
                log.exception("compaction failed; storage is now failed")
                return

    # ------------------------------------------------------------------ state

    def disk_usage(self) -> DiskUsage:
        return self._disk.usage()

    def check_disk_usage(self) -> DiskUsage:
        """Apply the read-only thresholds: read-only above ``disk_usage_threshold``,
        writable again below ``disk_usage_lwm``; the usage after."""
        return self._disk.check(self.config.disk_usage_threshold, self.config.disk_usage_lwm)

    def set_read_only(self, read_only: bool) -> None:
        self._disk.read_only = read_only

    @property
    def read_only(self) -> bool:
        return self._disk.read_only

    @property
    def failed(self) -> BaseException | None:
        """The fatal error, once storage stopped acknowledging."""
        return self._fatal

    # ------------------------------------------------------------------ metrics

    @property
    def memtable_bytes(self) -> int:
        return self._mem.used_bytes

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
        cache = self._reads.cache
        out.update(
            memtable_bytes=self.memtable_bytes,
            memtable_entries=self._mem.entries,
            read_cache_bytes=cache.bytes,
            read_cache_entries=len(cache),
            ledgers=len(self._ledgers),
            read_only=float(self._disk.read_only),
            damaged_entries=self._damage.count(),
        )
        return out

    @property
    def journal_stats(self) -> journal.JournalStats | None:
        """Live journal counters; set ``.observer`` for an fsync-latency histogram."""
        return None if self._journal is None else self._journal.stats

    # ------------------------------------------------------------------ test hooks

    @property
    def _cache(self) -> ReadCache:
        """The read cache (tests swap it for an empty one)."""
        return self._reads.cache

    @_cache.setter
    def _cache(self, cache: ReadCache) -> None:
        self._reads.cache = cache

    def _memory_get(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._mem.get(ledger_id, entry_id)

    def _compaction_candidates(self) -> list[int]:
        return self._compactor.candidates()
