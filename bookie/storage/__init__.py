"""Bookie storage: journal -> memtable -> entry logs + RocksDB index.

The server sees only ``api`` (the ``Storage`` protocol); ``engine`` implements it by
starting and wiring one part per job. Modules:

* ``api`` -- the contract with the server; ``engine`` -- ``BookieStorage``: lifecycle,
  wiring, the facade.
* ``writes`` -- adds and fences checked and journaled, durable groups published;
  ``reads`` -- memtable, read cache, index + entry logs, read-ahead; ``lac`` -- LACs,
  explicit LACs, long polls; ``checkpoint`` -- memtable to entry logs + index, then the
  journal mark; ``compaction``; ``damage`` -- damaged-entry marks; ``disk`` -- disk
  usage and read-only state; ``replay`` -- the journal since the mark, at start.
* ``state`` -- the ledger table and counters the parts share; ``memtable``;
  ``cache`` -- the read cache; ``workers`` -- thread pools for blocking work.
* Journal: ``journal_format`` (records, files, mark: the pure codec), ``journal_files``
  (replay, tail truncation, mark file), ``journal`` (the group-commit writer).
* Entry logs: ``entrylog_format`` (the pure codec), ``entrylog`` (read handles, writer,
  scan); ``index`` -- the RocksDB index; ``files`` -- numbered file names.
* ``faults`` -- the file layer, and the test-only fault shim.
"""
