"""Which proxies are Kafka brokers, and which one leads a partition.

Every write and read proxy with a Kafka listener registers it in its ZooKeeper
registration (``ProxyInfo.kafka``, ``ProxyInfo.node_id``), so the brokers a Metadata
answer lists are the live registrations that carry one. A partition's leader is the
write proxy owning its stream (the owner record); an unowned partition's is the write
proxy the thin client would pick for it (rendezvous hashing of the proxies' URLs), so
Kafka and HTTP producers of one partition meet at the same proxy, which acquires it on
the first write.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from httpapi.proxy_config import READ_PROXY_PREFIX
from thinclient.routing import rendezvous

if TYPE_CHECKING:
    from metadata.client import MetadataClient
    from metadata.proxies import ProxyInfo

__all__ = ["Broker", "BrokerView", "node_id_of", "split_host_port"]

# Node ids are int32 >= 0 (Kafka reserves negative ones).
_NODE_ID_MASK = 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class Broker:
    """One Kafka broker as clients see it: a stable node id and where to connect."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


def node_id_of(registration_id: str) -> int:
    """A stable int32 node id derived from a proxy's registration id (``wp-1``,
    ``read@rp-1``): the same across restarts, unlikely to collide in a cluster of a few
    dozen proxies; ``kafka_node_id`` in the proxy's settings overrides it."""
    digest = hashlib.blake2b(registration_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & _NODE_ID_MASK


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _broker(info: ProxyInfo) -> Broker:
    host, port = split_host_port(info.kafka)
    return Broker(info.node_id, host, port)


@dataclass(frozen=True, slots=True)
class BrokerView:
    """The brokers registered now, read once per request that needs them."""

    brokers: tuple[Broker, ...]
    # Registration id -> node id of every broker; write proxies' URLs for rendezvous.
    by_proxy: dict[str, int]
    write_urls: dict[str, int]
    # Read proxies' node ids: follower replicas for Fetch (KIP-392).
    readers: tuple[int, ...] = ()

    @classmethod
    async def load(cls, md: MetadataClient, me: ProxyInfo) -> BrokerView:
        """The live registrations with a Kafka listener (``me`` always among them: ours
        may not be written yet while the proxy starts)."""
        infos = await md.proxies.list()
        infos[me.proxy_id] = me
        with_kafka = sorted(
            (i for i in infos.values() if i.kafka and i.node_id >= 0), key=lambda i: i.node_id
        )
        return cls(
            brokers=tuple(_broker(i) for i in with_kafka),
            by_proxy={i.proxy_id: i.node_id for i in with_kafka},
            write_urls={
                i.address.rstrip("/"): i.node_id
                for i in with_kafka
                if not i.proxy_id.startswith(READ_PROXY_PREFIX)
            },
            readers=tuple(
                i.node_id for i in with_kafka if i.proxy_id.startswith(READ_PROXY_PREFIX)
            ),
        )

    def controller(self) -> int:
        """The broker admin requests go to: the first write proxy (any broker serves
        them; clients only need one named)."""
        ids = sorted(self.write_urls.values()) or [b.node_id for b in self.brokers]
        return ids[0] if ids else -1

    def follower(self, stream: str) -> int:
        """The read proxy a rack-aware consumer of ``stream`` is sent to (KIP-392's
        preferred read replica), the same for every fetch of it; -1 without one."""
        if not self.readers:
            return -1
        by_name = {f"node-{n}": n for n in self.readers}
        return by_name[rendezvous(stream, list(by_name))]

    def leader(self, owner_proxy: str | None, stream: str) -> int:
        """Node id of ``stream``'s leader: its owner's, else the rendezvous choice; -1
        when no write proxy has a listener (LEADER_NOT_AVAILABLE)."""
        if owner_proxy is not None and owner_proxy in self.by_proxy:
            return self.by_proxy[owner_proxy]
        if not self.write_urls:
            return -1
        return self.write_urls[rendezvous(stream, list(self.write_urls))]
