"""The file layer storage writes through, and the test-only storage fault shim.

The journal, the entry logs and the journal mark do their file I/O through a
:class:`FileIO`. The default one, :data:`REAL_IO`, *is* the ``os`` functions (class
attributes bound to them), so the write path pays nothing for the indirection: a call
costs one attribute lookup, like ``os.pwrite`` itself.

:class:`FaultShim` (``BookieConfig.fault_shim``, test-only, off by default) replaces it:

* ``"power-cut"``: every write lands in an overlay in process memory, keyed by the file's
  inode, and reaches the real file only when that file is fsynced. Reads through the
  layer see the overlay. So ``kill -9`` of the bookie process drops exactly what was not
  fsynced -- a power cut -- instead of leaving it in the page cache. Preallocation,
  truncation, creation and unlinking go straight to the file system (metadata is not
  modelled; every one of them is followed by an fsync in storage anyway).
* ``"on"``: no overlay (writes go to the files), only the injectable faults below.
* Both: an fsync error (``fail_fsync(errno)``, e.g. EIO: the unsynced writes of that
  file are dropped, as Linux drops dirty pages whose writeback failed) and a simulated
  disk size per directory (``disk_bytes_max``): preallocation and writes that would grow
  the directory's files past it fail with ENOSPC, and :meth:`disk_space` reports it.
  A process bookie is steered through a control file, ``FAULTS.toml`` in the journal
  directory (keys ``fsync_error = "EIO"``, ``disk_bytes_max = N`` and ``disk_full =
  true``), read again at every fsync and space query when it changed.
* ``disk_full``: the disk fills up *now*, as ext4 with root's reserved blocks does: the
  space query reports no free byte (so the bookie's disk check turns it read-only), and
  writes that grow a directory more than :data:`DISK_FULL_RESERVE_BYTES` past its size
  at that moment fail with ENOSPC (what a memtable flush already under way needs).
* Every fault that hits is counted in ``FAULTS.hits`` next to the control file
  (``fsync_errors = N``, ``enospc_errors = M``, rewritten at each hit): the chaos
  nemesis counts an injection only once it took effect.
* Both: a slow disk (``fsync_delay_ms = N`` in the control file): every fsync takes N ms
  more (the alert tests' slow journal).

RocksDB's files cannot be intercepted; the index is written with synced batches
(``flush_wal(sync=True)``), so nothing acknowledged depends on its page cache.

The offline helpers at the end damage the files of a *stopped* bookie: :func:`flip_bit`,
:func:`zero_block`, :func:`truncate`, :func:`fill_disk` (a sparse ballast file that costs
no real space but counts against a simulated ``disk_bytes_max``: filling the shared
machine's real disk would hurt everyone on it).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)

__all__ = [
    "CONTROL_FILE",
    "HITS_FILE",
    "REAL_IO",
    "DiskSpace",
    "FaultShim",
    "FileIO",
    "fill_disk",
    "flip_bit",
    "make_io",
    "truncate",
    "zero_block",
]

Fsync = Callable[[int], None]

# Shim modes (BookieConfig.fault_shim, whose FAULT_SHIM_MODES lists them too).
OFF: Final = ""
ON: Final = "on"
POWER_CUT: Final = "power-cut"
# The control file a running bookie's shim reads (in the journal directory).
CONTROL_FILE: Final = "FAULTS.toml"
# What the shim has injected so far (written next to the control file at each hit).
HITS_FILE: Final = "FAULTS.hits"
# Room left to a bookie whose disk just filled up (``disk_full``), like the blocks ext4
# reserves for root: a checkpoint under way still gets its entry logs written.
DISK_FULL_RESERVE_BYTES: Final = 64 << 20
# Name of the ballast file fill_disk() creates.
BALLAST_FILE: Final = "BALLAST"


class DiskSpace(NamedTuple):
    total_bytes: int
    free_bytes: int


def _disk_space(path: str | Path) -> DiskSpace:
    st = os.statvfs(path)
    return DiskSpace(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


class FileIO(Protocol):
    """The file operations storage does through the layer (``os`` signatures)."""

    def open(self, path: str | Path, flags: int, mode: int = 0o777, /) -> int: ...

    def close(self, fd: int, /) -> None: ...

    def pwrite(self, fd: int, data: ReadableBuffer, offset: int, /) -> int: ...

    def pwritev(self, fd: int, buffers: Sequence[ReadableBuffer], offset: int, /) -> int: ...

    def pread(self, fd: int, length: int, offset: int, /) -> bytes: ...

    def ftruncate(self, fd: int, length: int, /) -> None: ...

    def fallocate(self, fd: int, offset: int, length: int, /) -> None: ...

    def disk_space(self, path: str | Path, /) -> DiskSpace: ...

    def wrap_fsync(self, fsync: Fsync, /) -> Fsync:
        """The fsync storage should call instead of ``fsync``."""
        ...


class _RealIO:
    """Real file operations: the ``os`` functions themselves (see the module docstring)."""

    open = staticmethod(os.open)
    close = staticmethod(os.close)
    pwrite = staticmethod(os.pwrite)
    pwritev = staticmethod(os.pwritev)
    pread = staticmethod(os.pread)
    ftruncate = staticmethod(os.ftruncate)
    fallocate = staticmethod(os.posix_fallocate)
    disk_space = staticmethod(_disk_space)

    def wrap_fsync(self, fsync: Fsync) -> Fsync:
        """The fsync storage should call: ``fsync`` itself here, the shim's wrapper in
        :class:`FaultShim`."""
        return fsync


REAL_IO: Final[FileIO] = _RealIO()


class _Pending:
    """Unsynced writes of one file (power-cut mode), oldest first."""

    __slots__ = ("size", "writes")

    def __init__(self, size: int) -> None:
        self.writes: list[tuple[int, bytes]] = []
        self.size = size  # the file's size as the process sees it


class FaultShim:
    """Test-only file layer with injectable faults (see the module docstring).

    ``roots`` are the storage directories; each is one simulated disk when
    ``disk_bytes_max`` is set. Thread-safe: the journal, flush, gc and read threads all
    go through it.
    """

    def __init__(self, mode: str, roots: Sequence[Path], *, disk_bytes_max: int = 0,
                 control_dir: Path | None = None) -> None:  # fmt: skip
        if mode not in (ON, POWER_CUT):
            raise ValueError(f"fault shim mode {mode!r} is not one of {ON!r}, {POWER_CUT!r}")
        self.mode = mode
        self._roots = [Path(r).resolve() for r in roots]
        self.disk_bytes_max = self._configured_disk_bytes_max = disk_bytes_max
        self.fsync_errno: int | None = None
        self.fsync_delay_s = 0.0
        self._control = None if control_dir is None else control_dir / CONTROL_FILE
        self._control_mtime_ns = 0  # 0: no control file
        self._lock = threading.Lock()
        self._keys: dict[int, tuple[int, int]] = {}  # fd -> (st_dev, st_ino)
        self._fd_roots: dict[int, Path | None] = {}
        self._pending: dict[tuple[int, int], _Pending] = {}
        # disk_full: each root's size limit, pinned when the disk filled up.
        self._full_limits: dict[Path, int] | None = None
        self._hits = {"fsync_errors": 0, "enospc_errors": 0}

    # -- steering (tests) --

    def fail_fsync(self, error: int | None = errno.EIO) -> None:
        """From now on every fsync fails with ``error`` (None: fsync works again)."""
        self.fsync_errno = error

    def cut_power(self) -> int:
        """Drop every unsynced write now (in-process power cut); return the bytes lost.
        Call it after the storage stopped (``abort()``), then start a new one."""
        with self._lock:
            lost = sum(len(d) for p in self._pending.values() for _o, d in p.writes)
            self._pending.clear()
        return lost

    def unsynced_bytes(self) -> int:
        with self._lock:
            return sum(len(d) for p in self._pending.values() for _o, d in p.writes)

    def _read_control(self) -> None:
        """Apply FAULTS.toml when it changed (a process bookie's steering)."""
        if self._control is None:
            return
        try:
            mtime = self._control.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        if mtime == self._control_mtime_ns:
            return
        try:
            settings = tomllib.loads(self._control.read_text()) if mtime else {}
        except (tomllib.TOMLDecodeError, FileNotFoundError) as exc:
            log.warning(
                "fault shim: %s unreadable (%s); keeping the settings", self._control, exc
            )  # half written, most likely: looked at again next time
            return
        self._control_mtime_ns = mtime
        name = str(settings.get("fsync_error", ""))
        self.fsync_errno = getattr(errno, name) if name else None
        # Without the key (or the file) the configured simulated disk size holds.
        self.disk_bytes_max = int(settings.get("disk_bytes_max", self._configured_disk_bytes_max))
        self.fsync_delay_s = int(settings.get("fsync_delay_ms", 0)) / 1000
        self.set_disk_full(bool(settings.get("disk_full", False)))
        log.warning(
            "fault shim: fsync_error=%s disk_bytes_max=%d disk_full=%s fsync_delay_ms=%d",
            name or "-", self.disk_bytes_max, self._full_limits is not None,
            self.fsync_delay_s * 1000,
        )  # fmt: skip

    def set_disk_full(self, full: bool) -> None:
        """The disk fills up now (see ``disk_full`` in the module docstring), or has
        room again. Caller holds the lock or no other thread runs yet."""
        if not full:
            self._full_limits = None
        elif self._full_limits is None:
            self._full_limits = {
                root: _tree_bytes(root) + DISK_FULL_RESERVE_BYTES for root in self._roots
            }

    def _hit(self, what: str) -> None:
        """Count an injected failure in HITS_FILE (caller holds the lock)."""
        self._hits[what] += 1
        if self._control is None:
            return
        hits = self._control.with_name(HITS_FILE)
        tmp = hits.with_name(HITS_FILE + ".tmp")
        tmp.write_text("".join(f"{k} = {v}\n" for k, v in self._hits.items()))
        tmp.replace(hits)

    def hits(self) -> dict[str, int]:
        """Failures injected so far: fsync_errors, enospc_errors."""
        with self._lock:
            return dict(self._hits)

    # -- file operations --

    def open(self, path: str | Path, flags: int, mode: int = 0o777, /) -> int:
        fd = os.open(path, flags, mode)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        resolved = Path(path).resolve()
        root = next((r for r in self._roots if resolved.is_relative_to(r)), None)
        with self._lock:
            self._keys[fd] = key
            self._fd_roots[fd] = root
            if flags & (os.O_EXCL | os.O_TRUNC):
                # A new or emptied file: writes pending for an unlinked file whose
                # inode was reused must never land in this one.
                self._pending.pop(key, None)
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._keys.pop(fd, None)
            self._fd_roots.pop(fd, None)
        os.close(fd)

    def _check_space(self, fd: int, new_end: int, current_end: int) -> None:
        """ENOSPC when growing this file to ``new_end`` overflows its simulated disk."""
        root = self._fd_roots.get(fd)
        if new_end <= current_end or root is None:
            return
        limits = [self.disk_bytes_max] if self.disk_bytes_max else []
        if self._full_limits is not None:
            limits.append(self._full_limits.get(root, 0))
        if limits and _tree_bytes(root) + new_end - current_end > min(limits):
            self._hit("enospc_errors")
            raise OSError(errno.ENOSPC, "No space left on device (fault shim)")

    def _size(self, fd: int) -> int:
        key = self._keys.get(fd)
        pending = None if key is None else self._pending.get(key)
        return pending.size if pending is not None else os.fstat(fd).st_size

    def pwrite(self, fd: int, data: ReadableBuffer, offset: int, /) -> int:
        data = bytes(data)
        with self._lock:
            self._check_space(fd, offset + len(data), self._size(fd))
            key = self._keys.get(fd)
            if self.mode != POWER_CUT or key is None:
                return os.pwrite(fd, data, offset)
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = _Pending(os.fstat(fd).st_size)
            pending.writes.append((offset, data))
            pending.size = max(pending.size, offset + len(data))
            return len(data)

    def pwritev(self, fd: int, buffers: Sequence[ReadableBuffer], offset: int, /) -> int:
        return self.pwrite(fd, b"".join(buffers), offset)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        data = os.pread(fd, length, offset)
        with self._lock:
            key = self._keys.get(fd)
            pending = None if key is None else self._pending.get(key)
            if pending is None:
                return data
            end = min(offset + length, pending.size)
            buf = bytearray(data) + bytes(max(0, end - offset - len(data)))
            for at, chunk in pending.writes:
                lo, hi = max(at, offset), min(at + len(chunk), end)
                if lo < hi:
                    buf[lo - offset : hi - offset] = chunk[lo - at : hi - at]
            return bytes(buf)

    def ftruncate(self, fd: int, length: int) -> None:
        with self._lock:
            key = self._keys.get(fd)
            pending = None if key is None else self._pending.get(key)
            if pending is not None:
                pending.writes = [
                    (at, chunk[: max(0, length - at)])
                    for at, chunk in pending.writes
                    if at < length
                ]
                pending.size = length
        os.ftruncate(fd, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        with self._lock:
            self._check_space(fd, offset + length, os.fstat(fd).st_size)
        os.posix_fallocate(fd, offset, length)

    def disk_space(self, path: str | Path) -> DiskSpace:
        with self._lock:
            self._read_control()
            if self._full_limits is not None:
                used = _tree_bytes(Path(path).resolve())
                return DiskSpace(max(1, used), 0)  # full: not a byte left to report
            if not self.disk_bytes_max:
                return _disk_space(path)
            used = _tree_bytes(Path(path).resolve())
            return DiskSpace(self.disk_bytes_max, max(0, self.disk_bytes_max - used))

    def wrap_fsync(self, fsync: Fsync) -> Fsync:
        def shim_fsync(fd: int) -> None:
            with self._lock:
                self._read_control()
                key = self._keys.get(fd)
                pending = None if key is None else self._pending.pop(key, None)
                if self.fsync_errno is not None:
                    # Linux drops the dirty pages of a failed writeback: so do we.
                    self._hit("fsync_errors")
                    raise OSError(self.fsync_errno, f"{os.strerror(self.fsync_errno)} (fault shim)")
                for at, chunk in pending.writes if pending is not None else ():
                    _pwrite_all(fd, chunk, at)
                delay_s = self.fsync_delay_s
            if delay_s:
                time.sleep(delay_s)  # the slow disk itself (outside the lock: only fsync)
            fsync(fd)

        return shim_fsync


def make_io(mode: str, roots: Sequence[Path], *, disk_bytes_max: int = 0,
            control_dir: Path | None = None) -> FileIO:  # fmt: skip
    """The file layer for ``BookieConfig.fault_shim``: :data:`REAL_IO` when off."""
    if mode == OFF and not disk_bytes_max:
        return REAL_IO
    log.warning("storage fault shim is ON (mode %r): test use only", mode or ON)
    return FaultShim(mode or ON, roots, disk_bytes_max=disk_bytes_max, control_dir=control_dir)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _tree_bytes(root: Path) -> int:
    """Apparent size of every file under ``root`` (a simulated disk's usage)."""
    total = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


# --- offline damage helpers (on a stopped bookie's files) ------------------------------


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Invert one bit of ``path`` at byte ``offset`` (fsynced)."""
    if not 0 <= bit <= 7:
        raise ValueError(f"bit {bit} is not 0..7")
    with path.open("r+b") as f:
        f.seek(offset)
        old = f.read(1)
        if len(old) != 1:
            raise ValueError(f"{path} has no byte at offset {offset}")
        f.seek(offset)
        f.write(bytes([old[0] ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())


def zero_block(path: Path, offset: int, length: int = 4096) -> None:
    """Overwrite ``length`` bytes at ``offset`` with zeros (a lost sector), within the
    file's current size (fsynced)."""
    with path.open("r+b") as f:
        size = os.fstat(f.fileno()).st_size
        length = max(0, min(length, size - offset))
        f.seek(offset)
        f.write(bytes(length))
        f.flush()
        os.fsync(f.fileno())


def truncate(path: Path, length: int) -> None:
    """Cut ``path`` to ``length`` bytes (fsynced)."""
    with path.open("r+b") as f:
        f.truncate(length)
        f.flush()
        os.fsync(f.fileno())


def fill_disk(directory: Path, nbytes: int) -> Path:
    """Put a sparse ballast file of ``nbytes`` apparent bytes into ``directory``: it
    costs no real space but counts fully against the shim's ``disk_bytes_max``. Remove
    the returned path to free the simulated space again."""
    path = directory / BALLAST_FILE
    with path.open("wb") as f:
        f.truncate(nbytes)
    return path
