"""The memtable (write cache): acknowledged entries, readable until a checkpoint has
written them to an entry log and the index.

Entries are kept per ledger in a dict keyed by entry id (O(1) reads on the tail path,
ids may arrive out of order from a striped ensemble); a checkpoint sorts them by
(ledger, entry) once, when it flushes. At a checkpoint the engine swaps in a fresh table so adds
continue while the frozen one is flushed; the frozen one stays readable until the index
points at the entry logs. Event loop thread only (the flush thread only iterates a
frozen table, which nobody mutates any more).
"""

from __future__ import annotations

from collections.abc import Iterator

# Bookkeeping cost per entry (dict slot, int key, bytes header), counted against the
# memtable limits so many tiny entries cannot exceed them unnoticed.
ENTRY_OVERHEAD_BYTES = 64


class MemTable:
    __slots__ = ("_last", "_ledgers", "bytes", "entries")

    def __init__(self) -> None:
        self._ledgers: dict[int, dict[int, bytes]] = {}
        # Highest entry id per ledger, so "read the last entry" needs no scan.
        self._last: dict[int, int] = {}
        self.bytes = 0
        self.entries = 0

    def put(self, ledger_id: int, entry_id: int, payload: bytes) -> None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = {}
            self._last[ledger_id] = entry_id
        elif entry_id > self._last[ledger_id]:
            self._last[ledger_id] = entry_id
        old = entries.get(entry_id)
        if old is not None:  # a recovery add rewrote the entry
            self.bytes -= len(old) + ENTRY_OVERHEAD_BYTES
            self.entries -= 1
        entries[entry_id] = payload
        self.bytes += len(payload) + ENTRY_OVERHEAD_BYTES
        self.entries += 1

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._ledgers.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id held for the ledger, -1 if none."""
        return self._last.get(ledger_id, -1)

    def entry_ids(self, ledger_id: int) -> list[int]:
        entries = self._ledgers.get(ledger_id)
        return [] if entries is None else list(entries)

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    def drop_ledgers(self, ledger_ids: set[int]) -> None:
        for ledger_id in ledger_ids:
            entries = self._ledgers.pop(ledger_id, None)
            self._last.pop(ledger_id, None)
            if entries is not None:
                self.bytes -= sum(len(p) + ENTRY_OVERHEAD_BYTES for p in entries.values())
                self.entries -= len(entries)

    def __len__(self) -> int:
        return self.entries

    def sorted_runs(self) -> Iterator[tuple[int, list[int], list[bytes]]]:
        """(ledger, entry ids ascending, their payloads) per ledger, ledgers ascending:
        the flush's input, as lists so it never builds a tuple per entry."""
        for ledger_id in sorted(self._ledgers):
            entries = self._ledgers[ledger_id]
            entry_ids = sorted(entries)
            yield ledger_id, entry_ids, [entries[entry_id] for entry_id in entry_ids]


class MemTables:
    """The active memtable, the frozen ones a checkpoint is flushing (readable until the
    index points at their entries), and the bytes of adds still in the journal (counted
    against the memtable limit before they arrive)."""

    __slots__ = ("active", "frozen", "frozen_bytes", "reserved_bytes")

    def __init__(self) -> None:
        self.active = MemTable()
        self.frozen: list[MemTable] = []
        self.frozen_bytes = 0
        self.reserved_bytes = 0

    @property
    def used_bytes(self) -> int:
        """What counts against ``memtable_bytes_max``."""
        return self.active.bytes + self.frozen_bytes + self.reserved_bytes

    @property
    def entries(self) -> int:
        return len(self.active) + sum(len(t) for t in self.frozen)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        payload = self.active.get(ledger_id, entry_id)
        if payload is None:
            for table in self.frozen:
                payload = table.get(ledger_id, entry_id)
                if payload is not None:
                    break
        return payload

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id held in memory for the ledger, -1 if none."""
        last = self.active.last_entry_id(ledger_id)
        for table in self.frozen:
            last = max(last, table.last_entry_id(ledger_id))
        return last

    def entry_ids(self, ledger_id: int) -> set[int]:
        ids = set(self.active.entry_ids(ledger_id))
        for table in self.frozen:
            ids.update(table.entry_ids(ledger_id))
        return ids

    def freeze(self) -> MemTable:
        """Swap in a fresh active table; the old one is frozen until :meth:`release`."""
        frozen, self.active = self.active, MemTable()
        self.frozen.append(frozen)
        self.frozen_bytes += frozen.bytes
        return frozen

    def release(self, frozen: MemTable) -> None:
        """A frozen table's entries are indexed now: stop serving them from memory."""
        self.frozen.remove(frozen)
        self.frozen_bytes -= frozen.bytes
