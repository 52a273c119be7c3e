"""A bounded LRU cache of entry payloads filled by read-ahead (event loop thread only)."""

from __future__ import annotations

from collections import OrderedDict

from .memtable import ENTRY_OVERHEAD_BYTES


class ReadCache:
    __slots__ = ("_bytes_max", "_items", "bytes")

    def __init__(self, bytes_max: int) -> None:
        self._bytes_max = bytes_max
        self._items: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self.bytes = 0

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        payload = self._items.get(key)
        if payload is not None:
            self._items.move_to_end(key)
        return payload

    def put(self, ledger_id: int, entry_id: int, payload: bytes) -> None:
        size = len(payload) + ENTRY_OVERHEAD_BYTES
        if size > self._bytes_max:
            return
        key = (ledger_id, entry_id)
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= len(old) + ENTRY_OVERHEAD_BYTES
        self._items[key] = payload
        self.bytes += size
        while self.bytes > self._bytes_max:
            _key, evicted = self._items.popitem(last=False)
            self.bytes -= len(evicted) + ENTRY_OVERHEAD_BYTES

    def drop_ledgers(self, ledger_ids: set[int]) -> None:
        for key in [k for k in self._items if k[0] in ledger_ids]:
            self.bytes -= len(self._items.pop(key)) + ENTRY_OVERHEAD_BYTES

    def __len__(self) -> int:
        return len(self._items)
