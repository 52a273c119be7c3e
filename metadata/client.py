"""The metadata facade: one ZooKeeper session and every store built on it.

Build it from :class:`~foundation.config.MetadataConfig`; services hold one per process.
"""

from __future__ import annotations

import os

from foundation.config import MetadataConfig
from foundation.tls import zookeeper_tls
from metadata.bookies import BookieRegistry
from metadata.cluster import ClusterInfo, ClusterStore
from metadata.layout import Layout
from metadata.ledger_ids import BLOCK_SIZE_DEFAULT, LedgerIdAllocator
from metadata.ledgers import LedgerStore
from metadata.ownership import StreamLock
from metadata.proxies import ProxyRegistry
from metadata.segments import SegmentStore
from metadata.streams import StreamStore
from metadata.subscriptions import SubscriptionStore
from metadata.topics import TopicStore
from metadata.underreplicated import UnderreplicationStore
from metadata.zk import ZkClient

# Digest credentials for processes whose settings have no [metadata] section (bookies,
# autorecovery, the CLI name ZooKeeper by their own flags): the same file for all.
DIGEST_FILE_ENV = "BOOKLINE_METADATA_DIGEST_FILE"


class MetadataClient:
    """``async with MetadataClient(config) as md: await md.cluster.init() ...``"""

    def __init__(self, config: MetadataConfig, *, id_block_size: int = BLOCK_SIZE_DEFAULT) -> None:
        self.config = config
        self.layout = Layout(config.root)
        self.zk = ZkClient(
            config.zk,
            session_timeout_ms=config.session_timeout_ms,
            connect_timeout_ms=config.connect_timeout_ms,
            tls=zookeeper_tls(config.tls),
            digest_file=config.digest_file or os.environ.get(DIGEST_FILE_ENV, ""),
        )
        self.cluster = ClusterStore(self.zk, self.layout)
        self.bookies = BookieRegistry(self.zk, self.layout)
        self.ledger_ids = LedgerIdAllocator(self.zk, self.layout, id_block_size)
        self.ledgers = LedgerStore(self.zk, self.layout)
        self.underreplicated = UnderreplicationStore(self.zk, self.layout)
        self.streams = StreamStore(self.zk, self.layout)
        self.topics = TopicStore(self.zk, self.layout, self.streams)
        self.segments = SegmentStore(self.zk, self.layout)
        self.subscriptions = SubscriptionStore(self.zk, self.layout)
        self.proxies = ProxyRegistry(self.zk, self.layout)

    async def connect(self) -> None:
        await self.zk.connect()

    async def close(self) -> None:
        await self.zk.close()

    async def __aenter__(self) -> MetadataClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def init_cluster(self) -> ClusterInfo:
        return await self.cluster.init()

    def stream_lock(self, ns: str, stream: str, identity: str) -> StreamLock:
        return StreamLock(self.zk, self.layout, ns, stream, identity)
