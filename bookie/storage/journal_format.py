"""Journal files and records: the codec, and reading a file back (pure: bytes in).

On-disk layout (all integers big-endian)::

    journal file  <file_id:016x>.journal
      header   24 bytes: magic b"BKLJ" | version u16 (2; 1 = legacy records) | flags u16 |
                         file_id u64 | reserved u32 | crc32c u32 (over the 20 bytes before)
      records  back to back, then preallocated zeros up to the allocated size

    record (version 2)                                  42 bytes + data
      hcrc      u32  crc32c of the rest of the header: length .. pcrc
      length    u32  bytes after this field (34 + data); 0 = end of data
      version   u8   2
      type      u8   ADD | MASTER_KEY | FENCE
      ledger_id u64
      entry_id  i64  (-1 unless ADD)
      lac       i64  (-1 unless ADD)
      group_off u32  bytes from the start of this record's group commit to the record
      pcrc      u32  crc32c of data
      data           payload (ADD), master key (MASTER_KEY), nothing (FENCE)

    record (version 1, read only)
      crc u32 (over length .. end) | length u32 | version u8 1 | type u8 | body
        ADD: ledger u64 | entry i64 | lac i64 | payload; MASTER_KEY: ledger u64 | key;
        FENCE: ledger u64

Two checksums, so a damaged payload does not make the header's ids untrustworthy: a
record whose header checks out but whose data does not is a *damaged entry* the bookie
can name (and have repaired); one whose header fails cannot be named. ``group_off``
tells which group commit a record belongs to: the journal writes the next group only
after the previous one's fsync returned, so a valid record of a *later* group after a
bad spot proves the bad spot was fsynced -- acknowledged data, not a torn tail.

Reading a file (:func:`scan`), a bad spot is

* a **torn tail** when no record of a later group follows it in this file (and the file
  is the last one): the partial last write, never acknowledged; replay stops there;
* a **damaged entry** when it is an ADD record with a sound header and a later group
  follows: replayed around (skipped by its length) and reported;
* **corruption** otherwise (ids unknown, acknowledged data after it): JournalCorruptError
  naming file and offset; the bookie stops instead of dropping acknowledged entries.

Damage inside the last group cannot be told from a torn write -- nothing on disk proves
that group's fsync returned -- so it is a torn tail, as in BookKeeper.

The mark (:class:`JournalMark`: where replay starts; everything before it is in entry
logs + index) has a file of its own, written by a checkpoint::

    mark file  journal.mark  (in the ledgers directory: it states what entry logs + index
               already hold; written to a temp file, fsynced, renamed, dir fsynced)
      magic b"BKLM" | version u16 | file_id u64 | offset u64 | crc32c u32 (over the rest)
"""

from __future__ import annotations

import mmap
import re
import struct
from typing import BinaryIO, NamedTuple

import crc32c

from foundation.errors import ChecksumError

FILE_MAGIC = b"BKLJ"
FILE_VERSION = 2
LEGACY_FILE_VERSION = 1
RECORD_VERSION = 2
LEGACY_RECORD_VERSION = 1

ADD = 1
MASTER_KEY = 2
FENCE = 3
_TYPES = (ADD, MASTER_KEY, FENCE)

_FILE_HEADER = struct.Struct(">4sHHQI")  # + crc u32
FILE_HEADER_BYTES = _FILE_HEADER.size + 4
_U32 = struct.Struct(">I")
# The header after hcrc: length, version, type, ledger, entry, lac, group_off, pcrc.
_TAIL = struct.Struct(">IBBQqqII")
HEADER_BYTES = 4 + _TAIL.size
_FIXED = _TAIL.size - 4  # what ``length`` counts besides the data
# Legacy (version 1) framing and bodies.
_PREFIX = struct.Struct(">II")  # crc, length
_BODY_LEDGER = struct.Struct(">Q")
_BODY_ADD = struct.Struct(">Qqq")
# Larger than any frame a bookie accepts; a bigger length can only be garbage.
RECORD_BYTES_MAX = 64 << 20
# A file image: read into memory (tests) or mapped (replay).
Image = bytes | memoryview | mmap.mmap
# Where a record could start: its version and type bytes (8 bytes after the start).
_CANDIDATE = re.compile(rb"[\x01\x02][\x01\x02\x03]")


