"""The bookie: Bookline's storage node.

Owns durability: a group-committed journal, a memtable (write cache), interleaved entry
logs with a RocksDB index, garbage collection and compaction, disk-health states, and
the TCP server speaking the sans-I/O wire protocol in :mod:`bookie.protocol`. It knows
nothing of streams; it stores opaque packaged entries per (ledger id, entry id).
Depends only on :mod:`foundation` and :mod:`metadata`. Modules:

* ``protocol/`` -- the wire protocol, sans I/O: ``frames`` (header, CRC, op codes),
  ``messages``, ``ops`` (the table of ops: each op's meta layout and checks),
  ``codec`` (encode/decode through the table), ``decoder`` (``feed`` / ``next_frame``).
* ``client`` -- the asyncio client: ``BookieConnection`` (pipelined requests),
  ``LedgerAdder`` (per-ledger add handle), ``BookieClientPool``; ``client_wire`` -- its
  transport side (answers matched by id, deadline sweep, batched writes), options.
* ``server`` -- ``BookieServer``: listen, drain, fail-stop, disk health, stats;
  ``server_connection`` -- one client's connection (task-free ADD and long polls);
  ``server_requests`` -- the handlers of requests that run as tasks.
* ``storage/`` -- the storage engine behind the server (see its package docstring).
* ``main`` -- the ``bookline bookie`` process (cookie, start, register, signals);
  ``registration`` -- staying registered in ZooKeeper; ``gc`` -- deleting ledgers gone
  from the metadata; ``metrics`` -- Prometheus; ``config`` -- ``[bookie]`` settings.
"""
