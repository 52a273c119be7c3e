"""The RocksDB index: where each checkpointed entry lives, and per-ledger state.

Keys and values (rocksdict raw mode, all integers big-endian so keys sort by number)::

    b"E" | ledger_id u64 | entry_id u64  ->  log_id u64 | offset u64 | length u32
    b"S" | ledger_id u64                 ->  version u8 | flags u8 (bit 0: fenced) |
                                             lac i64 | last_entry i64 | master key
    b"G" | log_id u64                    ->  version u8 | total_bytes u64 | live_bytes u64
    b"D" | ledger_id u64 | entry_id u64  ->  version u8 | source u8 | file_id u64 |
                                             offset u64   (a damaged entry: where and
                                             how it was found, see :class:`Damage`)

A damaged entry's ``E`` row points at :data:`TOMBSTONE` (log 0, which is never
allocated): the entry stays known (listings, last entry) and every read of it fails with
ChecksumError, until a repair's checkpoint writes a new location and deletes the ``D``
row in the same batch.

``G`` rows are written in the same batch as the ``E`` rows that point into the log, so a
log file without a ``G`` row holds nothing indexed (a crash mid-flush) and is deleted at
start. Live bytes may be overestimated (an entry rewritten by recovery leaves its old
copy counted), which only makes compaction less eager, never wrong: compaction checks
every record against the ``E`` row before it copies it.

Every method blocks: the engine calls them on executor threads, never on the loop.
Mutations take one lock so compaction's compare-and-move cannot race a ledger delete.

Durable writes are a plain write followed by ``flush_wal(sync=True)`` (RocksDB's
``Write`` + ``SyncWAL``), not a write with ``sync=True``: rocksdict 0.3 holds the GIL for
the whole ``write`` call, WAL fsync included, which stalled the event loop for the length
of an fsync at every checkpoint; ``flush_wal`` releases it. The difference in RocksDB
(rows are readable a moment before they are durable) is harmless here: what they point at
is already fsynced, and nothing depends on their durability until the method returns.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from foundation.errors import ChecksumError, IOFailureError

from .entrylog import AppendedRun
from .entrylog_format import Location

_E = b"E"
_S = b"S"
_G = b"G"
_D = b"D"
_KEY_ENTRY = struct.Struct(">cQQ")
_KEY_ID = struct.Struct(">cQ")
_LOC = struct.Struct(">QQI")
_STATE = struct.Struct(">BBqq")
_STATS = struct.Struct(">BQQ")
STATE_VERSION = 1
STATS_VERSION = 1
_DAMAGE = struct.Struct(">BBQQ")
DAMAGE_VERSION = 1
# Where a damaged entry was found (Damage.source).
DAMAGE_READ = 1  # a read's checksum failed in an entry log
DAMAGE_COMPACTION = 2  # compaction found the record bad
DAMAGE_JOURNAL = 3  # journal replay found the ADD record's payload bad
DAMAGE_SOURCES = {DAMAGE_READ: "read", DAMAGE_COMPACTION: "compaction",
                  DAMAGE_JOURNAL: "journal replay"}  # fmt: skip
# The location of a damaged entry: log id 0 is never allocated (LogIds start at 1).
TOMBSTONE = Location(0, 0, 0)
_FENCED = 1
_U64_MAX = (1 << 64) - 1


class LedgerRecord(NamedTuple):
    """Persisted per-ledger state."""

    master_key: bytes
    fenced: bool
    lac: int
    last_entry: int


class Damage(NamedTuple):
    """Where a damaged entry was found: an entry log (file_id = log id) or a journal
    file (file_id = journal file id), and the record's offset in it."""

    source: int
    file_id: int
    offset: int


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    return _KEY_ENTRY.pack(_E, ledger_id, entry_id)


def encode_damage(d: Damage) -> bytes:
    return _DAMAGE.pack(DAMAGE_VERSION, d.source, d.file_id, d.offset)


