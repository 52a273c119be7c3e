"""The storage engine's read path: memtables, then the read cache, then the index and
the entry logs on the read threads, reading ahead the next entries of the same ledger
into the cache.

A damaged record costs only its own entry: it is marked damaged (damage.py) and
skipped, its neighbours are still served. A read whose entry compaction moved away
under it looks the entry up again.
"""

from __future__ import annotations

import logging
from typing import Final

from foundation.errors import ChecksumError, NoEntryError

from .api import LAST_ENTRY
from .cache import ReadCache
from .damage import DamageLog
from .entrylog import EntryLogFiles
from .entrylog_format import Location, decode_expected, group_runs, split_records
from .index import DAMAGE_READ, TOMBSTONE, Damage, Index
from .memtable import MemTables
from .state import Ledgers, StorageStats
from .workers import Worker

log = logging.getLogger(__name__)

# A read-ahead never pulls more than this many bytes into the cache at once.
READ_AHEAD_BYTES_MAX: Final = 4 << 20
# A read retries its index lookup this often when compaction moved the entry under it.
READ_ATTEMPTS: Final = 3

# (entry id, payload) of the entries a disk read found, in entry order.
Found = list[tuple[int, bytes]]
# (entry id, location, reason) of the records a disk read found damaged.
Bad = list[tuple[int, Location, str]]


class EntryReads:
    """Reads entries: from memory on the loop, from disk on ``worker``'s threads."""

    def __init__(self, ledgers: Ledgers, mem: MemTables, cache: ReadCache, *,
                 index: Index, files: EntryLogFiles, damage: DamageLog,
                 counters: StorageStats, worker: Worker,
                 read_ahead_entries: int) -> None:  # fmt: skip
        self._ledgers = ledgers
        self._mem = mem
        self.cache = cache
        self._index = index
        self._files = files
        self._damage = damage
        self._counters = counters
        self._worker = worker
        self._read_ahead_entries = read_ahead_entries

    def in_memory(self, ledger_id: int, entry_id: int) -> bytes | None:
        """A read served from the memtables or the read cache (counted), else None."""
        stats = self._counters
        payload = self._mem.get(ledger_id, entry_id)
        if payload is not None:
            stats.memtable_hits += 1
        else:
            payload = self.cache.get(ledger_id, entry_id)
            if payload is None:
                return None
            stats.read_cache_hits += 1
        stats.reads += 1
        stats.read_bytes += len(payload)
        return payload

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored payload; ``LAST_ENTRY`` reads the highest entry held."""
        st = self._ledgers.known(ledger_id)
        if entry_id == LAST_ENTRY:
            entry_id = st.last_entry
        if entry_id < 0:
            raise NoEntryError(f"ledger {ledger_id} has no entry {entry_id} here")
        payload = self.in_memory(ledger_id, entry_id)
        if payload is not None:
            return payload
        stats = self._counters
        stats.reads += 1
        stats.read_cache_misses += 1
        found, ahead = await self._worker.run(self._read_disk, ledger_id, entry_id)
        for ahead_id, ahead_payload in ahead:
            self.cache.put(ledger_id, ahead_id, ahead_payload)
        stats.read_ahead_entries += len(ahead)
        stats.read_bytes += len(found)
        return found

    async def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id held for a ledger (-1 if none): the memtables, then one
        backwards seek in the index -- never a listing of the ledger's entries."""
        self._ledgers.known(ledger_id)
        last = self._mem.last_entry_id(ledger_id)
        indexed = await self._worker.run(self._index.last_entry_id, ledger_id)
        return max(last, indexed)

    async def entries(self, ledger_id: int) -> list[int]:
        """Entry ids held for a ledger, sorted."""
        self._ledgers.known(ledger_id)
        ids = self._mem.entry_ids(ledger_id)
        ids.update(await self._worker.run(self._index.entry_ids, ledger_id))
        return sorted(ids)

    # -- read threads --

    def _read_disk(self, ledger_id: int, entry_id: int) -> tuple[bytes, Found]:
        """The entry plus read-ahead of the same ledger's next entries."""
        for attempt in range(READ_ATTEMPTS):
            loc = self._index.get(ledger_id, entry_id)
            if loc is None:
                raise NoEntryError(f"ledger {ledger_id} has no entry {entry_id} here")
            if loc == TOMBSTONE:
                raise ChecksumError(
                    f"entry {ledger_id}/{entry_id} is damaged on this bookie (awaiting repair)"
                )
            wanted = self._with_read_ahead(ledger_id, entry_id, loc)
            found, bad = self._read_runs(ledger_id, group_runs(wanted), dict(wanted))
            for bad_id, bad_loc, reason in bad:
                self._damage.record(
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

    def _with_read_ahead(
        self, ledger_id: int, entry_id: int, loc: Location
    ) -> list[tuple[int, Location]]:
        """The entry's location, then those of the next entries worth reading with it."""
        wanted = [(entry_id, loc)]
        ahead_bytes = 0
        for ahead_id, ahead_loc in self._index.scan(
            ledger_id, entry_id + 1, self._read_ahead_entries
        ):
            ahead_bytes += ahead_loc.length
            if ahead_bytes > READ_AHEAD_BYTES_MAX or ahead_loc == TOMBSTONE:
                break
            wanted.append((ahead_id, ahead_loc))
        return wanted

    def _read_runs(
        self, ledger_id: int, runs: list[tuple[Location, list[int]]], locs: dict[int, Location]
    ) -> tuple[Found, Bad]:
        """(entries of the runs, in order; bad records as (entry, location, reason)).

        Stops at a stale run (its log was compacted away: the caller looks up again). A
        run that fails to decode as a whole is decoded record by record, so one bad
        record does not take the rest of its run with it."""
        out: Found = []
        bad: Bad = []
        for run, ids in runs:
            data = self._files.read(run)
            if data is None:
                break
            if _run_intact(data, run, ledger_id, ids, out):
                continue
            for want in ids:
                loc = locs[want]
                start = loc.offset - run.offset
                try:
                    record = data[start : start + loc.length]
                    out.append((want, decode_expected(record, ledger_id, want)))
                except ChecksumError as exc:
                    bad.append((want, loc, str(exc)))
        return out, bad


def _run_intact(data: bytes, run: Location, ledger_id: int, ids: list[int], out: Found) -> bool:
    """Decode a whole run into ``out`` when every record in it is the one expected.
    A short read is a cut-off log (indexed logs never shrink): damage."""
    try:
        records = list(split_records(data)) if len(data) == run.length else []
        intact = len(records) == len(ids) and all(
            rec[0] == ledger_id and rec[1] == want for rec, want in zip(records, ids, strict=True)
        )
    except ChecksumError:
        return False
    if intact:
        out += [(rec_entry, payload) for _l, rec_entry, payload in records]
    return intact
