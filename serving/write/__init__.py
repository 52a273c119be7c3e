"""The write core: owning streams (ZooKeeper owner record + the stream's writer lock),
writing batches into them in each producer's order, de-duplicating retried writes by
producer id, epoch and sequence number (also across failover), and admitting requests
within per-stream and per-process in-flight limits. No HTTP: a front end hands it a
:class:`~serving.write.batch.WriteBatch` and encodes what it answers.

Modules: ``config`` (the core's settings), ``metrics`` (what it reports), ``batch``
(the neutral write batch and its answer), ``limits`` (admission), ``dedup`` (producer
table, pure), ``owned`` (one owned stream's write path: producer order, retries, the
append), ``ownership`` (acquiring and dropping streams), ``core`` (one batch from
admission to answer); ``groups`` (the consumer group coordinators this process hosts:
each is the owner of its group's log stream) and ``topics`` (topic admin where stream
ownership matters).

A write goes straight down: front end -> ``core`` -> ``ownership`` -> ``owned`` -> the
core writer (:mod:`streams.writer`) -> ledgers -> bookies.
"""
