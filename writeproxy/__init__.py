"""Write proxy: the HTTP front end of the write core (:mod:`serving.write`: stream
ownership, producer order, de-duplication, admission limits). It registers in
ZooKeeper, decodes write bodies into the core's batches and encodes its answers, and
hosts the topic and consumer group routes.

Modules: ``config`` (settings; builds the core's), ``faults`` (the test-only stall
middleware), ``metrics`` (Prometheus; what the core reports too), ``app`` (HTTP routes
and lifecycle), ``topics`` and ``groups`` (their routes), ``main`` (CLI).

A write goes straight down: ``app`` -> :mod:`serving.write.core` -> the owned stream
-> the core writer (:mod:`streams.writer`) -> ledgers -> bookies.
"""
