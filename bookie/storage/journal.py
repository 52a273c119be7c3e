"""The bookie journal: append-only, checksummed records, group-committed by one thread.

The file, record and mark formats, and how a file is read back (torn tail, damaged
entry or corruption), are in :mod:`bookie.storage.journal_format`; replaying a
directory, cutting a torn tail and the mark file are in
:mod:`bookie.storage.journal_files`. This module is the writer: :class:`Journal`.

Threading: producers call :meth:`Journal.submit` on the event loop thread; the journal
thread takes everything queued (bounded by bytes and wait), writes it in one ``pwrite``,
calls ``fsync`` once, then hands the group back to the loop with
``call_soon_threadsafe``. A write or fsync error is fatal: every pending and later
record fails with IOFailureError and the fatal callback runs (the server exits).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from foundation.errors import ClosedError, IOFailureError, ReadOnlyError
from foundation.invariants import invariant

from .faults import REAL_IO, FileIO
from .journal_files import (
    ReplayResult,
    file_name,
    fsync_dir,
    list_files,
    read_mark,
    replay,
    truncate_tail,
    write_mark,
)
from .journal_format import (
    ADD,
    FENCE,
    FILE_HEADER_BYTES,
    HEADER_BYTES,
    MASTER_KEY,
    RECORD_BYTES_MAX,
    DamagedRecord,
    JournalCorruptError,
    JournalMark,
    JournalRecord,
    decode_file_header,
    decode_mark,
    encode_file_header,
    encode_into,
    encode_mark,
    encode_record,
    iter_records,
)

log = logging.getLogger(__name__)

# Format and file names re-exported: callers know the journal, not how it is split in
# modules.
__all__ = [
    "ADD",
    "FENCE",
    "FILE_HEADER_BYTES",
    "MASTER_KEY",
    "RECORD_BYTES_MAX",
    "SPACE_MARGIN_BYTES",
    "Completion",
    "DamagedRecord",
    "Journal",
    "JournalCorruptError",
    "JournalFullError",
    "JournalMark",
    "JournalRecord",
    "JournalStats",
    "ReplayResult",
    "decode_file_header",
    "decode_mark",
    "encode_file_header",
    "encode_mark",
    "encode_record",
    "file_name",
    "iter_records",
    "list_files",
    "read_mark",
    "replay",
    "truncate_tail",
    "write_mark",
]

# Bytes per record besides its data, for group accounting.
_RECORD_OVERHEAD_BYTES = HEADER_BYTES
# Room the journal keeps free beyond its next preallocation: while read-only, recovery
# adds, fences and ledger keys still go to the journal, and a roll needs a new file.
SPACE_MARGIN_BYTES = 4 << 20

Fsync = Callable[[int], None]
Clock = Callable[[], float]


class JournalFullError(ReadOnlyError):
    """No room on the journal disk for a group: its records are refused (READ_ONLY);
    nothing acknowledged is at stake, so the journal keeps going."""


# --- the group-commit thread ----------------------------------------------------------


class Completion(Protocol):
    """Told the outcome of one queued record, on the loop thread. An
    ``asyncio.Future[None]`` is one; the server passes a cheaper object that encodes its
    response directly (no future, no done-callback scheduling per add)."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


# Queue item: (type, ledger_id, entry_id, lac, data, completion or None).
Item = tuple[int, int, int, int, bytes, "Completion | None"]
OnDurable = Callable[[list[Item], JournalMark], None]
# Told (on the loop) that a group was refused for want of space, with the error.
OnRejected = Callable[[list[Item], JournalFullError], None]
# Told (on the journal thread) the free bytes when the next preallocation would not fit.
OnSpaceLow = Callable[[int], None]


@dataclass(slots=True)
class JournalStats:
    """Counters written by the journal thread, read by the metrics module."""

    groups: int = 0
    records: int = 0
    bytes: int = 0
    last_group_records: int = 0
    fsyncs: int = 0
    fsync_seconds_total: float = 0.0
    fsync_seconds_max: float = 0.0
    last_fsync_seconds: float = 0.0
    files_rolled: int = 0
    # Optional hook(fsync seconds, records, bytes) for a latency histogram.
    observer: Callable[[float, int, int], None] | None = None


