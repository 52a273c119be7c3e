"""Entry log files and records: the codec (pure: bytes in, bytes out).

On-disk layout (all integers big-endian)::

    entry log file  <log_id:016x>.log
      header   24 bytes: magic b"BKLE" | version u16 | flags u16 | log_id u64 |
                         reserved u32 | crc32c u32 (over the 20 bytes before it)
      records  back to back

    record
      crc32c    u32  over every byte after this field: length .. end of payload
      length    u32  bytes after this field (RECORD_HEADER_BYTES - 8 + payload)
      version   u8   RECORD_VERSION
      ledger_id u64
      entry_id  u64
      payload

The index maps (ledger, entry) to a :class:`Location` = (log id, record offset, record
length). A read validates length, checksum, version, ledger id and entry id before it
returns a payload (:func:`decode_expected`), so a stale location (a compacted, deleted
or reused file) can never yield the wrong entry.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import crc32c

from foundation.errors import ChecksumError
from foundation.invariants import invariant

FILE_MAGIC = b"BKLE"
FILE_VERSION = 1
RECORD_VERSION = 1

FILE_HEADER = struct.Struct(">4sHHQI")
FILE_HEADER_BYTES = FILE_HEADER.size + 4
RECORD_HEADER = struct.Struct(">IIBQQ")
RECORD_HEADER_BYTES = RECORD_HEADER.size
# The header after its crc field (length .. entry id), packed first by the writer's
# batch path so the crc can be computed over it and the payload without copying either.
RECORD_TAIL = struct.Struct(">IBQQ")
CRC = struct.Struct(">I")
# A length above this can only be garbage (bigger than any frame a bookie accepts).
RECORD_BYTES_MAX = 64 << 20


class Location(NamedTuple):
    log_id: int
    offset: int
    length: int


def encode_file_header(log_id: int) -> bytes:
    head = FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0, log_id, 0)
    return head + crc32c.crc32c(head).to_bytes(4, "big")


def encode_into(out: bytearray, ledger_id: int, entry_id: int, payload: bytes) -> int:
    """Append one record to ``out``; return its length."""
    invariant(entry_id >= 0, "entry id %d stored in an entry log", entry_id)
    length = RECORD_HEADER_BYTES - 8 + len(payload)
    head = RECORD_HEADER.pack(0, length, RECORD_VERSION, ledger_id, entry_id)
    crc = crc32c.crc32c(payload, crc32c.crc32c(memoryview(head)[4:]))
    start = len(out)
    out += head
    out += payload
    out[start : start + 4] = crc.to_bytes(4, "big")
    return length + 8


def decode_record(data: bytes | memoryview) -> tuple[int, int, bytes]:
    """(ledger, entry, payload) of one whole record; ChecksumError when it is bad."""
    if len(data) < RECORD_HEADER_BYTES:
        raise ChecksumError("entry log record shorter than its header")
    crc, length, version, ledger_id, entry_id = RECORD_HEADER.unpack_from(data)
    if length + 8 != len(data):
        raise ChecksumError("entry log record length mismatch")
    if crc32c.crc32c(memoryview(data)[4:]) != crc:
        raise ChecksumError("entry log record checksum mismatch")
    if version != RECORD_VERSION:
        raise ChecksumError(f"entry log record version {version} unknown")
    return ledger_id, entry_id, bytes(data[RECORD_HEADER_BYTES:])


def decode_expected(record: bytes | memoryview, ledger_id: int, entry_id: int) -> bytes:
    """The payload of one whole record that must hold ``ledger_id/entry_id``;
    ChecksumError when it is bad or holds another entry."""
    rec_ledger, rec_entry, payload = decode_record(record)
    if (rec_ledger, rec_entry) != (ledger_id, entry_id):
        raise ChecksumError(
            f"entry log record holds {rec_ledger}/{rec_entry}, not {ledger_id}/{entry_id}"
        )
    return payload


def split_records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Decode back-to-back whole records (a read-ahead run)."""
    pos = 0
    while pos < len(data):
        if pos + 8 > len(data):  # a damaged length left a cut-off header: no crash
            raise ChecksumError("entry log run ends inside a record header")
        (length,) = struct.unpack_from(">I", data, pos + 4)
        yield decode_record(memoryview(data)[pos : pos + 8 + length])
        pos += 8 + length


def group_runs(locs: Iterable[tuple[int, Location]]) -> list[tuple[Location, list[int]]]:
    """Merge locations that are adjacent in the same log into one read each.

    Input: (entry id, location) in entry order. Output: (run location, entry ids).
    """
    runs: list[tuple[Location, list[int]]] = []
    for entry_id, loc in locs:
        if runs:
            run, ids = runs[-1]
            if run.log_id == loc.log_id and run.offset + run.length == loc.offset:
                runs[-1] = (Location(run.log_id, run.offset, run.length + loc.length), ids)
                ids.append(entry_id)
                continue
        runs.append((loc, [entry_id]))
    return runs
