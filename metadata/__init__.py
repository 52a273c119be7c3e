"""Cluster metadata in ZooKeeper (kazoo), bridged into asyncio.

Owns the znode layout under a cluster root: cluster identity, the bookie registry and
cookies, ledger ids and ledger metadata, streams and their segments, stream ownership
locks, subscriptions. Every stored object is versioned msgpack; updates are
compare-and-set on znode versions; multi-step changes are single ZooKeeper transactions.

* ``zk`` -- the asyncio ZooKeeper client (``zk_boundary``: session states and kazoo
  error translation; ``zk_watch``: re-arming watches); ``client`` -- one session and
  every store on it; ``layout`` -- every path; ``serde`` -- the versioned encoding.
* ``ledger_metadata`` -- the one ledger metadata model and its stored format (pure);
  ``ledgers`` -- its store; ``ledger_ids`` -- id allocation; ``underreplicated`` --
  autorecovery work items.
* ``cluster``, ``bookies``, ``proxies``, ``streams``, ``segments``, ``ownership``,
  ``subscriptions``, ``topics`` (a topic's record and its partition streams) -- the
  other stores.
"""

from metadata.client import MetadataClient
from metadata.zk import SessionState, ZkClient

__all__ = ["MetadataClient", "SessionState", "ZkClient"]
