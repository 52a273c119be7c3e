"""Cluster metadata in ZooKeeper (kazoo), bridged into asyncio.

Owns the znode layout under a cluster root: cluster identity, the bookie registry and
cookies, ledger ids and ledger metadata, streams and their segments, stream ownership
locks, subscriptions. Every stored object is versioned msgpack; updates are
compare-and-set on znode versions; multi-step changes are single ZooKeeper transactions.
"""

from metadata.client import MetadataClient
from metadata.zk import SessionState, ZkClient

__all__ = ["MetadataClient", "SessionState", "ZkClient"]
