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
