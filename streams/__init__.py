"""The core library: log streams on replicated ledgers (DistributedLog's core).

``Namespace`` opens writers (single writer per stream, fencing the previous one by
ledger recovery) and readers (by DLSN, txid, sequence id or time; catch-up then long-poll
tailing); records are batched into record sets, one per ledger entry; truncation and
retention drop whole segments; ``SyncNamespace`` is the blocking facade. Users import
the public names from :mod:`bookline`; this package imports ``ledger/``, ``metadata/``
and ``foundation/`` only.
"""
