"""The read core: reads by position (DLSN, sequence id, txid, time), long-poll tails
and topic partitions by offset, with shared per-stream feeds (one core reader per hot
stream, a bounded cache of recent records) so many tailers of one stream cost one
bookie read per entry. Front-end neutral: no HTTP, no WebSocket; the read proxy
(:mod:`readproxy`) is its HTTP shell.

Modules: ``config`` (:class:`ReadConfig`, the settings the core uses), ``metrics``
(:class:`ReadMetrics`, what it reports), ``frames`` (records packed once; pages and
tail frames, sans-I/O), ``readers`` (private reader pool), ``feeds`` (shared feeds),
``pages`` (reads by position over both), ``follow`` (a tail's batches: the feed, and
catch-up behind its ring), ``partitions`` (a topic partition's pages by offset).
"""