def decode_damage(data: bytes) -> Damage:
    if len(data) != _DAMAGE.size or data[0] != DAMAGE_VERSION:
        raise ChecksumError("index damage row has an unknown version or size")
    _v, source, file_id, offset = _DAMAGE.unpack(data)
    return Damage(source, file_id, offset)


def encode_state(rec: LedgerRecord) -> bytes:
    flags = _FENCED if rec.fenced else 0
    return _STATE.pack(STATE_VERSION, flags, rec.lac, rec.last_entry) + rec.master_key


def decode_state(data: bytes) -> LedgerRecord:
    if len(data) < _STATE.size or data[0] != STATE_VERSION:
        raise ChecksumError("index ledger state has an unknown version or is too short")
    _v, flags, lac, last_entry = _STATE.unpack_from(data)
    return LedgerRecord(bytes(data[_STATE.size :]), bool(flags & _FENCED), lac, last_entry)


class Index:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._db: Rdict | None = None
        self._lock = threading.Lock()
        self._unsynced = WriteOptions()  # _write_durably syncs the WAL afterwards
        self._unsynced.sync = False
        # log id -> [total bytes, live bytes]; mirrors the G rows.
        self.log_stats: dict[int, list[int]] = {}
        # (ledger, entry) -> Damage; mirrors the D rows (read it with damaged_snapshot).
        self._damaged: dict[tuple[int, int], Damage] = {}

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise IOFailureError("index is not open")
        return self._db

    def open(self) -> dict[int, LedgerRecord]:
        """Open the database; return every ledger's state and load the log stats."""
        try:
            self._db = Rdict(str(self._path), Options(raw_mode=True))
        except Exception as exc:  # rocksdict raises bare Exception subclasses
            raise IOFailureError(f"cannot open index at {self._path}: {exc}") from exc
        states: dict[int, LedgerRecord] = {}
        for key, value in self._prefix_items(_S):
            states[_KEY_ID.unpack(key)[1]] = decode_state(value)
        for key, value in self._prefix_items(_G):
            if value[0] != STATS_VERSION:
                raise ChecksumError("index log stats have an unknown version")
            _v, total, live = _STATS.unpack(value)
            self.log_stats[_KEY_ID.unpack(key)[1]] = [total, live]
        for key, value in self._prefix_items(_D):
            _d, ledger_id, entry_id = _KEY_ENTRY.unpack(key)
            self._damaged[(ledger_id, entry_id)] = decode_damage(value)
        return states

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _prefix_items(
        self, prefix: bytes, start: bytes | None = None
    ) -> Iterable[tuple[bytes, bytes]]:
        for key, value in self.db.items(from_key=start or prefix):
            if not isinstance(key, bytes) or not key.startswith(prefix):
                return
            yield key, value

    # -- reads --

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        value = self.db.get(entry_key(ledger_id, entry_id))
        return None if value is None else Location(*_LOC.unpack(value))

    def scan(self, ledger_id: int, from_entry: int, limit: int) -> list[tuple[int, Location]]:
        """Up to ``limit`` (entry id, location) of a ledger from ``from_entry`` on."""
        out: list[tuple[int, Location]] = []
        if limit <= 0:
            return out
        prefix = _KEY_ID.pack(_E, ledger_id)
        for key, value in self._prefix_items(prefix, entry_key(ledger_id, from_entry)):
            out.append((_KEY_ENTRY.unpack(key)[2], Location(*_LOC.unpack(value))))
            if len(out) >= limit:
                break
        return out

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest indexed entry id of a ledger (-1 if none): one backwards seek."""
        it = self.db.iter()
        try:
            it.seek_for_prev(entry_key(ledger_id, _U64_MAX))
            if not it.valid():
                return -1
            key = it.key()
            if not isinstance(key, bytes) or not key.startswith(_KEY_ID.pack(_E, ledger_id)):
                return -1
            return int(_KEY_ENTRY.unpack(key)[2])
        finally:
            del it  # release the RocksDB iterator (and its snapshot) now

    def entry_ids(self, ledger_id: int) -> list[int]:
        prefix = _KEY_ID.pack(_E, ledger_id)
        return [_KEY_ENTRY.unpack(k)[2] for k, _ in self._prefix_items(prefix)]

    # -- writes --

    def _write_durably(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically and fsync the WAL (see the module docstring).

        A failure here means the index may not hold what callers are about to rely on,
        so it becomes IOFailureError, which the engine treats as fatal.
        """
        db = self.db
        try:
            db.write(batch, self._unsynced)
            db.flush_wal(True)
        except Exception as exc:  # rocksdict raises bare Exception subclasses
            raise IOFailureError(f"index write at {self._path} failed: {exc}") from exc

    def _add_stats(self, batch: WriteBatch, log_id: int, total: int, live: int) -> None:
        stats = self.log_stats.setdefault(log_id, [0, 0])
        stats[0] += total
        stats[1] += live
        batch.put(_KEY_ID.pack(_G, log_id), _STATS.pack(STATS_VERSION, stats[0], stats[1]))

    def write_checkpoint(
        self,
        runs: Sequence[AppendedRun],
        states: dict[int, LedgerRecord],
        written: dict[int, int],
        flushed: Callable[[int, int], bool] | None = None,
    ) -> list[tuple[int, int]]:
        """One synced batch: new entry locations, ledger states, log stats; and the
        damage marks of entries this flush wrote afresh (``flushed(ledger, entry)``
        says whether it did: a repair), which are returned.

        Builds a row per flushed entry with the GIL held, so the loop binds everything
        to locals and works on the runs' int lists directly.
        """
        batch = WriteBatch(raw_mode=True)
        put, pack_key, pack_loc = batch.put, _KEY_ENTRY.pack, _LOC.pack
        live: dict[int, int] = {}
        for run in runs:
            ledger_id, log_id = run.ledger_id, run.log_id
            for entry_id, offset, length in zip(
                run.entry_ids, run.offsets, run.lengths, strict=True
            ):
                put(pack_key(_E, ledger_id, entry_id), pack_loc(log_id, offset, length))
            live[log_id] = live.get(log_id, 0) + sum(run.lengths)
        for ledger_id, rec in states.items():
            batch.put(_KEY_ID.pack(_S, ledger_id), encode_state(rec))
        with self._lock:
            for log_id, total in written.items():
                self._add_stats(batch, log_id, total, live.get(log_id, 0))
            repaired = [] if flushed is None else [k for k in self._damaged if flushed(*k)]
            for ledger_id, entry_id in repaired:
                batch.delete(_KEY_ENTRY.pack(_D, ledger_id, entry_id))
            self._write_durably(batch)
            for key in repaired:
                del self._damaged[key]
        return repaired

    def mark_damaged(self, ledger_id: int, entry_id: int, found_at: Location | None,
                     damage: Damage) -> bool:  # fmt: skip
        """Record a damaged entry: its ``E`` row becomes :data:`TOMBSTONE`, a ``D`` row
        says where it was found. ``found_at`` is the bad copy's location: nothing is
        marked when the index no longer points there (compaction moved it, a repair or
        a delete came first). ``None`` (journal replay: not in an entry log) marks only
        an entry the index holds no intact copy of. Returns True when newly marked."""
        key = entry_key(ledger_id, entry_id)
        with self._lock:
            value = self.db.get(key)
            current = None if value is None else Location(*_LOC.unpack(value))
            if found_at is not None and current != found_at:
                return False
            if found_at is None and current is not None and current != TOMBSTONE:
                return False  # an older intact copy is indexed: nothing is lost here
            if current == TOMBSTONE and (ledger_id, entry_id) in self._damaged:
                return False
            batch = WriteBatch(raw_mode=True)
            batch.put(key, _LOC.pack(*TOMBSTONE))
            batch.put(_KEY_ENTRY.pack(_D, ledger_id, entry_id), encode_damage(damage))
            if current is not None and current.log_id in self.log_stats:
                live = self.log_stats[current.log_id][1]
                self._add_stats(batch, current.log_id, 0, -min(current.length, live))
            self._write_durably(batch)
            self._damaged[(ledger_id, entry_id)] = damage
        return True

    def damaged_snapshot(self) -> dict[tuple[int, int], Damage]:
        with self._lock:
            return dict(self._damaged)

    def damaged_count(self) -> int:
        return len(self._damaged)  # one atomic len() of a dict: no lock needed

    def relocate(
        self,
        moves: list[tuple[int, int, Location, Location]],
        written: dict[int, int],
        dead_log: int | None,
    ) -> int:
        """Point entries at their compacted copies when the index still points at the
        old copy (a delete or a rewrite in between wins); drop ``dead_log``'s stats
        (None: keep them, the caller checks the log is empty first). Returns the number
        of entries moved."""
        batch = WriteBatch(raw_mode=True)
        live: dict[int, int] = {}
        moved = 0
        with self._lock:
            for ledger_id, entry_id, old, new in moves:
                key = entry_key(ledger_id, entry_id)
                value = self.db.get(key)
                if value is None or Location(*_LOC.unpack(value)) != old:
                    continue
                batch.put(key, _LOC.pack(*new))
                live[new.log_id] = live.get(new.log_id, 0) + new.length
                moved += 1
            for log_id, total in written.items():
                self._add_stats(batch, log_id, total, live.get(log_id, 0))
            if dead_log is not None:
                batch.delete(_KEY_ID.pack(_G, dead_log))
            self._write_durably(batch)
            if dead_log is not None:
                self.log_stats.pop(dead_log, None)
        return moved

    def rows_in_log(self, log_id: int) -> list[tuple[int, int, Location]]:
        """Every entry whose row points into ``log_id``: a walk over the whole index,
        for compaction of a log whose file cannot be trusted to list them."""
        out = []
        unpack_key, unpack_loc = _KEY_ENTRY.unpack, _LOC.unpack
        for key, value in self._prefix_items(_E):
            loc = Location(*unpack_loc(value))
            if loc.log_id == log_id:
                _e, ledger_id, entry_id = unpack_key(key)
                out.append((ledger_id, entry_id, loc))
        return out

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Drop the entries and state of ledgers; account the dead bytes per log."""
        batch = WriteBatch(raw_mode=True)
        dead: dict[int, int] = {}
        dropped: list[tuple[int, int]] = []  # damage marks of the deleted ledgers
        with self._lock:
            for ledger_id in ledger_ids:
                prefix = _KEY_ID.pack(_E, ledger_id)
                for _key, value in self._prefix_items(prefix):
                    loc = Location(*_LOC.unpack(value))
                    dead[loc.log_id] = dead.get(loc.log_id, 0) + loc.length
                end = _KEY_ID.pack(_E, ledger_id + 1) if ledger_id < _U64_MAX else _S
                batch.delete_range(entry_key(ledger_id, 0), end)
                batch.delete(_KEY_ID.pack(_S, ledger_id))
                dropped += [k for k in self._damaged if k[0] == ledger_id]
            for lid, eid in dropped:
                batch.delete(_KEY_ENTRY.pack(_D, lid, eid))
            for log_id, nbytes in dead.items():
                if log_id in self.log_stats:
                    live = self.log_stats[log_id][1]
                    self._add_stats(batch, log_id, 0, -min(nbytes, live))
            self._write_durably(batch)
            for key in dropped:
                del self._damaged[key]

    def drop_log_stats(self, log_id: int) -> None:
        with self._lock:
            batch = WriteBatch(raw_mode=True)
            batch.delete(_KEY_ID.pack(_G, log_id))
            self._write_durably(batch)
            self.log_stats.pop(log_id, None)

    def stats_snapshot(self) -> dict[int, tuple[int, int]]:
        with self._lock:
            return {k: (v[0], v[1]) for k, v in self.log_stats.items()}