class JournalRecord(NamedTuple):
    type: int
    ledger_id: int
    entry_id: int
    lac: int
    data: bytes  # payload (ADD), master key (MASTER_KEY), b"" (FENCE)


class JournalCorruptError(ChecksumError):
    """Acknowledged journal data is damaged in a way replay cannot work around."""


class JournalMark(NamedTuple):
    """A position in the journal: everything before it is covered by a checkpoint."""

    file_id: int
    offset: int


# --- codec --------------------------------------------------------------------------


def encode_file_header(file_id: int) -> bytes:
    head = _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0, file_id, 0)
    return head + crc32c.crc32c(head).to_bytes(4, "big")


def decode_file_header(data: bytes) -> int | None:
    """The file id, or None when the header is torn or not a journal header."""
    version = file_version(data)
    return None if version is None else int(_FILE_HEADER.unpack_from(data)[3])


def file_version(data: bytes) -> int | None:
    """The file's format version (1 or 2), None when the header is torn or foreign."""
    if len(data) < FILE_HEADER_BYTES:
        return None
    head = data[: _FILE_HEADER.size]
    if crc32c.crc32c(head) != int.from_bytes(data[_FILE_HEADER.size : FILE_HEADER_BYTES], "big"):
        return None
    magic, version, _flags, _file_id, _reserved = _FILE_HEADER.unpack(head)
    if magic != FILE_MAGIC or version not in (FILE_VERSION, LEGACY_FILE_VERSION):
        return None
    return int(version)


def encode_record(rec: JournalRecord) -> bytes:
    """One record as bytes, alone in its group (tests and slow paths)."""
    out = bytearray()
    encode_into(out, rec.type, rec.ledger_id, rec.entry_id, rec.lac, rec.data)
    return bytes(out)


def encode_into(  # noqa: PLR0917 - per-record hot path: positional, no kwargs cost
    out: bytearray, rtype: int, ledger_id: int, entry_id: int, lac: int, data: bytes
) -> None:
    """Append one record to ``out``, which holds its group commit from its first byte
    (so ``len(out)`` is the record's group offset). Two crc32c calls, as with one
    checksum over header and data."""
    if rtype != ADD:
        entry_id = lac = -1
        if rtype != MASTER_KEY:
            data = b""
    tail = _TAIL.pack(_FIXED + len(data), RECORD_VERSION, rtype, ledger_id, entry_id, lac,
                      len(out), crc32c.crc32c(data))  # fmt: skip
    out += _U32.pack(crc32c.crc32c(tail))
    out += tail
    out += data


def _decode_legacy_body(payload: bytes | memoryview) -> JournalRecord:
    """Decode a version 1 ``version | type | body`` (already checksummed)."""
    rtype, body = payload[1], payload[2:]
    if rtype == ADD:
        if len(body) < _BODY_ADD.size:
            raise ChecksumError("journal ADD record too short")
        ledger_id, entry_id, lac = _BODY_ADD.unpack_from(body)
        return JournalRecord(ADD, ledger_id, entry_id, lac, bytes(body[_BODY_ADD.size :]))
    if rtype in (MASTER_KEY, FENCE):
        if len(body) < _BODY_LEDGER.size:
            raise ChecksumError("journal record too short")
        (ledger_id,) = _BODY_LEDGER.unpack_from(body)
        data = bytes(body[_BODY_LEDGER.size :]) if rtype == MASTER_KEY else b""
        return JournalRecord(rtype, ledger_id, -1, -1, data)
    raise ChecksumError(f"journal record type {rtype} unknown")


