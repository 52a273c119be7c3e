"""Replicated ledgers: the client that turns a set of bookies into one append-only,
single-writer ledger, and autorecovery.

Depends on :mod:`metadata` (the ledger metadata model and its ZooKeeper store) and on
:mod:`bookie` (its client and protocol) only where real bookies are wired in --
``adapters`` and ``autorecovery`` -- and for one limit the fakes mirror. Modules:

* ``client`` -- create / open (recover) / delete ledgers; builds the ``env``.
* ``env`` -- the environment every handle shares: store, transport, config, health,
  clock, randomness.
* ``interfaces`` -- what the client needs from its neighbours (store, bookie transport
  with per-ledger adders, replica inspector); ``adapters`` -- those on ZooKeeper and
  the bookie client; ``testing`` -- in-memory fakes with faults (test support only).
* ``writer`` -- the single writer: sends and answers; ``inflight`` (entries in flight,
  order, backpressure), ``add_retry`` (re-send instead of replace), ``writer_changes``
  (replacing failed bookies, at once or delayed), ``ensemble_change`` and ``close`` (its
  metadata CAS loops), ``lac_push`` (explicit LAC).
* ``reader`` -- verified speculative reads, LAC reads, long-poll tailing;
  ``speculative`` -- when to ask the next replica.
* ``recovery`` -- fence, find the end, close; ``tasks`` -- fan-out and task hygiene.
* ``digest`` -- the entry format; ``placement`` -- ensembles and bookie health;
  ``config`` -- ``[ledger]`` settings.
* Autorecovery: ``autorecovery`` (service, decommission, scrub), ``auditor``,
  ``replication`` (workers), ``scrub`` (replica check), ``fragments`` (pure repair
  arithmetic), ``autorecovery_config``.
"""