class Journal:
    def __init__(
        self,
        directory: Path,
        *,
        file_bytes_max: int,
        prealloc_bytes: int,
        group_bytes_max: int,
        group_wait_ms: float,
        flush_when_idle: bool,
        sync: bool,
        fsync: Fsync,
        clock: Clock,
        on_fatal: Callable[[BaseException], None],
        io: FileIO = REAL_IO,
        on_space_low: OnSpaceLow | None = None,
        on_rejected: OnRejected | None = None,
    ) -> None:
        """``fsync`` is what the journal calls after each group (already wrapped by
        ``io``'s :meth:`~bookie.storage.faults.FileIO.wrap_fsync`). ``on_space_low``
        is told when the next preallocation would not fit with SPACE_MARGIN_BYTES to
        spare (the engine turns read-only); ``on_rejected`` gets a group refused for want
        of space (default: its completions fail with that error)."""
        self._on_space_low = on_space_low
        self._on_rejected = on_rejected
        self._dir = directory
        self._io = io
        self._pwrite = io.pwrite  # bound once: the group commit's one write call
        self._file_bytes_max = file_bytes_max
        self._prealloc_bytes = prealloc_bytes
        self._group_bytes_max = group_bytes_max
        self._group_wait_s = group_wait_ms / 1000.0
        self._flush_when_idle = flush_when_idle
        self._sync = sync
        self._fsync = fsync
        self._clock = clock
        self._on_fatal = on_fatal
        self.stats = JournalStats()
        self._queue: collections.deque[Item] = collections.deque()
        self._wake = threading.Event()
        self._idle = False
        self._stopping = False
        self._discard = False
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_durable: OnDurable | None = None
        self._fd = -1
        self._file_id = -1
        self._pos = 0
        self._alloc_end = 0
        self._prealloc_ok = True

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def current_file_id(self) -> int:
        return self._file_id

    def start(
        self, loop: asyncio.AbstractEventLoop, next_file_id: int, on_durable: OnDurable
    ) -> JournalMark:
        """Open a fresh file and start the thread; return the mark of its first record."""
        invariant(self._thread is None, "journal started twice")
        self._loop = loop
        self._on_durable = on_durable
        self._open_file(next_file_id)
        self._thread = threading.Thread(target=self._run, name="bookie-journal", daemon=True)
        self._thread.start()
        return JournalMark(self._file_id, self._pos)

    def create_future(self) -> asyncio.Future[None]:
        """A future on the journal's loop, for an item passed to :meth:`submit`."""
        loop = self._loop
        if loop is None:
            raise ClosedError("journal not started")
        return loop.create_future()

    def submit(self, item: Item) -> None:
        """Queue one record (event loop thread). Its future resolves after the fsync."""
        if self._failed is not None:
            raise IOFailureError("journal failed earlier; not accepting writes") from self._failed
        if self._stopping:
            raise ClosedError("journal is closed")
        self._queue.append(item)
        if self._idle:
            self._wake.set()

    def stop(self, *, drain: bool = True) -> None:
        """Stop the thread (blocking: call via to_thread). With ``drain`` it first writes
        what is queued; without, queued records stay for :meth:`fail_queued`."""
        self._discard = not drain
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self._fd >= 0:
            self._io.close(self._fd)
            self._fd = -1

    def delete_before(self, file_id: int) -> int:
        """Delete journal files older than ``file_id`` (never the current one)."""
        removed = 0
        for fid in list_files(self._dir):
            if fid < file_id and fid != self._file_id:
                (self._dir / file_name(fid)).unlink()
                removed += 1
        return removed

    # -- journal thread --

    def _open_file(self, file_id: int) -> None:
        path = self._dir / file_name(file_id)
        fd = self._io.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            header = encode_file_header(file_id)
            self._fd, self._file_id, self._pos, self._alloc_end = fd, file_id, 0, 0
            self._ensure_allocated(len(header))
            self._write_all(header, 0)
            self._fsync(fd)
            fsync_dir(self._dir, self._fsync)
        except BaseException:
            self._io.close(fd)
            self._fd = -1
            raise
        self._pos = len(header)

    def _ensure_allocated(self, nbytes: int) -> None:
        """Make room for ``nbytes`` more at the end, preallocating a chunk at a time.

        Every chunk boundary looks at the free space first: when the chunk would not
        fit with SPACE_MARGIN_BYTES to spare, or after it the *next* one would not, the
        engine is told to turn read-only (on_space_low) -- in time, since a whole chunk
        is left for what is still queued. Then only what this group needs is allocated.
        ENOSPC on that is no fatal error either: the group is refused (JournalFullError).
        """
        if self._pos + nbytes <= self._alloc_end:
            return
        needed = self._pos + nbytes - self._alloc_end
        free = self._io.disk_space(self._dir).free_bytes
        grow = max(self._prealloc_bytes, needed)
        if free < grow + SPACE_MARGIN_BYTES:
            self._space_low(free)
            grow = needed
        try:
            self._allocate(grow)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self._space_low(0)
            if grow == needed:
                raise JournalFullError(f"journal disk full: no room for {needed} B") from exc
            try:
                self._allocate(needed)
            except OSError as again:
                if again.errno != errno.ENOSPC:
                    raise
                raise JournalFullError(f"journal disk full: no room for {needed} B") from again
            grow = needed
        self._alloc_end += grow
        if free - grow < self._prealloc_bytes + SPACE_MARGIN_BYTES:
            self._space_low(max(0, free - grow))

    def _allocate(self, nbytes: int) -> None:
        """fallocate ``nbytes`` at the allocated end (a no-op where unsupported)."""
        if not self._prealloc_ok:
            return
        try:
            self._io.fallocate(self._fd, self._alloc_end, nbytes)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.warning("journal preallocation unsupported here (%s); writing without", exc)
            self._prealloc_ok = False

    def _space_low(self, free_bytes: int) -> None:
        if self._on_space_low is not None:
            self._on_space_low(free_bytes)

    def _write_all(self, data: bytes | bytearray, offset: int) -> None:
        view = memoryview(data)
        pwrite = self._pwrite
        while view:
            n = pwrite(self._fd, view, offset)
            view = view[n:]
            offset += n

    def _collect(self) -> list[Item] | None:
        q = self._queue
        if self._discard:
            return None
        while not q:
            if self._stopping:
                return None
            self._wake.clear()
            self._idle = True
            if not q:
                self._wake.wait()
            self._idle = False
        group: list[Item] = []
        nbytes = 0
        deadline = self._clock() + self._group_wait_s
        while True:
            while q and nbytes < self._group_bytes_max:
                item = q.popleft()
                group.append(item)
                nbytes += len(item[4]) + _RECORD_OVERHEAD_BYTES
            if nbytes >= self._group_bytes_max or self._flush_when_idle or self._stopping:
                return group
            remaining = deadline - self._clock()
            if remaining <= 0:
                return group
            self._wake.clear()
            self._idle = True
            if not q:
                self._wake.wait(remaining)
            self._idle = False

    def _run(self) -> None:
        loop, on_durable = self._loop, self._on_durable
        invariant(loop is not None and on_durable is not None, "journal thread without loop")
        assert loop is not None
        assert on_durable is not None
        buf = bytearray()
        group: list[Item] = []
        try:
            while True:
                collected = self._collect()
                if collected is None:
                    return
                group = collected
                buf.clear()
                for rtype, ledger_id, entry_id, lac, data, _fut in group:
                    encode_into(buf, rtype, ledger_id, entry_id, lac, data)
                try:
                    self._ensure_allocated(len(buf))
                except JournalFullError as full:
                    log.warning("journal: %s; refusing %d records", full, len(group))
                    loop.call_soon_threadsafe(self._reject, group, full)
                    group = []
                    continue
                self._write_all(buf, self._pos)
                if self._sync:
                    t0 = time.perf_counter()
                    self._fsync(self._fd)
                    self._note_fsync(time.perf_counter() - t0, len(group), len(buf))
                self._pos += len(buf)
                st = self.stats
                st.groups += 1
                st.records += len(group)
                st.bytes += len(buf)
                st.last_group_records = len(group)
                loop.call_soon_threadsafe(on_durable, group, JournalMark(self._file_id, self._pos))
                group = []
                if self._pos >= self._file_bytes_max:
                    self._roll()
        except BaseException as exc:
            log.critical(
                "journal write/fsync failed; the bookie stops acknowledging", exc_info=True
            )
            self._failed = exc
            self._stopping = True
            with contextlib.suppress(RuntimeError):  # loop already closed: nobody waits
                loop.call_soon_threadsafe(self._fail_pending, group, exc)

    def _note_fsync(self, seconds: float, records: int, nbytes: int) -> None:
        st = self.stats
        st.fsyncs += 1
        st.fsync_seconds_total += seconds
        st.fsync_seconds_max = max(st.fsync_seconds_max, seconds)
        st.last_fsync_seconds = seconds
        if st.observer is not None:
            st.observer(seconds, records, nbytes)

    def _roll(self) -> None:
        old = (self._fd, self._file_id, self._pos, self._alloc_end)
        try:
            self._open_file(self._file_id + 1)
        except JournalFullError as full:
            # No room for a new file: keep appending to this one (past file_bytes_max)
            # and try again after the next group; the engine is read-only by now.
            (self._dir / file_name(self._file_id)).unlink(missing_ok=True)
            fsync_dir(self._dir, self._fsync)
            self._fd, self._file_id, self._pos, self._alloc_end = old
            log.warning(
                "journal: cannot roll to a new file (%s); staying on %d", full, self._file_id
            )
            return
        self._io.close(old[0])
        self.stats.files_rolled += 1

    def _reject(self, group: list[Item], error: JournalFullError) -> None:
        """On the loop: a group refused for want of space (see JournalFullError)."""
        if self._on_rejected is not None:
            self._on_rejected(group, error)
            return
        for item in group:
            fut = item[5]
            if fut is not None and not fut.done():
                fut.set_exception(error)

    def fail_queued(self, error: BaseException) -> None:
        """On the loop, after ``stop(drain=False)``: fail what was never written."""
        while self._queue:
            fut = self._queue.popleft()[5]
            if fut is not None and not fut.done():
                fut.set_exception(error)

    def _fail_pending(self, group: list[Item], exc: BaseException) -> None:
        """On the loop: fail the group in flight and everything still queued."""
        items = list(group)
        while self._queue:
            items.append(self._queue.popleft())
        for item in items:
            fut = item[5]
            if fut is not None and not fut.done():
                err = IOFailureError(f"journal write failed: {exc}")
                err.__cause__ = exc
                fut.set_exception(err)
        self._on_fatal(exc)
