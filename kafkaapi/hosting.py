"""The Kafka listener as a proxy process runs it (:func:`start_kafka`): bound from the
proxy's ``kafka_*`` settings, with a node id, and announced in the proxy's ZooKeeper
registration (:meth:`KafkaHost.registration`).

A write proxy serves Fetch too (Kafka's clients fetch from the leader unless told
otherwise), so it gets a read core of its own here: shared feeds and a reader pool
like the read proxy's, with the read core's default limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from foundation import tls
from foundation.auth import load_authority
from kafkaapi.brokers import node_id_of
from kafkaapi.context import KafkaServing
from kafkaapi.listener import KafkaListener, ListenerLimits
from metadata.proxies import ProxyInfo
from serving.read.config import ReadConfig
from serving.read.feeds import FeedRegistry
from serving.read.pages import Pages
from serving.read.readers import ReaderPool

if TYPE_CHECKING:
    from httpapi.proxy_config import ProxyConfig
    from serving.write.core import WriteCore
    from serving.write.groups import GroupHosting
    from serving.write.topics import TopicHosting
    from streams.namespace import Namespace

__all__ = ["KafkaHost", "UncountedReads", "start_kafka"]

# How often the write proxy's own idle private readers are closed.
_REAP_INTERVAL_S: Final = 2.0


class UncountedReads:
    """The read core's metrics where no one reports them (the write proxy's own read
    core, which serves Kafka fetches only)."""

    def count_core(self, source: str, *, records: int = 0, entries: int = 0) -> None:
        pass

    def count_served(self, path: str, name: str, records: int) -> None:
        pass

    def set_feeds(self, count: int) -> None:
        pass

    def set_cache_bytes(self, size: int) -> None:
        pass

    def set_private_readers(self, count: int) -> None:
        pass

    def add_subscribers(self, delta: int) -> None:
        pass


class KafkaHost:
    """A running listener and what it owns (a write proxy's read core)."""

    def __init__(self, listener: KafkaListener, address: str, own_pages: Pages | None) -> None:
        self.listener = listener
        self.address = address  # host:port announced
        self._own_pages = own_pages
        self._reap: asyncio.Task[None] | None = None
        if own_pages is not None:
            self._reap = asyncio.get_running_loop().create_task(self._reap_readers(own_pages))

    @property
    def node_id(self) -> int:
        return self.listener.serving.node_id

    def registration(self, proxy_id: str, url: str, load: float) -> ProxyInfo:
        """The proxy's registration, announcing this listener."""
        info = ProxyInfo(proxy_id, url, load, kafka=self.address, node_id=self.node_id)
        self.listener.serving.me = info
        return info

    @staticmethod
    async def _reap_readers(pages: Pages) -> None:
        while True:
            await asyncio.sleep(_REAP_INTERVAL_S)
            await pages.pool.reap()

    async def stop(self) -> None:
        await self.listener.stop()
        await self.listener.serving.classic.close()
        if self._reap is not None:
            self._reap.cancel()
        if self._own_pages is not None:
            await self._own_pages.feeds.close()
            await self._own_pages.pool.close()


async def start_kafka(
    config: ProxyConfig,
    registration_id: str,
    ns: Namespace,
    *,
    current_ns: Callable[[], Namespace],
    pages: Callable[[], Pages] | None = None,
    write: WriteCore | None = None,
    topics: TopicHosting | None = None,
    groups: GroupHosting | None = None,
) -> KafkaHost | None:
    """Bind the listener ``config`` asks for (None when ``kafka_enabled`` is off).
    ``pages`` is the proxy's read core (None: a write proxy, which gets its own)."""
    if not config.kafka_enabled:
        return None
    own_pages = None
    if pages is None:
        read = ReadConfig()
        metrics = UncountedReads()
        feeds = FeedRegistry(ns, read, metrics)
        feeds.start()
        own_pages = Pages(ns, feeds, ReaderPool(ns, read, metrics), read, metrics)
        pages = lambda: own_pages  # noqa: E731 - a getter of the one we made
    node_id = config.kafka_node_id
    serving = KafkaServing(
        registration_id=registration_id,
        node_id=node_id if node_id >= 0 else node_id_of(registration_id),
        ns=current_ns,
        pages=pages,
        write=write,
        authority=load_authority(config.auth()),
        topics=topics,
        groups=groups,
        cluster_id=f"bookline-{config.namespace}",
    )
    if groups is not None:  # a Bookline member may not join a group Kafka members use
        groups.foreign_members = serving.classic.live
        groups.foreign_view = serving.classic.view
    limits = ListenerLimits(
        connections_max=config.connections_max,
        unauthenticated_connections_max=config.unauthenticated_connections_max,
        unauthenticated_timeout_s=config.unauthenticated_timeout_s,
    )
    listener = KafkaListener(serving, limits)
    host = config.kafka_host or config.host
    # TLS from the process's [tls] settings, as its HTTP port (clients: SSL or SASL_SSL).
    port = await listener.start(host, config.kafka_port, ssl=tls.server_context())
    advertised = config.kafka_advertise_host or host
    return KafkaHost(listener, f"{advertised}:{port}", own_pages)
