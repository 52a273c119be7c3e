"""The bookie: Bookline's storage node.

Owns durability: a group-committed journal, a memtable (write cache), interleaved entry
logs with a RocksDB index, garbage collection and compaction, disk-health states, and
the TCP server speaking the sans-I/O wire protocol in :mod:`bookie.protocol`. It knows
nothing of streams; it stores opaque packaged entries per (ledger id, entry id).
"""
