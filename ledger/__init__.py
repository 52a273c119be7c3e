"""Replicated ledgers: the client that turns a set of bookies into one append-only,
single-writer ledger.

Will own ensemble placement, quorum writes with pipelining and in-order acknowledgement,
ensemble changes, fencing and recovery, speculative reads, long-poll tailing and
autorecovery (auditor + replication workers). Depends on :mod:`bookie.protocol` and
:mod:`metadata` only.
"""