# --- reading one record ---------------------------------------------------------------

GOOD, END, BAD = 1, 2, 3


class Step(NamedTuple):
    """What is at one offset: GOOD (``record``, ``end``, ``group_start``), END (zeros:
    the end of the data) or BAD; a BAD one with a sound header still has ``record``
    (data empty) and ``end``: a damaged entry, if it proves acknowledged."""

    kind: int
    record: JournalRecord | None = None
    end: int = 0
    group_start: int = 0
    reason: str = ""


def read_at(buf: Image, pos: int, size: int, legacy: bool = False) -> Step:
    """The record at ``pos`` of a file image ``buf`` (``size`` bytes)."""
    if legacy:
        return _read_legacy(buf, pos, size)
    head = bytes(buf[pos : pos + HEADER_BYTES])
    if len(head) < 8 or head[4:8] == b"\0\0\0\0":
        return Step(END) if not any(head[:8]) else Step(BAD, reason="length 0 after data")
    if len(head) < HEADER_BYTES:
        return Step(BAD, reason="record header cut short")
    if crc32c.crc32c(head[4:]) != _U32.unpack_from(head)[0]:
        return Step(BAD, reason="record header checksum mismatch")
    length, version, rtype, ledger_id, entry_id, lac, group_off, pcrc = _TAIL.unpack_from(head, 4)
    end = pos + 8 + length
    if version != RECORD_VERSION or rtype not in _TYPES or length < _FIXED:
        return Step(BAD, reason=f"record version {version} type {rtype} unknown")
    if length > RECORD_BYTES_MAX or end > size or group_off > pos:
        return Step(BAD, reason="record runs past the end of the file")
    data = bytes(buf[pos + HEADER_BYTES : end])
    if crc32c.crc32c(data) != pcrc:
        return Step(BAD, JournalRecord(rtype, ledger_id, entry_id, lac, b""), end,
                    pos - group_off, "record data checksum mismatch")  # fmt: skip
    return Step(GOOD, JournalRecord(rtype, ledger_id, entry_id, lac, data), end,
                pos - group_off)  # fmt: skip


def _read_legacy(buf: Image, pos: int, size: int) -> Step:
    """Version 1: one checksum, no group offsets (each record counts as its own group)."""
    prefix = bytes(buf[pos : pos + _PREFIX.size])
    if len(prefix) < _PREFIX.size:
        return Step(END) if not any(prefix) else Step(BAD, reason="record cut short")
    crc, length = _PREFIX.unpack(prefix)
    if length == 0:
        return Step(END) if crc == 0 else Step(BAD, reason="length 0 after data")
    end = pos + _PREFIX.size + length
    if length < 2 or length > RECORD_BYTES_MAX or end > size:
        return Step(BAD, reason="record length out of range")
    rest = bytes(buf[pos + _PREFIX.size : end])
    if crc32c.crc32c(rest, crc32c.crc32c(prefix[4:])) != crc:
        return Step(BAD, reason="record checksum mismatch")
    if rest[0] != LEGACY_RECORD_VERSION:
        return Step(BAD, reason=f"record version {rest[0]} in a version 1 file")
    try:
        return Step(GOOD, _decode_legacy_body(rest), end, pos)
    except ChecksumError as exc:
        return Step(BAD, reason=str(exc))


class ScanEnd(NamedTuple):
    end: int  # offset just past the last good record
    clean: bool  # True when the data ended at zeros/EOF, False on a torn or bad record


def iter_records(
    f: BinaryIO, offset: int, file_size: int, out: list[tuple[JournalRecord, int]]
) -> ScanEnd:
    """Read the records of a version 2 file from ``offset`` into ``out`` as (record,
    end offset), up to the first bad one (the plain reader; replay uses :func:`scan`)."""
    f.seek(0)
    buf = f.read(file_size)
    pos = offset
    while True:
        step = read_at(buf, pos, file_size)
        if step.kind != GOOD:
            return ScanEnd(pos, step.kind == END)
        assert step.record is not None  # GOOD always has one
        out.append((step.record, step.end))
        pos = step.end


