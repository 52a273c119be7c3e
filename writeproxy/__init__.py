"""Write proxy: an aiohttp service that owns streams (ZooKeeper owner record + the
stream's writer lock), batches concurrent client writes into record sets through the
core writer, de-duplicates retried writes by producer id and sequence number (also
across failover), and answers 429 when its per-stream or per-proxy limits are reached.

Modules: ``config`` (settings), ``limits`` (admission), ``dedup`` (producer table,
pure), ``owned`` (one owned stream's write path: producer order, retries, the append),
``ownership`` (acquiring and dropping streams), ``faults`` (the test-only stall
middleware), ``metrics``, ``app`` (HTTP routes), ``main`` (CLI).

A write goes straight down: ``app`` -> ``owned`` -> the core writer
(:mod:`streams.writer`) -> ledgers -> bookies.
"""
