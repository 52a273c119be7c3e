"""``bookline bench compare``: Bookline against its peers in one run, systems
alternating (:mod:`~ops.bench.compare.run`). One module per system driven --
:mod:`~ops.bench.compare.bookline` (core library and thin client),
:mod:`~ops.bench.compare.nats` (NATS JetStream), :mod:`~ops.bench.compare.redis` (Redis
Streams) -- over what the workloads share (:mod:`~ops.bench.compare.common`); PNG plots
in :mod:`~ops.bench.compare.plots`.
"""
