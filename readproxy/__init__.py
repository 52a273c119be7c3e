"""Read proxy: a stateless aiohttp service serving reads by position (DLSN, sequence id,
txid, time), long-poll and WebSocket tails, with shared per-stream feeds (one core
reader per hot stream, a bounded cache of recent records) so many tailers of one
stream cost one bookie read per entry.

Modules: ``config``, ``metrics``, ``frames`` (records packed once; pages and tail
frames, sans-I/O), ``feeds`` (shared feeds), ``readers`` (private reader pool),
``pages`` (reads by position over both), ``tail`` (one WebSocket tail), ``topics``
(topic partitions by offset, for consumers), ``subscriptions`` (core subscriptions over
HTTP), ``app`` (HTTP routes and lifecycle), ``main`` (CLI).
"""
