"""Read proxy: a stateless aiohttp service serving reads by position (DLSN, sequence id,
txid, time), long-poll and WebSocket tails. The reads themselves -- shared per-stream
feeds, the private reader pool, pages, tails' batches -- are the read core's
(:mod:`serving.read`); this package is its HTTP shell.

Modules: ``config`` (builds the core's), ``metrics`` (implements the core's), ``tail``
(one WebSocket tail), ``topics`` (topic partitions by offset, for consumers),
``subscriptions`` (core subscriptions over HTTP), ``cluster`` + ``cluster_state`` +
``dashboard`` (the dashboard), ``app`` (HTTP routes and lifecycle), ``main`` (CLI).
"""