# --- reading a file ---------------------------------------------------------------------


class DamagedRecord(NamedTuple):
    """An ADD record whose header checks out but whose payload does not, in acknowledged
    data: its entry is damaged on this bookie."""

    offset: int
    record: JournalRecord  # data empty
    reason: str


class FileScan(NamedTuple):
    records: list[tuple[JournalRecord, int]]  # (record, end offset), in file order
    damaged: list[DamagedRecord]
    end: int  # where the good data ends (a torn tail, if any, starts here)
    clean: bool  # the data ended at zeros/EOF, not at a torn record


def scan(buf: Image, start: int, size: int, *, name: str, last: bool,
         legacy: bool = False) -> FileScan:  # fmt: skip
    """Every record of a journal file image from ``start``, classifying bad spots as
    the module docstring says. ``last``: no later file exists (in an earlier one, every
    group was fsynced before the file was rolled). JournalCorruptError for corruption."""
    records: list[tuple[JournalRecord, int]] = []
    damaged: list[DamagedRecord] = []
    pos = start
    while True:
        step = read_at(buf, pos, size, legacy)
        if step.kind == GOOD:
            assert step.record is not None  # GOOD always has one
            records.append((step.record, step.end))
            pos = step.end
            continue
        resume = step.end if step.record is not None else pos + 1
        later = _later_group(buf, resume, size, pos, legacy)
        if later is None and (last or step.kind == END):
            return FileScan(records, damaged, pos, step.kind == END)
        if step.kind == BAD and step.record is not None and step.record.type == ADD:
            damaged.append(DamagedRecord(pos, step.record, step.reason))
            pos = step.end
            continue
        what = "zeros" if step.kind == END else f"a bad record ({step.reason})"
        after = (
            "the file was rolled after it, so it was fsynced"
            if later is None
            else f"records written after it was fsynced follow at offset {later}"
        )
        raise JournalCorruptError(
            f"journal {name} is corrupt at offset {pos}: {what}, and {after}; the "
            "damaged record's ledger/entry ids cannot be trusted, so the bookie stops "
            "instead of dropping acknowledged entries (restore the file, or wipe this "
            "bookie and let autorecovery re-replicate its ledgers)"
        )


def _later_group(buf: Image, after: int, size: int, bad_pos: int,
                 legacy: bool) -> int | None:  # fmt: skip
    """Offset of the first valid record at or after ``after`` whose group commit began
    after ``bad_pos`` (proof that ``bad_pos`` was fsynced), or None."""
    for match in _CANDIDATE.finditer(buf, after + 8):
        pos = match.start() - 8
        step = read_at(buf, pos, size, legacy)
        if step.kind == GOOD and step.group_start > bad_pos:
            return pos
    return None


# --- the mark -------------------------------------------------------------------------

_MARK = struct.Struct(">4sHQQ")
MARK_MAGIC = b"BKLM"
MARK_VERSION = 1


def encode_mark(mark: JournalMark) -> bytes:
    body = _MARK.pack(MARK_MAGIC, MARK_VERSION, mark.file_id, mark.offset)
    return body + crc32c.crc32c(body).to_bytes(4, "big")


def decode_mark(data: bytes) -> JournalMark:
    body = data[: _MARK.size]
    if len(data) != _MARK.size + 4 or crc32c.crc32c(body) != int.from_bytes(data[-4:], "big"):
        raise ChecksumError("journal mark file is torn or corrupt")
    magic, version, file_id, offset = _MARK.unpack(body)
    if magic != MARK_MAGIC or version != MARK_VERSION:
        raise ChecksumError(f"journal mark has magic {magic!r} version {version}")
    return JournalMark(file_id, offset)
