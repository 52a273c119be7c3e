"""Journal files on disk: names, replay of a directory, cutting a torn tail, the mark
file (formats and how a file image is read: journal_format.py). All blocking: the
engine calls them before the journal thread starts or on its flush thread.

Replay stops at a torn tail, and the engine cuts it off with :func:`truncate_tail`
before any new record is appended; damaged entries in acknowledged data are replayed
around and reported; other corruption raises JournalCorruptError.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from foundation.invariants import invariant

from .faults import REAL_IO, FileIO
from .files import list_numbered, numbered_name
from .journal_format import (
    FILE_HEADER_BYTES,
    LEGACY_FILE_VERSION,
    DamagedRecord,
    JournalCorruptError,
    JournalMark,
    JournalRecord,
    decode_file_header,
    decode_mark,
    encode_mark,
    file_version,
    scan,
)

FILE_SUFFIX = ".journal"

Fsync = Callable[[int], None]


def file_name(file_id: int) -> str:
    return numbered_name(file_id, FILE_SUFFIX)


def list_files(directory: Path) -> list[int]:
    return list_numbered(directory, FILE_SUFFIX)


def fsync_dir(directory: Path, fsync: Fsync) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class ReplayResult:
    records: list[tuple[JournalRecord, int]] = field(default_factory=list)
    # (file id, record) of damaged entries in acknowledged data, replayed around.
    damaged: list[tuple[int, DamagedRecord]] = field(default_factory=list)
    last_file_id: int = -1
    # Where the last file's good data ends; the engine truncates the tail there.
    tail_end: int = 0
    tail_clean: bool = True


def replay(directory: Path, mark: JournalMark) -> ReplayResult:
    """Every record at or after ``mark``, in order (blocking: run before the thread).

    Stops at a torn tail of the last file (reported, not raised); reports damaged
    entries it replayed around; raises JournalCorruptError (naming file and offset) for
    damage it cannot work around (see journal_format.py).
    """
    result = ReplayResult()
    ids = [i for i in list_files(directory) if i >= mark.file_id]
    for n, file_id in enumerate(ids):
        last = n == len(ids) - 1
        path = directory / file_name(file_id)
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(FILE_HEADER_BYTES)
            version = file_version(head)
            if version is None or decode_file_header(head) != file_id:
                if not last:
                    raise JournalCorruptError(f"journal {path} has a bad header")
                result.last_file_id, result.tail_end, result.tail_clean = file_id, 0, False
                break
            start = mark.offset if file_id == mark.file_id else FILE_HEADER_BYTES
            start = max(start, FILE_HEADER_BYTES)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
                found = scan(image, start, size, name=str(path), last=last,
                             legacy=version == LEGACY_FILE_VERSION)  # fmt: skip
        result.records += found.records
        result.damaged += [(file_id, d) for d in found.damaged]
        result.last_file_id, result.tail_end, result.tail_clean = file_id, found.end, found.clean
    return result


def truncate_tail(directory: Path, file_id: int, end: int, fsync: Fsync,
                  io: FileIO = REAL_IO) -> None:  # fmt: skip
    """Cut a journal file at ``end`` (deleting it when even its header is torn)."""
    path = directory / file_name(file_id)
    if end < FILE_HEADER_BYTES:
        path.unlink()
        fsync_dir(directory, fsync)
        return
    fd = io.open(path, os.O_RDWR)
    try:
        io.ftruncate(fd, end)
        fsync(fd)
    finally:
        io.close(fd)


MARK_FILE = "journal.mark"


def read_mark(directory: Path) -> JournalMark | None:
    try:
        data = (directory / MARK_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return decode_mark(data)


def write_mark(directory: Path, mark: JournalMark, fsync: Fsync,
               io: FileIO = REAL_IO) -> None:  # fmt: skip
    """Persist the mark atomically: temp file, fsync, rename, fsync the directory."""
    tmp = directory / (MARK_FILE + ".tmp")
    fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = encode_mark(mark)
        invariant(io.pwrite(fd, data, 0) == len(data), "short write of the journal mark")
        fsync(fd)
    finally:
        io.close(fd)
    os.replace(tmp, directory / MARK_FILE)
    fsync_dir(directory, fsync)
